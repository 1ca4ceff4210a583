"""Prompt lookup: the bottom tier's proposals mixed with tokens copied from the sequence itself.

Small models repeat themselves (SmolLM2's greedy continuation of 8K tokens of Genesis settles into a loop
of about 35 tokens), and answers about a document quote it. Our 4-layer drafts barely copy: on that loop
they agreed with the target's next token 3% (Austen draft) and 31% (mix draft) of the time. So, as
prompt lookup decoding (Saxena 2023), vLLM's ngram speculator and llama.cpp's lookup decoding do, the
token that followed the latest earlier occurrence of the sequence's last n tokens is a candidate c, and
the bottom tier proposes from the mixture

    q'(x) = (1 - w) q(x) + w [x = c],

q being the tier's own distribution (after temperature, top-k, top-p). The weight w says how far the copy
beats the tier's own choice (the argmax of q): over the latest RECENT final positions (the prompt's, then
those committed in earlier rounds) that had a candidate and settled it, w = (copy won + 1) / (settled + 2).
A position settles it where exactly one of the two was the token committed there; where the tier never
proposed on the final path (the prompt) its choice is unknown, and the candidate alone settles it (right
or wrong). So on a loop that a weak draft misses w nears 1 within a few rounds; a tier that already
agrees with its checker (the retrieval tier at greedy, a draft on easy text) loses where the copy is
wrong and the tier right, and w falls, where counting the copy's hits alone kept it high: on 4K of
*Emma* at greedy, `retrieval` mode's proposals were accepted 0.74 of the time with the copies mixed in
at w 0.82, and 0.875 without them (the copies were right 0.82 of the time, the tier more often). On
prose whose n-grams rarely recur as they did, w stays low and q' is nearly q.

Why it stays exact: q' at a position depends only on what came before it (the candidate on the sequence
so far, w on tokens already committed and on the tier's choices at them, made in earlier rounds), so it is a proposer's distribution like any other, and the
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
from itertools import islice

import torch

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
        self.recent: deque[bool] = deque(maxlen=RECENT)  # whether the copy won each of the latest settled
        self.recent_right = 0  # how many of them it won
        self.choices: dict[int, list[tuple[int, tuple[int, ...], int]]] = {}  # `chose`: position -> (from, path, token)s
        self.offers: dict[int, tuple[int, float]] = {}  # latest final positions: (their candidate, weight then)

    @property
    def weight(self) -> float:
        return (self.recent_right + 1) / (len(self.recent) + 2)

    def chose(self, seq: list[int], path: list[int] | tuple[int, ...], token: int) -> None:
        """The proposing tier's own choice (its row's argmax, before the mixture) for the token after seq, then
        path: kept until that position is final, where `advance` weighs it against the candidate if the
        sequence then runs through seq[final:] + path (a row after a rejected token, or a tree's sibling,
        says nothing about the final path)."""
        position = len(seq) + len(path)
        self.choices.setdefault(position, []).append((self.final, tuple(seq[self.final:]) + tuple(path), token))

    def _choice(self, seq: list[int], j: int) -> int | None:
        """The tier's latest recorded choice for seq[j] on the final path, if any."""
        for start, path, token in reversed(self.choices.get(j, ())):
            if tuple(seq[start:j]) == path:
                return token
        return None

    def advance(self, seq: list[int], final: int) -> None:
        """seq[:final] is final: scores the candidate each newly final position had against the tier's own
        choice there (module docstring), and indexes it."""
        for j in range(max(self.final, self.n), final):
            key = tuple(seq[j - self.n:j])
            before = self.after.get(key)
            if before is not None:
                right = seq[before] == seq[j]
                self.offers[j] = (seq[before], self.weight)
                self.candidates += 1
                self.right += right
                choice = self._choice(seq, j)
                if choice is None or right != (choice == seq[j]):  # unknown, or exactly one of them right
                    self.recent_right += right - (self.recent[0] if len(self.recent) == RECENT else 0)
                    self.recent.append(right)
            self.after[key] = j
        self.final = max(self.final, final)
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


def mixed_with(probs: torch.Tensor, token: int, weight: float) -> torch.Tensor:
    """The mixture (1 - weight) probs + weight [x = token] of the module docstring."""
    mixed = probs * (1 - weight)
    mixed[token] += weight
    return mixed
