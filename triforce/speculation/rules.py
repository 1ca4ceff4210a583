"""A request's rules on a row's logits that read the tokens before that row, applied together
(`RowRules`): its penalties and min_tokens (penalties.py), its bad words (`BadWords`) and its
structured-output constraint (guided.py), in that order.

Speculation stays exact when every tier's row at a position follows the same rules read from that
position's own history: the committed sequence, then the proposals on the way to it (a chain's earlier
tokens, a tree node's ancestors). The target's rows are then exactly the distributions of plain decoding
under those rules, which verification compares with, and a proposer's rows are what it sampled from.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from ..config import ConfigError
from ..errors import RequestFailed
from .guided import Guide
from .penalties import MinTokens, Penalties


class BadWords:
    """vLLM's bad_words, as token sequences (SamplingParams.bad_words_ids): a sequence's last token is
    impossible in a row whose generated tokens before it (the prompt's not counted, as in vLLM) end with
    the sequence's other tokens; a one-token sequence's token in every row."""

    def __init__(self, sequences: Sequence[Sequence[int]], prompt_length: int):
        self.prompt_length = prompt_length
        self.always = sorted({s[0] for s in sequences if len(s) == 1})
        # the token a row follows -> (tokens before the last, last tokens) of the sequences ending with it
        self.after: dict[int, dict[tuple[int, ...], list[int]]] = {}
        for s in sequences:
            if len(s) > 1:
                self.after.setdefault(s[-2], {}).setdefault(tuple(s[:-1]), []).append(s[-1])

    @classmethod
    def of(cls, params, prompt_length: int) -> "BadWords | None":
        return cls(params.bad_words_ids, prompt_length) if params.bad_words_ids else None

    def banned(self, seq: Sequence[int], end: int, path: Sequence[int]) -> list[int]:
        """The tokens banned in a row after seq[:end] and then `path`: only the sequences whose token before
        the last is the row's previous one are compared."""
        out = list(self.always)
        generated = end - self.prompt_length + len(path)
        if generated < 1:
            return out
        for before, last in self.after.get(path[-1] if path else seq[end - 1], {}).items():
            k = len(before)
            if generated < k:
                continue
            from_path = tuple(path[max(0, len(path) - k):])
            if tuple(seq[end - (k - len(from_path)):end]) + from_path == before:
                out += last
        return out

    def apply(self, logits: torch.Tensor, banned: list[list[int]]) -> torch.Tensor:
        """logits [n, V] with banned[i] at -inf in row i (a new tensor; the same one where none is)."""
        rows = [i for i, tokens in enumerate(banned) for _ in tokens]
        if not rows:
            return logits
        out = logits.clone()
        out[torch.tensor(rows), torch.tensor([t for tokens in banned for t in tokens])] = float("-inf")
        return out


def bad_word_ids(tokenizer, words: Sequence[str]) -> tuple[tuple[int, ...], ...]:
    """vLLM's bad_words as token sequences: each word's tokens alone (its leading spaces dropped) and,
    where that gives a new first token and as many tokens, after a space (a word within the text)."""
    out = []
    for word in words:
        alone = tokenizer.encode(word.lstrip(), add_special_tokens=False)
        spaced = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
        if not alone:
            raise ConfigError(f"bad_words: the tokenizer writes {word!r} as no tokens")
        out.append(tuple(alone))
        if spaced[0] != alone[0] and len(spaced) == len(alone):
            out.append(tuple(spaced))
    return tuple(out)


class RowRules:
    """A request's rules that read a row's history (None from `of` where it has none)."""

    def __init__(self, penalties: Penalties | None, min_tokens: MinTokens | None, bad_words: BadWords | None,
                 guide: Guide | None, prompt_length: int):
        self.penalties, self.min_tokens, self.bad_words, self.guide = penalties, min_tokens, bad_words, guide
        self.prompt_length = prompt_length

    @classmethod
    def of(cls, params, prompt: Sequence[int], stop_ids: Sequence[int], guide: Guide | None) -> "RowRules | None":
        """The rules of SamplingParams `params` for a request of `prompt` whose generation ends at
        `stop_ids` (min_tokens bans them early), with the structured-output `guide` (Grammars.guide)."""
        rules = cls(Penalties.of(params, prompt), MinTokens.of(params, stop_ids, len(prompt)),
                    BadWords.of(params, len(prompt)), guide, len(prompt))
        return rules if (rules.penalties, rules.min_tokens, rules.bad_words, guide) != (None,) * 4 else None

    def apply(self, logits: torch.Tensor, seq: Sequence[int], paths: Sequence[Sequence[int]]) -> torch.Tensor:
        """logits [n, V] of rows where row i follows seq, then paths[i]: a new tensor, or the same one where
        no rule changes it."""
        if self.penalties is not None:
            logits = self.penalties.apply(logits, seq, paths)
        if self.min_tokens is not None:
            logits = self.min_tokens.apply(logits, [len(seq) + len(path) for path in paths])
        if self.bad_words is not None:
            logits = self.bad_words.apply(logits, [self.bad_words.banned(seq, len(seq), path) for path in paths])
        if self.guide is not None:
            generated = seq[self.prompt_length:]
            logits = self.guide.apply(logits, [[*generated, *path] for path in paths])
        return logits

    def refuses(self, seq: Sequence[int], position: int) -> bool:
        """Whether a rule refuses seq[position] in the row after seq[:position]."""
        token = seq[position]
        if self.min_tokens is not None and self.min_tokens.refuses(position, token):
            return True
        if self.bad_words is not None and token in self.bad_words.banned(seq, position, ()):
            return True
        if self.guide is None:
            return False
        return self.guide.output_refuses(seq[self.prompt_length:position], token)

    def apply_chain(self, logits: torch.Tensor, seq: Sequence[int], start: int) -> torch.Tensor:
        """`apply` for rows where row i follows seq[:start + i]."""
        n = len(logits)
        if self.penalties is not None:
            logits = self.penalties.apply_chain(logits, seq[:start], seq[start:start + n - 1])
        if self.min_tokens is not None:
            logits = self.min_tokens.apply(logits, range(start, start + n))
        if self.bad_words is not None:
            logits = self.bad_words.apply(logits, [self.bad_words.banned(seq, start + i, ()) for i in range(n)])
        if self.guide is not None:
            logits = self.guide.apply(logits, [seq[self.prompt_length:start + i] for i in range(n)])
        return logits


class RulesContradict(ConfigError, RequestFailed):
    """A request's rules left no token to choose at some point of its generation."""


def check_obeyed(rules: RowRules | None, allowed: frozenset[int] | None, seq: Sequence[int], start: int,
                 end: int, prompt_length: int) -> None:
    """Raises RulesContradict where a token of seq[start:end] (output, sampled from the target's rows)
    breaks one of the request's rules: allowed_token_ids, or a RowRules rule. Each rule drops tokens from a
    row in turn, and a row left with none falls back on the tokens the last one applied allows
    (sampling.only_allowed), so a token that breaks a rule is the sign that the rules contradicted each
    other in its row (allowed_token_ids that the structured output or a bad word rules out after some
    tokens, say), which no check before generation can see. Failing there beats an answer that silently
    breaks one of them."""
    for position in range(start, end):
        if (allowed is not None and seq[position] not in allowed) or (
                rules is not None and rules.refuses(seq, position)):
            on = [name for name, rule in (("allowed_token_ids", allowed), ("min_tokens", rules and rules.min_tokens),
                                          ("bad_words", rules and rules.bad_words),
                                          ("the structured output", rules and rules.guide)) if rule is not None]
            after = position - prompt_length
            named = on[0] if len(on) == 1 else f"{', '.join(on[:-1])} and {on[-1]}"
            raise RulesContradict(f"{named} leave no token to choose after {after} "
                                  f"generated token{'' if after == 1 else 's'}: they contradict each other there")
