"""Prompt lookup: the bottom tier's proposals mixed with tokens copied from the sequence itself.

Small models repeat themselves (SmolLM2's greedy continuation of 8K tokens of Genesis settles into a loop
of about 35 tokens), and answers about a document quote it. Our 4-layer drafts barely copy: on that loop
they agreed with the target's next token 3% (Austen draft) and 31% (mix draft) of the time. So, as
prompt lookup decoding (Saxena 2023), vLLM's ngram speculator and llama.cpp's lookup decoding do, the
token that followed the latest earlier occurrence of the sequence's last n tokens is a candidate c, and
the bottom tier proposes from the mixture

    q'(x) = (1 - w) q(x) + w [x = c],

q being the tier's own distribution (after temperature, top-k, top-p). The weight w is how often, so far,
a position's candidate was the token the target committed there: (right + 1) / (candidates + 2), counted
over the prompt and the tokens committed in earlier rounds. On a loop w nears 1; on prose whose n-grams
rarely recur as they did, it stays low and q' is nearly q.

Why it stays exact: q' at a position depends only on the tokens before it (the candidate on the sequence
so far, w on tokens already committed), so it is a proposer's distribution like any other, and the
checker verifies the proposal against q' (min(1, p/q'), the residual max(p - q', 0)). Greedy proposes
q''s argmax; there q is one-hot, so that is c when w > 1/2, else q's own argmax.

Measured (README, Prompt lookup): the weight counted over the whole prompt stays near the prompt's own
share (0.38 on Emma, 0.50 on Genesis), so greedy never copied there, and at temperature 0.6 tier-1
acceptance rose while tokens/s did not; hence off by default.
"""
from __future__ import annotations

import torch


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

    @property
    def weight(self) -> float:
        return (self.right + 1) / (self.candidates + 2)

    def advance(self, seq: list[int], final: int) -> None:
        """seq[:final] is final: scores the candidate each newly final position had, and indexes it."""
        for j in range(max(self.final, self.n), final):
            key = tuple(seq[j - self.n:j])
            before = self.after.get(key)
            if before is not None:
                self.candidates += 1
                self.right += seq[before] == seq[j]
            self.after[key] = j
        self.final = max(self.final, final)

    def candidate(self, seq: list[int]) -> int | None:
        """The token that followed the latest final occurrence of seq's last n tokens, if any."""
        if len(seq) < self.n:
            return None
        after = self.after.get(tuple(seq[-self.n:]))
        return None if after is None else seq[after]

    def propose(self, seq: list[int], probs: torch.Tensor) -> torch.Tensor:
        """The bottom tier's distribution `probs` [V] for the token after `seq`, mixed with the candidate."""
        token = self.candidate(seq)
        if token is None:
            return probs
        w = self.weight
        mixed = probs * (1 - w)
        mixed[token] += w
        return mixed

    def to_dict(self) -> dict:
        return {"n": self.n, "candidates": self.candidates, "right": self.right, "weight": round(self.weight, 4)}
