"""Prompt lookup: the bottom tier's proposals mixed with tokens copied from the sequence itself.

Small models repeat themselves (SmolLM2's greedy continuation of 8K tokens of Genesis settles into a loop
of about 35 tokens), and answers about a document quote it. Our 4-layer drafts barely copy: on that loop
they agreed with the target's next token 3% (Austen draft) and 31% (mix draft) of the time. So, as
prompt lookup decoding (Saxena 2023), vLLM's ngram speculator and llama.cpp's lookup decoding do, the
token that followed the latest earlier occurrence of the sequence's last n tokens is a candidate c, and
the bottom tier proposes from the mixture

    q'(x) = (1 - w) q(x) + w [x = c],

q being the tier's own distribution (after temperature, top-k, top-p). The weight w is fitted to the
latest RECENT final positions (the prompt's, then those committed in earlier rounds) that had a candidate
and say something about it: the w that makes the tokens committed there most likely under the mixtures,
with a Beta(2, 2) prior (`fitted_weight`). Where the copy was the committed token c, the mixture gave it
(1 - w) q(c) + w; where another token x was, (1 - w) q(x), which falls with w whatever q(x) is. So the
fit needs only q(c), kept as the tier proposes (`chose`, on the path that became final): a tier that gave
the copy most of its own mass already owes little to it, and every copy that missed pulls w down. Before
any tier has proposed (the prompt) q(c) is unknown and taken as 0: the copy's hit or miss alone counts,
so that a prompt that loops starts with w high, and so are those of rounds in which no tier proposed
(mode auto running `ar`). In a round a tier proposed in, a position it proposed nothing for on the path
that became final (a check's bonus token, a rejected path's) says nothing: counted as the copy's alone,
such positions held w at 0.27-0.34 for the retrieval tier at 0.6 and cost it acceptance (docs/draft.md,
Prompt lookup). Where q is one-hot (greedy) the tokens it gave no mass say nothing (a position
where both the copy and the tier's choice missed: the mixture there is no model of the committed token),
and the fit is the count w = (copy won + 1) / (settled + 2) over the positions where exactly one of the
two was right. So on a loop that a weak draft misses w nears 1 within a few rounds; a tier that already
agrees with its checker (the retrieval tier at greedy, a draft on easy text) is right where the copy is
wrong and w falls, where counting the copy's hits alone kept it high: on 4K of *Emma* at greedy, `retrieval`
mode's proposals were accepted 0.74 of the time with the copies mixed in at w 0.82, and 0.875 without
them (the copies were right 0.82 of the time, the tier more often). Sampled, a copy that the target
passes over (its misses: both-wrong points that the count ignored) lowers w, where the count, fitted to
argmax choices, kept it near the greedy one. On prose whose n-grams rarely recur as they did, w stays low
and q' is nearly q.

Why it stays exact: q' at a position depends only on what came before it (the candidate on the sequence
so far, w on tokens already committed and on the tier's rows at them, made in earlier rounds), so it is a proposer's distribution like any other, and the
checker verifies the proposal against q' (min(1, p/q'), the residual max(p - q', 0)). Greedy proposes
q''s argmax; there q is one-hot, so that is c when w > 1/2, else q's own argmax. A tree's node draws its
children from q' for its own path (coordinator/trees.py); a greedy one ranks them by q's logits with c
among them (`greedy_order`). No candidate is mixed in where the request bans it (allowed_token_ids,
structured output, bad words, min_tokens: it could only be rejected); a reduced-vocabulary draft's own
-inf for the tokens it lacks is no ban, as copies are how it proposes them (coordinator/request_rows.py `bans`).

Measured (docs/draft.md, Prompt lookup): counted over the whole prompt, w stayed at the prompt's share (0.38 on
Emma, 0.50 on Genesis) and greedy never copied; over the latest 32 it reached 0.85-0.97 and lifted
`triforce` on both texts and at both temperatures.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from itertools import islice

import torch

from .sampling import row_argmax

RECENT = 32  # candidates the weight counts: the latest, so that a loop that starts late lifts it soon
OFFERS_KEPT = 1024  # final positions whose candidate and weight are remembered (`offered`)


class ContextLookup:
    """One sequence's n-gram index of its final tokens, and the candidates and weight it gives."""

    def __init__(self, n: int):
        if n < 1:
            raise ValueError("a lookup needs n >= 1 tokens to match")
        self.n = n
        self.after: dict[tuple[int, ...], int] = {}  # n-gram -> position of the token after its latest occurrence
        self.final = 0  # seq[:final] is indexed (committed, never rewritten)
        self.candidates = 0  # final positions that had a candidate
        self.right = 0  # ... where it was the committed token
        # the latest settled candidates: the tier's probability of a copy that was right (None: it missed)
        self.recent: deque[float | None] = deque(maxlen=RECENT)
        self._weight = 0.5
        self.proposed = False  # whether a tier proposed (`chose`) since the last `advance`: a position of those
        # rounds it proposed nothing for says nothing
        self.choices: dict[int, list[tuple[int, tuple[int, ...], Choice]]] = {}  # `chose`: position -> (from, path, what)s
        self.offers: dict[int, tuple[int, float]] = {}  # latest final positions: (their candidate, weight then)

    @property
    def weight(self) -> float:
        return self._weight

    def chose(self, seq: list[int], path: list[int] | tuple[int, ...], row: torch.Tensor, copy: int | None) -> None:
        """The proposing tier's `row` [V] (its distribution, before the mixture) for the token after seq, then
        path, and the copy mixed into it there (None: none): what the tier chose and the mass it gave the
        copy are kept until that position is final, where `advance` weighs them against the candidate if
        the sequence then runs through seq[final:] + path (a row after a rejected token, or a tree's
        sibling, says nothing about the final path)."""
        self.proposed = True
        choice = int(row_argmax(row))
        probs = row[[choice] if copy is None else [choice, copy]].tolist()  # (one read from a GPU)
        made = Choice(choice, probs[0] == 1, copy, 0.0 if copy is None else probs[1])
        self.choices.setdefault(len(seq) + len(path), []).append((self.final, tuple(seq[self.final:]) + tuple(path), made))

    def _choice(self, seq: list[int], j: int) -> Choice | None:
        """The tier's latest recorded row for seq[j] on the final path, if any."""
        for start, path, made in reversed(self.choices.get(j, ())):
            if tuple(seq[start:j]) == path:
                return made
        return None

    def advance(self, seq: list[int], final: int) -> None:
        """seq[:final] is final: weighs the candidate each newly final position had against the tier's row
        there (module docstring), indexes it, and fits the weight the next proposals mix with."""
        for j in range(max(self.final, self.n), final):
            key = tuple(seq[j - self.n:j])
            before = self.after.get(key)
            if before is not None:
                made = self._choice(seq, j)
                # the copy mixed in there where one was: the index then lacked the tokens this advance adds
                copy = seq[before] if made is None or made.copy is None else made.copy
                self.offers[j] = (copy, self.weight)
                self.candidates += 1
                self.right += copy == seq[j]
                point = evidence(made, seq[before], seq[j], self.proposed)
                if point is not SAYS_NOTHING:
                    self.recent.append(point)
            self.after[key] = j
        if final > self.final:
            self._weight = fitted_weight(self.recent)
        self.final, self.proposed = max(self.final, final), False
        self.choices = {j: made for j, made in self.choices.items() if j >= self.final}
        if len(self.offers) > 2 * OFFERS_KEPT:  # positions come in order: the first are the oldest
            self.offers = dict(islice(self.offers.items(), len(self.offers) - OFFERS_KEPT, None))

    def offered(self, position: int, probs: torch.Tensor) -> torch.Tensor:
        """`probs` [V], a bottom tier's distribution for the final token at `position`, mixed as the lookup
        would have mixed it there (its candidate then, at the weight it had then; unchanged where it had
        none or that position is no longer remembered): what an idle proposer would have offered."""
        offer = self.offers.get(position)
        return probs if offer is None else mixed_with(probs, *offer)

    def candidate(self, seq: list[int], path: list[int] | tuple[int, ...] = ()) -> int | None:
        """The token that followed the latest final occurrence of the last n tokens of seq + path, if any
        (path: a tree node's tokens below the end of seq, so that seq itself is not copied)."""
        if len(seq) + len(path) < self.n:
            return None
        from_seq = self.n - len(path)  # how many of the n tokens come from seq
        key = tuple(seq[len(seq) - from_seq:]) + tuple(path) if from_seq > 0 else tuple(path[-self.n:])
        after = self.after.get(key)
        return None if after is None else seq[after]

    def greedy_order(self, ranked: list[int], token: int | None) -> list[int]:
        """A greedy proposer's children: its own `ranked` tokens (best first) with the candidate `token`
        among them, first where the mixture's argmax is the copy (w > 1/2, what a chain proposes), else
        second; as many as `ranked`."""
        if token is None or not ranked:
            return ranked
        first = token if self.weight > 0.5 else ranked[0]
        return list(dict.fromkeys([first, token] + ranked))[: len(ranked)]

    def mix(self, probs: torch.Tensor, token: int | None) -> torch.Tensor:
        """`probs` [V] mixed with the candidate `token` (None: unchanged)."""
        return probs if token is None else mixed_with(probs, token, self.weight)

    def to_dict(self) -> dict:
        return {"n": self.n, "candidates": self.candidates, "right": self.right, "weight": round(self.weight, 4)}


@dataclass(frozen=True)
class Choice:
    """What the proposing tier's row at a position held (`ContextLookup.chose`)."""
    token: int  # its argmax
    one_hot: bool  # whether it gave the argmax all its mass (greedy)
    copy: int | None  # the copy mixed into it (None: none there, or banned)
    copy_prob: float  # the row's probability of that copy


SAYS_NOTHING = object()


def evidence(made: Choice | None, candidate: int, token: int, proposed: bool):
    """What a final position whose lookup candidate was `candidate` and whose committed token is `token` says
    of the weight, given the tier's row there (`made`; None: none on the final path, where `proposed` says
    whether the tier had proposed yet): the tier's probability of the copy where the copy was right, None
    where it missed, SAYS_NOTHING where the mixture is no model of the token (module docstring)."""
    if made is None:
        return SAYS_NOTHING if proposed else 0.0 if candidate == token else None
    if made.copy is None:  # no copy was mixed in there (banned, or not indexed yet): greedy, the tier's
        if not made.one_hot:  # choice against the candidate; sampled, its row's mass on it is unknown
            return SAYS_NOTHING
        made = Choice(made.token, True, candidate, float(made.token == candidate))
    if made.copy == token:
        return made.copy_prob if made.copy_prob < 1 else SAYS_NOTHING
    return SAYS_NOTHING if made.one_hot and made.token != token else None


def fitted_weight(points) -> float:
    """The w in (0, 1) of highest posterior density under a Beta(2, 2) prior, where a point q (the tier's
    probability of a copy that was right) has likelihood (1 - w) q + w and a point None (a copy that
    missed) 1 - w. Where every q is 0 (one-hot rows, or none known) that is the count (right + 1) /
    (points + 2); otherwise the log-density is concave and its slope falls from +inf to -inf, found by
    bisection."""
    points = list(points)
    missed = sum(q is None for q in points)
    right = [q for q in points if q is not None]
    if not any(right):
        return (len(right) + 1) / (len(points) + 2)
    lo, hi = 0.0, 1.0
    for _ in range(48):
        w = (lo + hi) / 2
        slope = 1 / w - (1 + missed) / (1 - w) + sum((1 - q) / ((1 - w) * q + w) for q in right)
        lo, hi = (w, hi) if slope > 0 else (lo, w)
    return (lo + hi) / 2


def mixed_with(probs: torch.Tensor, token: int, weight: float) -> torch.Tensor:
    """The mixture (1 - weight) probs + weight [x = token] of the module docstring."""
    mixed = probs * (1 - weight)
    mixed[token] += weight
    return mixed
