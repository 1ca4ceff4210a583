"""What a request may ask of the model an LLM holds: its prompt as token ids of the vocabulary, its
max_tokens within the positions, its sampling settings against the vocabulary, the tokenizer and the
structured output it names. `RequestChecks` is a part of LLM (api.py), which holds the `tokenizer`,
`target`, `grammars` and `eos_ids` these read."""
from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import replace

import torch

from .config import ConfigError
from .sampling_params import SamplingParams
from .errors import UserError
from .speculation.rules import bad_word_ids


class RequestChecks:
    def no_tokenizer(self) -> str:
        """Why this LLM has no tokenizer, for the errors of what needs one."""
        return ("skip_tokenizer_init=True loaded no tokenizer" if self._skipped_tokenizer
                else f"{self.model_path} has no tokenizer")

    def encode(self, prompt: str | Sequence[int]) -> list[int]:
        """A prompt's token ids (text through the target's tokenizer), checked against the vocabulary."""
        if isinstance(prompt, str):  # ("" is [BOS] where the tokenizer adds one: vLLM runs it; empty ids are refused)
            if self.tokenizer is None:
                raise UserError(f"{self.no_tokenizer()}; pass token ids")
            ids = self.tokenizer(prompt).input_ids
        elif isinstance(prompt, (bytes, bytearray)):  # a sequence of ints, which are not token ids
            raise UserError("a prompt must be a string or a list of token ids, not bytes: decode it first "
                            "(e.g. data.decode('utf-8'))")
        else:
            try:
                ids = [operator.index(t) for t in prompt]  # ints, numpy's and torch's integers
            except TypeError:
                raise UserError(f"a prompt must be a string or a list of token ids (got {prompt!r:.40})") from None
        if not ids:
            raise UserError("empty prompt")
        vocab = self.target.config.vocab_size
        if min(ids) < 0 or max(ids) >= vocab:
            raise UserError(f"prompt token ids must lie in [0, {vocab})")
        return ids

    def truncated(self, ids: list[int], prompt: str | Sequence[int], keep: int | None) -> list[int]:
        """vLLM's truncate_prompt_tokens: a prompt's last `keep` ids (-1: the model's positions); of a text,
        the BOS its tokenizer put in front kept before them (vLLM truncates inside the tokenizer, which keeps
        special tokens: cut off, a Llama prompt ran without its BOS)."""
        if keep == -1:
            keep = self.target.config.max_positions
        if keep is None or len(ids) <= keep:
            return ids
        if isinstance(prompt, str) and keep > 1 and self._adds_bos() and ids[0] == self.tokenizer.bos_token_id:
            return ids[:1] + ids[len(ids) - keep + 1:]
        return ids[len(ids) - keep:]

    def _adds_bos(self) -> bool:
        """Whether the tokenizer puts a BOS before a text itself (a BOS written in the text is cut as any
        token: SmolLM2's bos is <|im_start|>, which its tokenizer adds nowhere)."""
        if not hasattr(self, "_bos_added"):
            bos = getattr(self.tokenizer, "bos_token_id", None)
            self._bos_added = bos is not None and self.tokenizer("").input_ids[:1] == [bos]
        return self._bos_added

    def within_positions(self, prompt_len: int, params: SamplingParams) -> SamplingParams:
        """`params` with max_tokens (None: as many as there are) up to what the prompt leaves of the model's
        positions, where generation stops as vLLM's does ("length"); a UserError where the prompt fills them
        (all of them may be scored: max_tokens 0)."""
        cfg = self.target.config
        room = cfg.max_positions - prompt_len
        if room < 0 or (room == 0 and params.max_tokens != 0):
            raise UserError(f"the prompt ({prompt_len} tokens) fills the model's {cfg.max_positions} positions"
                            f"{_why_full(cfg, prompt_len)}")
        if params.max_tokens is not None and params.max_tokens <= room:
            return params
        return replace(params, max_tokens=room, min_tokens=min(params.min_tokens, room))

    def prepare(self, params: SamplingParams) -> SamplingParams:
        """`params` checked against this model, with its bad_words' token sequences added to bad_words_ids
        (each word alone and after a space, as vLLM tokenizes them). Raises UserError where a token id
        setting names a token outside the vocabulary, or structured_outputs is not a valid constraint
        (ConfigError, naming it)."""
        if self.tokenizer is None and (params.stop or params.bad_words):  # texts the tokenizer would find
            name = "stop strings" if params.stop else "bad_words"
            other = "stop_token_ids" if params.stop else "bad_words_ids (or, to a server, logit_bias -100)"
            raise UserError(f"{name} need the model's tokenizer ({self.no_tokenizer()}); pass {other}")
        if params.bad_words:
            params = replace(params, bad_words_ids=params.bad_words_ids + bad_word_ids(self.tokenizer, params.bad_words))
        vocab = self.target.config.vocab_size
        for name, ids in (("logit_bias", [t for t, _ in params.logit_bias]), ("stop_token_ids", params.stop_token_ids),
                          ("allowed_token_ids", params.allowed_token_ids or ()),
                          ("bad_words_ids", [t for s in params.bad_words_ids for t in s])):
            if ids and max(ids) >= vocab:
                raise ConfigError(f"{name} names token {max(ids)}, outside the vocabulary [0, {vocab})")
        if params.structured_outputs is not None:
            self.grammars.check(params.structured_outputs)
            if params.allowed_token_ids is not None:  # the end of a complete text is no token of it: allowed
                params = replace(params, allowed_token_ids=tuple(sorted({*params.allowed_token_ids, *self.eos_ids()})))
            banned = [s[0] for s in params.bad_words_ids if len(s) == 1]
            if params.allowed_token_ids is not None or banned:
                self._check_first_token(params, banned)
        return params

    def _check_first_token(self, params: SamplingParams, banned: list[int]) -> None:
        """ConfigError where allowed_token_ids and one-token bad words leave none of the tokens the structured
        output allows first: the rules would contradict each other from the start, and the last one applied
        would win, silently (sampling.only_allowed)."""
        left = self.grammars.guide(params.structured_outputs).allowed(()).clone()
        if params.allowed_token_ids is not None:
            allowed = torch.zeros_like(left)
            allowed[list(params.allowed_token_ids)] = True
            left &= allowed
        left[banned] = False
        if not left.any():
            raise ConfigError("allowed_token_ids and bad_words leave no token the structured output allows to "
                              "begin with")


def _why_full(cfg, prompt_len: int) -> str:
    """What bounds the positions a prompt filled, and where RoPE scaling would stretch them, how."""
    if cfg.max_positions == cfg.position_limit:
        return " (max_model_len)"
    if cfg.max_positions < cfg.max_position_embeddings:
        return " (its sliding window: attention past it is not implemented)"
    if cfg.rope_type != "default":
        return ""
    factor = 2
    while cfg.max_positions * factor <= prompt_len:
        factor *= 2
    return (f"; --rope-scaling yarn:{factor} (LLM(rope_scaling='yarn:{factor}')) stretches them to "
            f"{cfg.max_positions * factor}")
