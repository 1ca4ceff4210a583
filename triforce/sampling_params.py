"""A request's settings, frozen and validated: SamplingParams (vLLM's) and its StructuredOutputs."""
from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

from .config import ConfigError, is_integer, is_number, shown

log = logging.getLogger("triforce")
_RAISED: set[float] = set()  # temperatures raised to LOWEST_SAMPLED and said so (once each: a server's requests)
_SAID_GREEDY_N: list[int] = []  # whether n > 1 at temperature 0 was said (once)

LOWEST_SAMPLED = 1e-2  # a request's temperature above 0 and below this is raised to it (vLLM's _MAX_TEMP)
# The highest temperature taken: logits of a few tens divided by it differ by less than float32 resolves
# (uniform over what the rules allow); past float32's range it was infinite, and a rule's -inf over it NaN.
MAX_TEMPERATURE = 1e6
SEEDS = (-2**63, 2**64 - 1)  # what a torch.Generator takes (on a CPU, it uses the seed modulo 2**32)
MAX_N = 4096  # outputs of one prompt (SamplingParams.n): more is a mistake, not a batch


def _token_id(token) -> int:
    """A token id: an integer, or its decimal string (logit_bias's JSON keys); ValueError otherwise."""
    if is_integer(token):  # (numpy's too: np.where's ids)
        return int(token)
    if isinstance(token, str) and token.strip().lstrip("-").isdecimal():
        return int(token)
    raise ValueError(f"not a token id: {shown(token)}")


def _bias_value(value) -> float:
    """A logit bias: a number (not a bool, not a string: float() would take True and "5"); ValueError otherwise."""
    if not is_number(value):
        raise ValueError(value)
    return float(value)


def _token_ids(value, name: str) -> tuple[int, ...]:
    """A list of token ids (integers >= 0, or their strings), sorted without repeats; ConfigError naming
    `name` otherwise."""
    try:
        if isinstance(value, str | bytes):
            raise TypeError("a string is not a list of token ids")
        ids = tuple(sorted({_token_id(t) for t in value}))
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a list of token ids") from None
    if any(t < 0 for t in ids):
        raise ConfigError(f"{name} must be token ids >= 0")
    return ids


def _token_ids_in_order(value) -> tuple[int, ...]:
    """A non-empty sequence of token ids >= 0, in its order; ValueError otherwise."""
    if isinstance(value, str | bytes):
        raise TypeError("a string is not a list of token ids")
    ids = tuple(_token_id(t) for t in value)
    if not ids or min(ids) < 0:
        raise ValueError("need token ids >= 0")
    return ids


MAX_LOGPROBS = 20  # most likely tokens listed beside each token's log-probability (vLLM's default bound)


@dataclass(frozen=True)
class StructuredOutputs:
    """A constraint on the generated text (vLLM's StructuredOutputsParams): exactly one of a JSON schema
    (`json`: a dict, or its JSON text), any JSON object (`json_object`), a regular expression (`regex`,
    Rust's syntax), one of some strings (`choice`) or a Lark or GBNF grammar (`grammar`; llama.cpp's `root ::=`
    form, which vLLM's examples write). Every tier's rows keep
    only the tokens that the constraint allows after their history (speculation/guided.py), and the
    output ends where the constrained text is complete (end-of-sequence, even with ignore_eos)."""
    json: dict | str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None

    def __post_init__(self):
        import json

        given = [name for name in ("json", "regex", "choice", "grammar") if getattr(self, name) is not None]
        given += ["json_object"] if self.json_object else []
        if len(given) != 1:
            raise ConfigError("structured_outputs takes exactly one of json, json_object, regex, choice and grammar "
                              f"(got {', '.join(given) or 'none'})")
        if self.json is not None:
            try:
                schema = json.loads(self.json) if isinstance(self.json, str) else self.json
                text = json.dumps(schema)  # keys kept in order: properties are generated in the schema's
            except (TypeError, ValueError, RecursionError) as exc:  # RecursionError: nested past Python's limit
                raise ConfigError(f"structured_outputs json must be a JSON schema (an object): "
                                  f"{str(exc)[:200] or type(exc).__name__}") from None
            if not isinstance(schema, dict):
                raise ConfigError("structured_outputs json must be a JSON schema (an object)")
            object.__setattr__(self, "json", text)  # a string: the params stay hashable
        if self.choice is not None:
            if isinstance(self.choice, str) or not isinstance(self.choice, Sequence) or \
                    not all(isinstance(c, str) and c for c in self.choice) or not self.choice:
                raise ConfigError("structured_outputs choice must be a non-empty list of non-empty strings")
            object.__setattr__(self, "choice", tuple(self.choice))
        for name in ("regex", "grammar"):
            if getattr(self, name) is not None and not (isinstance(getattr(self, name), str) and getattr(self, name)):
                raise ConfigError(f"structured_outputs {name} must be a non-empty string")

    @property
    def kind(self) -> str:
        """Which constraint this is: json, json_object, regex, choice or grammar."""
        if self.json_object:
            return "json_object"
        return next(n for n in ("json", "regex", "choice", "grammar") if getattr(self, n) is not None)


# SamplingParams fields whose default vLLM writes None: None means this default
VLLM_NONES = {"top_k": 0, "stop": (), "stop_token_ids": (), "logit_bias": (), "min_tokens": 0, "bad_words": (),
              "bad_words_ids": ()}


StructuredOutputsParams = StructuredOutputs  # vLLM's name for it


@dataclass(frozen=True)
class SamplingParams:
    """What to sample and when to stop. temperature 0 is greedy."""
    max_tokens: int | None = 128  # None: as many as the model's positions leave (vLLM's)
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 disables top-k
    min_p: float = 0.0  # drops tokens less likely than min_p times the most likely one (vLLM's; 0 is off)
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    # None: no log-probabilities; k (0 to MAX_LOGPROBS): each generated token's, and the k most likely
    # tokens' there (the target's, before temperature, top-k and top-p: logprobs.py)
    logprobs: int | None = None
    # the same for every prompt token but the first (None there), from the target's prefill (vLLM's name)
    prompt_logprobs: int | None = None
    # (token, value) pairs added to every tier's logits before the rest (OpenAI's logit_bias; a dict is
    # taken too); values from -100 (never) to 100 (always, in practice)
    logit_bias: tuple[tuple[int, float], ...] = ()
    # OpenAI's presence and frequency penalties (-2 to 2) and vLLM's repetition penalty (0.01 to 100; 1 is off), on
    # every tier's rows, each by the tokens before it, after logit_bias as in vLLM (speculation/rules.py)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    # token ids that end generation besides end-of-sequence (even with ignore_eos), kept as its last token
    stop_token_ids: tuple[int, ...] = ()
    # no end-of-sequence (even with ignore_eos), stop_token_ids or stop string before this many tokens (vLLM's)
    min_tokens: int = 0
    # a JSON schema, regular expression, choice or grammar the text must follow (a dict of those fields too)
    structured_outputs: StructuredOutputs | None = None
    # the only token ids that may be generated, at every tier (vLLM's; None: any); with a structured output,
    # the end-of-sequence that ends its complete text too (LLM.prepare adds it)
    allowed_token_ids: tuple[int, ...] | None = None
    # words never generated (vLLM's): LLM.prepare adds each one's tokens, alone and after a space, to
    # bad_words_ids, token sequences (transformers' name) whose last token is banned at every tier where
    # the generated tokens before it end with the rest (speculation/rules.py)
    bad_words: tuple[str, ...] = ()
    bad_words_ids: tuple[tuple[int, ...], ...] = ()
    # keep only the prompt's last this many tokens (vLLM's; None: all of it)
    truncate_prompt_tokens: int | None = None
    include_stop_str_in_output: bool = False  # the text keeps the stop string, or the stop token's text
    skip_special_tokens: bool = True  # the text leaves out special tokens' text
    # outputs per prompt (vLLM's): `choices` runs each as its own request, output i seeded with seed + i
    n: int = 1
    best_of: int | None = None  # vLLM's: only None or n (no choices ranked and dropped here)
    detokenize: bool = True  # False: no text (vLLM's; the token ids and log-probabilities alone), no stop strings

    def __post_init__(self):
        for name, unset in VLLM_NONES.items():  # vLLM's defaults of None, as not given
            if getattr(self, name) is None:
                object.__setattr__(self, name, unset)
        bias = self.logit_bias.items() if isinstance(self.logit_bias, dict) else self.logit_bias
        try:
            bias = tuple(sorted((_token_id(token), _bias_value(value)) for token, value in bias))
        except (TypeError, ValueError):
            raise ConfigError("logit_bias must map token ids (integers, or their strings) to numbers") from None
        if any(token < 0 or not -100 <= value <= 100 for token, value in bias) or len({t for t, _ in bias}) < len(bias):
            raise ConfigError("logit_bias takes token ids >= 0, once each, with values from -100 to 100")
        object.__setattr__(self, "logit_bias", bias)
        object.__setattr__(self, "stop_token_ids", _token_ids(self.stop_token_ids, "stop_token_ids"))
        self._check_banned()
        stop = (self.stop,) if isinstance(self.stop, str) else self.stop
        if isinstance(stop, bytes) or not isinstance(stop, Sequence) or \
                not all(isinstance(s, str) for s in stop):  # a number or bytes failed deep in the run
            raise ConfigError(f"stop must be a string or a list of strings (got {shown(self.stop)})")
        object.__setattr__(self, "stop", tuple(stop))
        if self.max_tokens is not None and (not is_integer(self.max_tokens) or self.max_tokens < 0):
            raise ConfigError(f"max_tokens must be an integer >= 0 or None (got {shown(self.max_tokens)}; 0 prefills "
                              f"only: a prompt's log-probabilities with prompt_logprobs, or its KV for the prefix "
                              f"store)")
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
            if not is_number(getattr(self, name)):
                raise ConfigError(f"{name} must be a finite number (got {shown(getattr(self, name))})")
        if not 0 <= self.temperature <= MAX_TEMPERATURE:
            raise ConfigError(f"temperature must be from 0 to {MAX_TEMPERATURE:g} (got {self.temperature})")
        if 0 < self.temperature < LOWEST_SAMPLED:  # as vLLM's SamplingParams: sampled, at the lowest it takes
            if self.temperature not in _RAISED:
                _RAISED.add(self.temperature)
                log.warning("temperature %g is below %g, where logits divided by it overflow: raised to %g (0 "
                            "is greedy)", self.temperature, LOWEST_SAMPLED, LOWEST_SAMPLED)
            object.__setattr__(self, "temperature", LOWEST_SAMPLED)
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1] (got {self.top_p})")
        if not is_integer(self.top_k) or self.top_k < -1:
            raise ConfigError(f"top_k must be an integer >= 1, or 0 or -1 for off (got {shown(self.top_k)})")
        if self.top_k == -1:  # vLLM's other spelling of off
            object.__setattr__(self, "top_k", 0)
        if not is_integer(self.n) or not 1 <= self.n <= MAX_N:
            raise ConfigError(f"n must be an integer from 1 to {MAX_N} (got {shown(self.n)})")
        object.__setattr__(self, "n", int(self.n))  # numpy's as Python's, before the seed range below
        if self.best_of not in (None, self.n):
            raise ConfigError(f"best_of must be None or n ({self.n}): outputs are not ranked and dropped here")
        if self.n > 1 and self.temperature == 0 and not _SAID_GREEDY_N:  # (once: a server's requests)
            _SAID_GREEDY_N.append(self.n)
            log.warning("n = %d at temperature 0 gives %d outputs alike: greedy is SamplingParams' default here "
                        "(vLLM's default temperature is 1.0); give a temperature to sample them", self.n, self.n)
        if not isinstance(self.detokenize, bool):
            raise ConfigError("detokenize must be true or false")
        if not self.detokenize and self.stop:
            raise ConfigError("stop strings need detokenize (the text is where they are found)")
        if is_integer(self.seed) and self.seed == -1:  # vLLM's and llama.cpp's spelling of unseeded (random)
            object.__setattr__(self, "seed", None)
        last = SEEDS[1] - (self.n - 1)  # output i takes seed + i
        if self.seed is not None and (not is_integer(self.seed) or not SEEDS[0] <= self.seed <= last):
            raise ConfigError(f"seed must be None or an integer from {SEEDS[0]} to {last} (got {shown(self.seed)}"
                              f"{'; output i takes seed + i' if self.n > 1 else ''})")
        if not 0 <= self.min_p <= 1:
            raise ConfigError(f"min_p must be from 0 to 1 (got {self.min_p})")
        if any(not s for s in self.stop):
            raise ConfigError("stop strings must be non-empty")
        most = self.min_tokens if self.max_tokens is None else self.max_tokens  # None: as many as there are
        if not is_integer(self.min_tokens) or not 0 <= self.min_tokens <= most:
            raise ConfigError(f"min_tokens must be an integer from 0 to max_tokens ({self.max_tokens}; got "
                              f"{shown(self.min_tokens)})")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise ConfigError(f"{name} must be from -2 to 2 (got {getattr(self, name)})")
        if not 0.01 <= self.repetition_penalty <= 100:  # 1e-40 divided logits into infinities, rows into NaN
            raise ConfigError(f"repetition_penalty must be from 0.01 to 100 (1 is off; got "
                              f"{self.repetition_penalty})")
        if isinstance(self.structured_outputs, dict):
            unknown = set(self.structured_outputs) - {f.name for f in fields(StructuredOutputs)}
            if unknown:
                raise ConfigError(f"structured_outputs takes {', '.join(f.name for f in fields(StructuredOutputs))}"
                                  f" (got {', '.join(sorted(map(str, unknown)))})")
            object.__setattr__(self, "structured_outputs", StructuredOutputs(**self.structured_outputs))
        if self.structured_outputs is not None and not isinstance(self.structured_outputs, StructuredOutputs):
            raise ConfigError("structured_outputs must be a StructuredOutputs (or a dict of its fields)")
        if self.structured_outputs is not None and self.min_tokens:
            raise ConfigError("min_tokens cannot be combined with structured_outputs: the constraint decides where "
                              "the text may end")
        k = self.truncate_prompt_tokens
        if k is not None and (not is_integer(k) or (k < 1 and k != -1)):
            raise ConfigError(f"truncate_prompt_tokens must be None, -1 (the model's length) or an integer >= 1 "
                              f"(got {shown(k)})")
        for name in ("include_stop_str_in_output", "skip_special_tokens", "ignore_eos"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false")
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(self, name)
            if k is not None and (not is_integer(k) or not 0 <= k <= MAX_LOGPROBS):
                raise ConfigError(f"{name} must be None or an integer from 0 to {MAX_LOGPROBS} (got {shown(k)})")
        for name, kind in (("max_tokens", int), ("top_k", int), ("seed", int), ("min_tokens", int),
                           ("truncate_prompt_tokens", int), ("logprobs", int), ("prompt_logprobs", int),
                           ("temperature", float), ("top_p", float), ("min_p", float), ("presence_penalty", float),
                           ("frequency_penalty", float), ("repetition_penalty", float)):
            if getattr(self, name) is not None:  # checked above; numpy's numbers as Python's
                object.__setattr__(self, name, kind(getattr(self, name)))

    def _check_banned(self) -> None:
        """allowed_token_ids, bad_words and bad_words_ids, normalised and checked."""
        if self.allowed_token_ids is not None:
            allowed = _token_ids(self.allowed_token_ids, "allowed_token_ids")
            if not allowed:
                raise ConfigError("allowed_token_ids must name at least one token (unset, it allows all)")
            object.__setattr__(self, "allowed_token_ids", allowed)
        words = (self.bad_words,) if isinstance(self.bad_words, str) else self.bad_words
        if not isinstance(words, Sequence) or not all(isinstance(w, str) and w.strip() for w in words):
            raise ConfigError("bad_words must be a list of words (non-blank strings)")
        object.__setattr__(self, "bad_words", tuple(words))
        try:
            sequences = tuple(sorted({_token_ids_in_order(s) for s in self.bad_words_ids}))
        except (TypeError, ValueError):
            raise ConfigError("bad_words_ids must be a list of non-empty lists of token ids >= 0") from None
        object.__setattr__(self, "bad_words_ids", sequences)
        banned = {s[0] for s in sequences if len(s) == 1}
        if self.allowed_token_ids is not None and banned.issuperset(self.allowed_token_ids):
            raise ConfigError("bad_words_ids ban every token of allowed_token_ids")

    def clone(self) -> SamplingParams:
        """vLLM's: a copy (a frozen one here: `dataclasses.replace(params, ...)` changes fields)."""
        return replace(self)

    def choices(self) -> list[SamplingParams]:
        """The n requests of one prompt: each with n = 1, output i with seed + i when seeded (so that output 0
        is what n = 1 gives), unseeded otherwise."""
        out = [replace(self, n=1, best_of=None, seed=None) for _ in range(self.n)]
        for i, one in enumerate(out if self.seed is not None else ()):  # (set past the check: a seed + i of -1
            object.__setattr__(one, "seed", self.seed + i)  # is a seed here, not -1's unseeded)
        return out

    @property
    def greedy(self) -> bool:
        """Temperature 0 (any other below LOWEST_SAMPLED was raised to it, as vLLM does)."""
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        """Whether any of the presence, frequency and repetition penalties is on."""
        return (self.presence_penalty, self.frequency_penalty, self.repetition_penalty) != (0, 0, 1)

    def end_ids(self, eos_ids: Sequence[int]) -> frozenset[int]:
        """The tokens that end generation: stop_token_ids, and the model's end-of-sequence ids unless
        ignore_eos without structured_outputs (whose constraint allows end-of-sequence only where its text is
        complete). (min_tokens bans all of them, end-of-sequence even where ignored, as vLLM does.)"""
        eos = frozenset() if self.ignore_eos and self.structured_outputs is None else frozenset(eos_ids)
        return frozenset(self.stop_token_ids) | eos

