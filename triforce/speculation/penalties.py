"""Rules on a row's logits that read the tokens before that row: presence, frequency and repetition
penalties (`Penalties`), and min_tokens' ban on the tokens that end generation (`MinTokens`).

OpenAI's `presence_penalty` p and `frequency_penalty` f and vLLM's `repetition_penalty` r, as vLLM applies
them, after the logit bias b: for each token v, with c(v) how often v was generated before the row (the
prompt not counted), first, where v is in the prompt or was generated (r != 1), a logit x + b becomes
(x + b) / r if positive, else (x + b) * r; then f * c(v) and p * [c(v) > 0] are subtracted. The bias itself
is added where every tier's rows are processed (sampling.processed), after this: `apply` returns the
logits that, with b added, are vLLM's (for the subtractions the order makes no difference).

Speculation stays exact when every tier's row at a position is penalized by that position's own history:
the committed sequence, then the proposals on the way to it (a chain's earlier tokens, a tree node's
ancestors and itself). The target's rows are then exactly the penalized target's distributions that
verification compares against, and a proposer's rows are what it sampled from. `Penalties.apply` takes
the rows' histories that way: one shared sequence and each row's own path after it; `MinTokens.apply`
each row's length.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch


class Penalties:
    """A request's penalties (`of` gives None where they change nothing)."""

    def __init__(self, presence: float, frequency: float, repetition: float, prompt: Sequence[int],
                 bias: Sequence[tuple[int, float]] = ()):
        """bias: the request's logit_bias, (token, value) pairs sorted by token."""
        self.presence, self.frequency, self.repetition = presence, frequency, repetition
        self._bias_tokens = torch.tensor([t for t, _ in bias], dtype=torch.long)
        self._bias_values = torch.tensor([v for _, v in bias], dtype=torch.float32)
        self.prompt_length = len(prompt)
        self._prompt = torch.tensor(list(prompt), dtype=torch.long)
        self._prompt_sorted: torch.Tensor | None = None  # its distinct tokens, made at first use

    @classmethod
    def of(cls, params, prompt: Sequence[int]) -> "Penalties | None":
        """The penalties of SamplingParams `params` for a request of `prompt` (None: all off)."""
        if not params.penalized:
            return None
        return cls(params.presence_penalty, params.frequency_penalty, params.repetition_penalty, prompt,
                   params.logit_bias)

    def apply(self, logits: torch.Tensor, history: Sequence[int], paths: Sequence[Sequence[int]]) -> torch.Tensor:
        """logits [n, V] (float32) of rows where row i follows `history` (the prompt, then the tokens
        generated so far) and then paths[i] (a tree's nodes): the penalized logits, a new tensor."""
        if len(paths) != logits.shape[0]:
            raise ValueError(f"{logits.shape[0]} rows need {logits.shape[0]} paths (got {len(paths)})")
        rows = torch.tensor([i for i, path in enumerate(paths) for _ in path], dtype=torch.long)

        def add(counts: torch.Tensor, columns: torch.Tensor) -> None:
            counts.index_put_((rows, columns), torch.ones(len(rows)), accumulate=True)

        return self._penalized(logits, history, [t for path in paths for t in path], add)

    def apply_chain(self, logits: torch.Tensor, history: Sequence[int], chain: Sequence[int]) -> torch.Tensor:
        """`apply` where row i follows `history` and then chain[:i] (a chain's check, rows of a prefill)."""
        chain = list(chain[:logits.shape[0] - 1])

        def add(counts: torch.Tensor, columns: torch.Tensor) -> None:
            steps = torch.zeros_like(counts)
            steps[torch.arange(1, len(chain) + 1), columns] = 1.0  # row i + 1 sees chain[i] once more
            counts += steps.cumsum(0)

        return self._penalized(logits, history, chain, add)

    def _penalized(self, logits: torch.Tensor, history: Sequence[int], extra: list[int], add) -> torch.Tensor:
        """The rows' logits penalized by `history`'s generated tokens and the `extra` tokens of their paths,
        which add(counts, their columns) counts into each row's counts. Only the columns of tokens seen
        are read and written: the prompt's (for the repetition penalty), then the others."""
        n = logits.shape[0]
        generated = torch.tensor(list(history[self.prompt_length:]), dtype=torch.long)
        extra_tokens = torch.tensor(extra, dtype=torch.long)
        prompt = self._prompt_tokens() if self.repetition != 1 else torch.empty(0, dtype=torch.long)
        tokens = torch.cat((generated, extra_tokens))
        others = torch.unique(tokens[~_member(tokens, prompt)])  # sorted, a few hundred at most

        def column(t: torch.Tensor) -> torch.Tensor:  # where each token's column is among (prompt, others)
            return torch.where(_member(t, prompt), _rank(prompt, t), len(prompt) + _rank(others, t))

        width = len(prompt) + len(others)
        counts = torch.zeros(width).index_add_(0, column(generated), torch.ones(len(generated)))
        counts = counts.expand(n, width).clone()
        add(counts, column(extra_tokens))
        counts = counts.to(logits.device)
        index = torch.cat((prompt, others))
        columns = index.to(logits.device)
        x = logits.float()[:, columns]  # [n, width]
        if self.repetition != 1:
            seen = (counts > 0) | (torch.arange(width, device=logits.device) < len(prompt))
            bias = self._bias_of(index).to(logits.device)  # vLLM penalizes x + bias; processed adds it later
            x = torch.where(seen, _repeated(x + bias, self.repetition) - bias, x)
        x = x - self.frequency * counts - self.presence * (counts > 0).float()
        out = logits.float().clone()
        out[:, columns] = x
        return out

    def _bias_of(self, tokens: torch.Tensor) -> torch.Tensor:
        """The logit bias of each token (0 for most)."""
        out = torch.zeros(len(tokens))
        if len(self._bias_tokens):
            biased = _member(tokens, self._bias_tokens)
            out[biased] = self._bias_values[_rank(self._bias_tokens, tokens[biased])]
        return out

    def _prompt_tokens(self) -> torch.Tensor:
        """The prompt's distinct tokens, sorted."""
        if self._prompt_sorted is None:
            self._prompt_sorted = torch.unique(self._prompt)
        return self._prompt_sorted


class MinTokens:
    """vLLM's min_tokens: the tokens that end generation (stop_token_ids and end-of-sequence, even where
    ignore_eos lets it pass) are impossible in a row that follows fewer than `min_tokens` generated tokens."""

    def __init__(self, min_tokens: int, stop_ids: Sequence[int], prompt_length: int):
        self.min_tokens, self.prompt_length = min_tokens, prompt_length
        self._ids = torch.tensor(sorted(set(stop_ids)), dtype=torch.long)
        self._banned = frozenset(stop_ids)

    @classmethod
    def of(cls, params, stop_ids: Sequence[int], prompt_length: int) -> "MinTokens | None":
        """The rule for SamplingParams `params` whose generation ends at `stop_ids` (None: it bans nothing)."""
        return cls(params.min_tokens, stop_ids, prompt_length) if params.min_tokens and stop_ids else None

    def refuses(self, length: int, token: int) -> bool:
        """Whether the rule bans `token` in a row that follows `length` tokens (the prompt's included)."""
        return length - self.prompt_length < self.min_tokens and token in self._banned

    def apply(self, logits: torch.Tensor, lengths: Sequence[int]) -> torch.Tensor:
        """logits [n, V] of rows where row i follows lengths[i] tokens (the prompt's included): the same
        tensor, or a copy with the stop tokens at -inf in the rows that come too early."""
        early = [i for i, length in enumerate(lengths) if length - self.prompt_length < self.min_tokens]
        if not early:
            return logits
        ids = self._ids[self._ids < logits.shape[-1]]  # an end-of-sequence id past the vocabulary never comes
        out = logits.clone()
        out[torch.tensor(early, device=logits.device)[:, None], ids.to(logits.device)[None, :]] = float("-inf")
        return out


def _repeated(x: torch.Tensor, penalty: float) -> torch.Tensor:
    """The repetition penalty on logits x: divided where positive, multiplied elsewhere."""
    return torch.where(x > 0, x / penalty, x * penalty)


def _rank(ordered: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Each token's index in `ordered` (sorted), where it is there."""
    return torch.searchsorted(ordered, tokens)


def _member(tokens: torch.Tensor, ordered: torch.Tensor) -> torch.Tensor:
    """Whether each token is in `ordered` (sorted)."""
    if not len(ordered):
        return torch.zeros(tokens.shape, dtype=torch.bool)
    return ordered[_rank(ordered, tokens).clamp_max(len(ordered) - 1)] == tokens
