"""Structured outputs (vLLM's guided decoding): every tier's rows keep only the tokens that a constraint (a
JSON schema, any JSON object, a regular expression, a choice of strings, a Lark grammar) allows after that
row's history, as llguidance's matcher computes it from the tokens before the row.

Speculation stays exact as it does with penalties (speculation/penalties.py): a row's mask depends only on
the tokens before it (the generated ones, then the row's own path: a chain's earlier proposals, a tree
node's ancestors), and every tier masks its row at a position by that same history. The target's rows
are then the constrained target's distributions that verification compares with, a proposer's rows are
what it sampled from, and the output is distributed as plain decoding under the same constraint (greedy:
equal token for token). A row after a history the constraint refuses (a token the mask did not allow,
such as a prompt lookup's copy mixed into a proposer's row) is left as it is: verification rejects that
token before any row after it counts.

One matcher serves all of a request's rows: `Guide` moves it to each row's history by rolling back to
the longest prefix it shares with the tokens consumed and consuming the rest, and keeps the masks of
recent histories (the tiers ask for the same positions in turn).
"""
from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence

import torch

from ..config import ConfigError
from ..errors import RequestFailed
from ..sampling_params import StructuredOutputs
from .sampling import only_allowed

GBNF_RULE = re.compile(r"(?m)^\s*[\w-]+\s*::=")  # a line that defines a rule in GBNF (Lark writes name: ...)
RECENT_MASKS = 64  # histories whose masks a Guide keeps (a round asks for a few dozen)
REGEX_SPECIAL = set("\\.+*?()|[]{}^$#&-~")
SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")  # name -> schema
SCHEMA_LISTS = ("anyOf", "prefixItems", "items")  # lists of schemas (items: draft 4's tuples)
SCHEMA_ONE = ("items", "additionalItems", "additionalProperties", "unevaluatedItems", "not", "contains",
              "propertyNames")  # a schema each
OPEN_KEYS = ("additionalProperties", "patternProperties", "unevaluatedProperties")  # an object that says so
MERGING = ("allOf", "oneOf", "if", "dependentSchemas", "dependentRequired")  # keywords that merge schemas
SCHEMA_DATA = ("enum", "const", "default", "examples")  # values, not schemas


def _literal(text: str) -> str:
    """`text` as a regular expression that matches only itself (llguidance's syntax: Rust's regex crate)."""
    return "".join("\\" + c if c in REGEX_SPECIAL else c for c in text)


def grammar_text(spec: StructuredOutputs) -> str:
    """llguidance's grammar for a constraint."""
    from llguidance import LLMatcher

    if spec.json is not None:
        return LLMatcher.grammar_from_json_schema(closed_objects(json.loads(spec.json)))  # (its text: hashable)
    if spec.json_object:
        return LLMatcher.grammar_from_json_schema({"type": "object"})
    if spec.regex is not None:
        return LLMatcher.grammar_from_regex(spec.regex)
    if spec.choice is not None:
        return LLMatcher.grammar_from_regex("|".join(_literal(c) for c in spec.choice))
    if GBNF_RULE.search(spec.grammar) is None:
        return LLMatcher.grammar_from_lark(spec.grammar)
    from llguidance.gbnf_to_lark import gbnf_to_lark

    try:  # a GBNF grammar (llama.cpp's; vLLM's guided_grammar examples: root ::= ...) as its Lark twin
        return LLMatcher.grammar_from_lark(gbnf_to_lark(spec.grammar))
    except Exception as exc:  # noqa: BLE001 (the converter's own errors, GbnfToLarkError among them)
        raise ValueError(f"not a GBNF grammar: {exc}") from None


def closed_objects(schema):
    """`schema` with every object that lists its `properties` and says nothing of others closed to them
    (`additionalProperties: false`), as vLLM's default backend (xgrammar, strict) and OpenAI's strict
    schemas take it: llguidance's default allows other keys, and a model that went on adding keys ran into
    max_tokens with its JSON unfinished. An object that says how other keys go (OPEN_KEYS), lists no
    properties (`{"type": "object"}`: any object) or requires a key it does not list is kept as it is; and
    a schema that merges objects anywhere (MERGING, or a $ref or anyOf beside properties: closing either
    side would refuse the other's keys) is kept whole as written. Returns a copy."""
    return schema if _merges_objects(schema) else _closed(schema)


def _merges_objects(node) -> bool:
    """Whether a schema in `node` merges objects (closed_objects), read conservatively: a property of such a
    name counts too."""
    if isinstance(node, list):
        return any(_merges_objects(item) for item in node)
    if not isinstance(node, dict):
        return False
    if any(key in node for key in MERGING) or ("properties" in node and ("anyOf" in node or "$ref" in node)):
        return True
    return any(_merges_objects(value) for key, value in node.items() if key not in SCHEMA_DATA)


def _closed(schema):
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: _closed(sub) for name, sub in out[key].items()}
    for key in SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [_closed(sub) for sub in out[key]]
    for key in SCHEMA_ONE:
        if isinstance(out.get(key), dict):
            out[key] = _closed(out[key])
    kind, listed = out.get("type", "object"), out.get("properties")
    is_object = kind == "object" or (isinstance(kind, list) and "object" in kind)
    if is_object and isinstance(listed, dict) and not any(key in out for key in OPEN_KEYS) and \
            set(out.get("required") or ()) <= set(listed):
        out["additionalProperties"] = False
    return out


def _common_prefix(a: list[int], b: Sequence[int]) -> int:
    """How many leading tokens a and b share (in practice they part near their ends)."""
    n = min(len(a), len(b))
    if a[:n] == list(b[:n]):
        return n
    low, step = n - 1, 1
    while low > 0 and a[:low] != list(b[:low]):
        low, step = max(0, low - step), step * 2
    while low < n and a[low] == b[low]:
        low += 1
    return low


class Guide:
    """One request's constraint: the tokens allowed after each row's history."""

    def __init__(self, matcher, vocab_size: int, eos: Sequence[int] = ()):
        """matcher: a fresh llguidance LLMatcher of the constraint; vocab_size: the logits' width; eos: the
        end-of-sequence ids, which end a complete text."""
        self.matcher, self.vocab_size, self.eos = matcher, vocab_size, frozenset(eos)
        self._fresh = matcher.deep_copy()  # the matcher before any token: llguidance's errors are for good
        self.consumed: list[int] = []  # the history the matcher is at
        # history -> (mask, the one token it allows or None, why no text continues it or None); (None, None,
        # None) where the history is refused
        self._masks: OrderedDict[tuple[int, ...], tuple[torch.Tensor | None, int | None, str | None]] = OrderedDict()
        self._bits = torch.zeros((vocab_size + 31) // 32, dtype=torch.int32)
        self._shifts = torch.arange(32, dtype=torch.int32)

    def allowed(self, history: Sequence[int]) -> torch.Tensor | None:
        """bool [V]: the tokens the constraint allows after `history` (the generated tokens before a row);
        None where it refuses the history itself."""
        return self._entry(history)[0]

    def forced(self, history: Sequence[int]) -> int | None:
        """The token after `history` where the constraint allows just one (a literal's next token, the
        end-of-sequence of a complete text): sampling there picks it whatever the logits, so no forward is
        needed to choose it. None elsewhere."""
        return self._entry(history)[1]

    def output_refuses(self, history: Sequence[int], token: int) -> bool:
        """Whether the constraint refuses an output's `token` after `history` (an output's tokens before it):
        MatcherFailed where no text the constraint allows continues that history."""
        mask, _, why = self._entry(history)
        if why is not None:
            raise MatcherFailed(f"structured output: no text the constraint allows continues the {len(history)} "
                                f"generated tokens with a token of this vocabulary ({why})")
        return mask is None or not bool(mask[token])

    def _entry(self, history: Sequence[int]) -> tuple[torch.Tensor | None, int | None, str | None]:
        key = tuple(history)
        if key in self._masks:
            self._masks.move_to_end(key)
            return self._masks[key]
        try:
            entry = self._computed(key)
        except _DeadEnd as dead:
            # (a character the vocabulary cannot spell, llguidance's limits): such a history is left like a
            # refused one, so that a proposer's path may reach it, and an output that does ends there
            # (output_refuses); ar, whose target samples the same rows, ends there as often
            self.matcher, self.consumed = self._fresh.deep_copy(), []
            entry = (None, None, str(dead))
        self._masks[key] = entry
        if len(self._masks) > RECENT_MASKS:
            self._masks.popitem(last=False)
        return entry

    def _computed(self, key: tuple[int, ...]) -> tuple[torch.Tensor | None, int | None, str | None]:
        if self._go_to(key):
            self.matcher.unsafe_compute_mask_ptr(self._bits.data_ptr(), self._bits.numel() * 4)
            _check_matcher(self.matcher)  # llguidance may find the dead end only here (and allow EOS alone)
            mask = ((self._bits[:, None] >> self._shifts) & 1).flatten()[:self.vocab_size].bool()
            only = mask.nonzero()[:2]
            return mask, int(only[0]) if len(only) == 1 else None, None
        if (end := key[len(self.consumed)]) in self.eos and self.matcher.is_accepting():
            # after the end of a complete text: nothing here is ever output (generation ends at the end
            # token), so a proposer's rows may as well repeat it, at no forward's cost
            mask = torch.zeros(self.vocab_size, dtype=torch.bool)
            mask[end] = True
            return mask, end, None
        return None, None, None

    def apply(self, logits: torch.Tensor, histories: Sequence[Sequence[int]]) -> torch.Tensor:
        """logits [n, V] of rows after histories[i], with the tokens the constraint does not allow at -inf (a
        new tensor; rows after a refused history unchanged)."""
        masks = [self.allowed(h) for h in histories]
        refused = torch.stack([torch.zeros(self.vocab_size, dtype=torch.bool) if m is None else ~m for m in masks])
        return only_allowed(logits, refused.to(logits.device))

    def _go_to(self, history: tuple[int, ...]) -> bool:
        """Moves the matcher to `history`; False where the constraint refuses it (the matcher then stands at
        its longest allowed prefix)."""
        common = _common_prefix(self.consumed, history)
        if common < len(self.consumed):
            self.matcher.rollback(len(self.consumed) - common)
            del self.consumed[common:]
        rest = list(history[common:])
        taken = self.matcher.try_consume_tokens(rest) if rest else 0
        self.consumed += rest[:taken]
        _check_matcher(self.matcher)
        return taken == len(rest)


class _DeadEnd(Exception):
    """The matcher entered its error state: no text the constraint allows continues its history."""


def _check_matcher(matcher) -> None:
    if matcher.is_error():  # its message's first line: the reason (a dump of its state follows)
        raise _DeadEnd(matcher.get_error().strip().split("\n")[0])


class MatcherFailed(RequestFailed):
    """An output reached a history that no text the constraint allows continues: the request fails (a 400
    in a server), not its batch (a RuntimeError ended every request of the step with a 500)."""


class Grammars:
    """The constraints of one model: its tokenizer as llguidance reads it (built on first use: about 0.4 s
    for SmolLM2's) and each constraint's grammar, compiled and checked once."""

    def __init__(self, tokenizer, vocab_size: int, eos_ids: Sequence[int]):
        self.tokenizer, self.vocab_size, self.eos_ids = tokenizer, vocab_size, list(eos_ids)
        self._ll = None
        self._grammars: dict[StructuredOutputs, str] = {}
        self._lock = threading.RLock()  # a server checks requests in one thread and starts them in another

    def _ll_tokenizer(self):
        with self._lock:
            if self._ll is None:
                if self.tokenizer is None:
                    raise ConfigError("structured_outputs need the model's tokenizer; this model has none")
                try:
                    import llguidance.hf
                except ImportError:
                    raise ConfigError("structured_outputs need the llguidance package (pip install llguidance)") \
                        from None
                try:
                    self._ll = llguidance.hf.from_tokenizer(self.tokenizer, n_vocab=self.vocab_size,
                                                            eos_token=self.eos_ids)
                except (ValueError, TypeError) as exc:
                    raise ConfigError(f"structured_outputs: llguidance cannot read this model's tokenizer "
                                      f"({exc})") from None
            return self._ll

    def check(self, spec: StructuredOutputs) -> str:
        """The constraint's grammar; ConfigError (naming structured_outputs) where it is not a valid one."""
        with self._lock:
            grammar = self._grammars.get(spec)
        if grammar is not None:
            return grammar
        from llguidance import LLMatcher

        tokenizer = self._ll_tokenizer()
        try:
            grammar = grammar_text(spec)
        except ValueError as exc:
            raise ConfigError(f"structured_outputs {spec.kind}: {exc}") from None
        # outside the lock: a large schema's check took seconds, and the server's scheduler thread, starting
        # another constrained request meanwhile, waited on the lock with every stream of the batch
        failed, messages = LLMatcher.validate_grammar_with_warnings(grammar, tokenizer)
        if failed:
            raise ConfigError(f"structured_outputs {spec.kind}: {messages[0]}")
        probe = LLMatcher(tokenizer, grammar, log_level=0)
        probe.compute_logit_bias()  # (llguidance finds a grammar of no text only as it masks: [a&&b])
        try:
            _check_matcher(probe)
        except _DeadEnd as why:
            raise ConfigError(f"structured_outputs {spec.kind}: no text it allows can be written with this "
                              f"model's tokens ({why})") from None
        with self._lock:
            if spec not in self._grammars and len(self._grammars) >= RECENT_MASKS:
                self._grammars.pop(next(iter(self._grammars)))
            self._grammars[spec] = grammar
        return grammar

    def guide(self, spec: StructuredOutputs | None) -> Guide | None:
        """A new request's Guide (None without a constraint)."""
        if spec is None:
            return None
        from llguidance import LLMatcher

        return Guide(LLMatcher(self._ll_tokenizer(), self.check(spec), log_level=0), self.vocab_size, self.eos_ids)
