"""A request body's fields, read and checked: each bad one an `ApiError` (OpenAI's error object, with its
status) that names it."""
from __future__ import annotations

import json
import re

from ..chat import conversation_ids
from ..config import is_number
from ..errors import UserError
from ..sampling_params import MAX_LOGPROBS, SEEDS
from .constraints import ToolPlan

MAX_PROMPTS = 2048  # prompts of one completion request


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


MAX_BODY_MIB = 100  # the largest request body a server reads (--max-request-mb): 2,048 prompts of 8K tokens'
# text are about 64 MiB
MAX_REQUEST_MIB = 2**20  # --max-request-mb's most: a TiB (past it, its bytes overflowed an int)


def request_json(raw: bytes | str) -> object:
    """A request body (a server's, or a batch line's) read as strict JSON, or ApiError(400): not JSON, not
    UTF-8, an integer past Python's 4,300 digits or arrays nested past its recursion limit (json.loads raises
    other errors than for bad syntax), NaN or Infinity (Python's extensions to JSON) or a number that reads
    as infinity (1e999: a Response or a batch result that echoes one is no JSON either), or a lone surrogate
    escape (JSON's "\\ud83d" alone parses into
    a string that is no text)."""
    def no_constant(name: str):
        raise ValueError(f"{name} is not a JSON number")

    try:
        body = json.loads(raw, parse_constant=no_constant)
    except (ValueError, RecursionError) as exc:
        detail = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise ApiError(400, f"the request body is not valid JSON ({detail})") from None
    try:
        json.dumps(body, ensure_ascii=False, allow_nan=False).encode()
    except UnicodeEncodeError:
        raise ApiError(400, "the request body holds a lone surrogate escape (half of a UTF-16 pair), which is "
                            "not text") from None
    except ValueError:  # a number past a float's range (1e999 reads as infinity): an answer echoing it is no JSON
        raise ApiError(400, "the request body holds a number past a float's range (read as infinity)") from None
    return body


# What OpenAI's and vLLM's clients send at their defaults, asking for what this server does anyway: a field
# -> the values taken (a type: any value of it, for fields that tag a request and change no answer). A
# field of null is taken as not given, whatever its name.
CLIENT_DEFAULTS = {"store": (False,), "service_tier": ("auto", "default"), "modalities": (["text"],),
                   "metadata": dict, "request_id": str, "prompt_cache_key": str, "safety_identifier": str,
                   "use_beam_search": (False,), "length_penalty": (1.0,), "priority": (0,),
                   "return_tokens_as_token_ids": (False,),
                   # (a slow tokenizer's option; fast ones, which this server's are, and vLLM's fast
                   # detokenizer, join special tokens as their decoder does, either way)
                   "spaces_between_special_tokens": (True, False)}


def checked_body(body: object, allowed: set[str], model_name: str, harmless: dict | None = None) -> dict:
    """`body` where it is a JSON object of `allowed` fields, or fields that hold what `harmless` or
    CLIENT_DEFAULTS map them to (what the server does anyway), that names this server's model or none;
    without the other fields of null (not given; an `allowed` field's null is its own, as a completion's
    "max_tokens": null, which asks for as many as the context allows)."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    body = {name: value for name, value in body.items() if value is not None or name in allowed}
    harmless = {**CLIENT_DEFAULTS, **(harmless or {})}
    for name, value in body.items():
        if name not in allowed and not _taken(value, harmless.get(name, ())):
            hint = "; the server's --chat-template sets one for every request" if name == "chat_template" else ""
            raise ApiError(400, f"'{name}' is not supported by this server{hint}", param=name,
                           code="unsupported_parameter")
    model = body.get("model")
    if model not in (None, "") and model != model_name:  # (an empty name is the served model's, as to vLLM)
        raise ApiError(404, f"the model '{model}' does not exist; this server serves '{model_name}'",
                       param="model", code="model_not_found")
    if body.get("user") is not None and not isinstance(body["user"], str):  # (a tag, OpenAI's and vLLM's string)
        raise ApiError(400, "'user' must be a string", param="user")
    return body


def _taken(value, harmless: tuple | type) -> bool:
    if isinstance(harmless, type):
        return isinstance(value, harmless)
    return any(value == v and isinstance(value, bool) == isinstance(v, bool) for v in harmless)  # 0 is not false


def logprobs_field(kind: str, body: dict) -> int | None:
    """SamplingParams.logprobs: how many likely tokens to list beside each generated one; None: no entries."""
    def count(name: str) -> int:
        value = 0 if body.get(name) is None else whole_number(body[name])  # (false was read as 0)
        if value is None or not 0 <= value <= MAX_LOGPROBS:
            raise ApiError(400, f"'{name}' must be an integer from 0 to {MAX_LOGPROBS}", param=name)
        return value

    if kind == "completion":
        given = body.get("logprobs")
        return None if given is None or given is False else count("logprobs")
    wanted = flag(body, "logprobs", False)  # (a bool: 1 == True was taken for one)
    if not wanted:
        given = body.get("top_logprobs")
        if given is not None and (given != 0 or isinstance(given, bool)):  # (0 asks for none: vLLM takes it)
            raise ApiError(400, "'top_logprobs' needs 'logprobs': true", param="top_logprobs")
        return None
    return count("top_logprobs")


def token_ids(body: dict, name: str) -> tuple[int, ...]:
    value = () if body.get(name) is None else body[name]
    if not isinstance(value, list | tuple) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise ApiError(400, f"'{name}' must be a list of token ids", param=name)
    return tuple(value)


def strings(body: dict, name: str) -> tuple[str, ...]:
    value = () if body.get(name) is None else body[name]
    if not isinstance(value, list | tuple) or not all(isinstance(w, str) for w in value):
        raise ApiError(400, f"'{name}' must be a list of strings", param=name)
    return tuple(value)


def flag(body: dict, name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ApiError(400, f"'{name}' must be true or false", param=name)
    return value


def whole_number(value) -> int | None:
    """`value` as the integer vLLM's request models (pydantic, lax) take it for: an int, a float without a
    fraction (256.0, as pandas writes a column of integers that has a gap), a string of digits; else None
    (a bool too: true is no count)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"[+-]?\d{1,30}", value.strip()):
        return int(value)
    return None


def integer(body: dict, name: str, default: int | None, low: int, high: int | None = None) -> int | None:
    """An integer field from `low` (to `high`), worded for JSON (SamplingParams' own messages are Python's)."""
    if body.get(name) is None:
        return default
    value = whole_number(body[name])
    if value is None or value < low or (high is not None and value > high):
        bound = f"an integer >= {low}" if high is None else str(low) if high == low else \
            f"an integer from {low} to {high}"
        raise ApiError(400, f"'{name}' must be {bound}", param=name)
    return value


def seed(body: dict, n: int) -> int | None:
    """A request's seed, or None; choice i of n takes seed + i."""
    return integer(body, "seed", None, SEEDS[0], SEEDS[1] - (n - 1))


def number(body: dict, name: str, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if not is_number(value):  # JSON's Infinity, 1e999, and 1 with 400 zeros (an int past a float's range)
        raise ApiError(400, f"'{name}' must be a finite number", param=name)
    return float(value)


def echoed_text(prompt: str | list[int], ids: list[int], llm) -> str:
    """What `echo` puts before a prompt's text: the prompt as given, or its token ids decoded with their
    special tokens, as vLLM's echo keeps them (the echoed log-probabilities name them, and their text
    offsets count them: without them every offset pointed past its token), and without the clean-up of
    spaces (vLLM applies the tokenizer's default here; without it the text agrees with those offsets, and
    with the generated text's decoding)."""
    if isinstance(prompt, str):
        return prompt
    return "" if llm.tokenizer is None else llm.tokenizer.decode(ids, skip_special_tokens=False,
                                                                 clean_up_tokenization_spaces=False)


def template_kwargs(body: dict):
    """A chat's chat_template_kwargs, with its `documents` (vLLM's field: a list of objects, for RAG templates)."""
    kwargs, documents = body.get("chat_template_kwargs"), body.get("documents")
    if documents is None:
        return kwargs
    if not (isinstance(documents, list) and all(isinstance(d, dict) for d in documents)):
        raise ApiError(400, "'documents' must be a list of objects", param="documents")
    if not isinstance(kwargs, (dict, type(None))):
        return kwargs  # (refused as it is)
    return {"documents": documents, **(kwargs or {})}  # (vLLM's: the kwargs' own win)


def prompts(kind: str, body: dict, llm, tools: ToolPlan | None = None) -> tuple[list[list[int]], list]:
    """The token ids of each prompt, and each as given."""
    if kind == "chat":
        try:
            prompt = conversation_ids(llm.tokenizer, body.get("messages"), body.get("tools") if tools else None,
                                      flag(body, "add_generation_prompt", True),
                                      flag(body, "continue_final_message", False), template_kwargs(body))
        except UserError as exc:
            param = next((name for name in ("continue_final_message", "chat_template_kwargs")
                          if str(exc).startswith(f"'{name}'")), "messages")
            raise ApiError(400, str(exc), param=param) from None
        prompts = [prompt]
    else:
        prompt = body.get("prompt")
        prompts = [prompt] if one_prompt(prompt) else prompt
        if not (isinstance(prompts, list) and prompts and all(one_prompt(p) for p in prompts)):
            raise ApiError(400, "'prompt' must be a string, a list of token ids, or a list of those (several "
                                "prompts)", param="prompt")
        if len(prompts) > MAX_PROMPTS:
            raise ApiError(400, f"{len(prompts)} prompts in one request; at most {MAX_PROMPTS}", param="prompt")
    try:
        return [llm.encode(prompt) for prompt in prompts], prompts
    except Exception as exc:  # UserError: empty, ids outside the vocabulary, no tokenizer
        raise ApiError(400, str(exc), param="messages" if kind == "chat" else "prompt") from None


def one_prompt(prompt) -> bool:
    """A string or a list of token ids (the encoder refuses an empty one)."""
    return isinstance(prompt, str) or (isinstance(prompt, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in prompt))
