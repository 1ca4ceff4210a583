"""What one request makes of the rows its tiers compute: one place for chains, trees and checks alike.

A forward's logits first take the request's rules that read what came before a row (`ruled`:
speculation/rules.py: penalties, min_tokens, bad words, structured outputs); its sampling settings then
make them distributions (`probs`: logit_bias, allowed_token_ids, temperature, min_p, top-k, top-p). As a
proposer the bottom tier mixes into a row the prompt lookup's copy for that row's path
(speculation/lookup.py), unless the request bans the copy there (`copy`): proposed, it could only be
rejected; the lookup weighs its copies against the tier's own choices (`mixed`). Every random draw of the request uses `generator`.
"""
from __future__ import annotations

import torch

from ..sampling_params import SamplingParams
from ..speculation.lookup import ContextLookup
from ..speculation.rules import RowRules
from ..speculation.sampling import processed


class RequestRows:
    def __init__(self, params: SamplingParams, seq: list[int], generator: torch.Generator,
                 rules: RowRules | None = None, lookup: ContextLookup | None = None):
        """seq: the request's token sequence, which its engine extends in place (prompt, committed tokens,
        then speculative ones): a row's history is seq, then its path."""
        self.params, self.seq, self.generator, self.rules, self.lookup = params, seq, generator, rules, lookup

    @property
    def greedy(self) -> bool:
        return self.params.greedy

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Ruled logits [n, V] -> the request's distributions [n, V] float32."""
        return processed(logits, self.params)

    def ruled(self, logits: torch.Tensor, paths: list[list[int]]) -> torch.Tensor:
        """logits [n, V] of rows where row i follows seq, then paths[i], under the request's rules that read
        what came before a row; the same tensor where it has none."""
        return logits if self.rules is None else self.rules.apply(logits, self.seq, paths)

    def ruled_chain(self, logits: torch.Tensor, start: int) -> torch.Tensor:
        """`ruled` for rows where row i follows seq[:start + i]."""
        return logits if self.rules is None else self.rules.apply_chain(logits, self.seq, start)

    def bans(self, token: int, path: list[int], ruled: torch.Tensor) -> bool:
        """Whether the request bans `token` after seq, then `path`: allowed_token_ids, or a rule that reads
        what came before (`ruled`: the proposer's row there under them). Not the proposer's own -inf: a
        reduced-vocabulary draft's for the tokens it lacks, which the lookup's copies are how it proposes."""
        allowed = self.params.allowed_token_ids
        if allowed is not None and token not in allowed:
            return True
        if self.rules is None or ruled[token] != float("-inf"):
            return False
        alone = self.rules.apply(torch.zeros(1, ruled.shape[-1], device=ruled.device), self.seq, [path])
        return bool(alone[0, token] == float("-inf"))

    def copy(self, path: list[int], ruled: torch.Tensor) -> int | None:
        """The prompt lookup's copy after seq, then `path` (`ruled`: the proposer's row there), unless the
        request bans it there; None without a lookup or a copy."""
        token = None if self.lookup is None else self.lookup.candidate(self.seq, path)
        return None if token is None or self.bans(token, path, ruled) else token

    def mixed(self, row: torch.Tensor, copy: int | None, path: list[int]) -> torch.Tensor:
        """The proposer's distribution `row` after seq, then `path`, mixed with the lookup's `copy` (None: the
        row itself); the lookup keeps what the row chose and gave the copy, to weigh its copies against."""
        if self.lookup is None:
            return row
        self.lookup.chose(self.seq, path, row, copy)
        return row if copy is None else self.lookup.mix(row, copy)
