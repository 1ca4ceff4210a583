"""The OpenAI wire format: request bodies checked and turned into a `Job` (prompts, SamplingParams), and
the response objects and stream chunks of /v1/completions and /v1/chat/completions.

A parameter this server does not support gets a 400 that names it, unless it asks for what the server
does anyway (no tools for a completion, an empty suffix...), since clients send such defaults. Log-probabilities
(completions: `logprobs` k; chat: `logprobs` true, `top_logprobs` k; k up to MAX_LOGPROBS) are the
target's, in logprobs.py's objects. A completion's `echo` puts the prompt before the text (a string
prompt as given, token ids decoded) and, with `logprobs`, the prompt tokens' entries before the
generated ones (the target scores the prompt as it prefills); with `echo`, `max_tokens` may be 0, which
scores the prompt only (how evaluation harnesses ask for log-likelihoods); vLLM's `prompt_logprobs` k gives
the prompt's entries as vLLM's own field (logprobs.py `prompt_logprobs`; not streamed). Errors are
`ApiError`s, rendered as OpenAI's `{"error": {"message", "type", "param", "code"}}` with their status.

`n` > 1 asks for n choices of a prompt: n requests of the batch (`Job.choices`), choice i seeded with
seed + i when the request has a seed (outside mode auto, choice 0 is then what n = 1 gives), each
unseeded otherwise. Where a prefix store is on, the prompt's whole prefill blocks are prefilled once
(requests of a batch share the blocks they prefill, cache/prefixes.py); usage counts the prompt once and
the completion tokens of every choice. A completion's `prompt` may be a list of prompts (strings or
token-id lists, as evaluation harnesses send them): each gets its n choices, prompt after prompt in
`choices` (index = prompt x n + choice), each (outside mode auto) as it would be asked alone.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from ..config import ConfigError
from ..sampling_params import MAX_LOGPROBS, SamplingParams
from ..errors import UserError
from .logprobs import TokenTexts, choice_logprobs, echoed_logprobs, prompt_logprobs
from .constraints import ConstraintError, StreamedContent, ToolPlan, constraints
from .fields import (ApiError, checked_body, echoed_text, flag, integer, logprobs_field, number, prompts, seed, strings,
                     token_ids, whole_number)

# Fields taken as they are; the others are refused unless they hold what the server does anyway.
COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "n", "best_of", "stream",
          "stream_options", "user", "ignore_eos", "logprobs", "logit_bias", "presence_penalty", "frequency_penalty",
          "repetition_penalty", "stop_token_ids", "min_tokens", "response_format", "structured_outputs",
          "guided_json", "guided_regex", "guided_choice", "guided_grammar", "allowed_token_ids", "bad_words",
          "include_stop_str_in_output", "skip_special_tokens", "truncate_prompt_tokens", "return_token_ids",
          "prompt_logprobs"}
FIELDS = {"completion": COMMON | {"prompt", "echo"},
          "chat": COMMON | {"messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice",
                            "parallel_tool_calls", "add_generation_prompt", "continue_final_message",
                            "chat_template_kwargs", "documents"}}
HARMLESS = {"echo": (False,), "suffix": ("",), "tools": ([],), "tool_choice": ("none",)}
ADDS_SPECIAL_TOKENS = {"completion": True, "chat": False}  # vLLM's add_special_tokens, as this server has it
DEFAULT_MAX_TOKENS = {"completion": 16, "chat": None}  # OpenAI's: 16; for chat the server's default
MAX_CHOICES = 128  # OpenAI's limit on n
OPENAI_SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0,
                   "presence_penalty": 0.0, "frequency_penalty": 0.0}  # a model's generation_config may change some


@dataclass
class Job:
    """A checked request: what to generate and how to answer."""
    kind: str  # "completion" or "chat"
    prompts: list[list[int]]  # token ids; a chat request's one
    params: SamplingParams
    stream: bool
    include_usage: bool
    id: str
    created: int
    texts: TokenTexts | None = None  # token texts, for log-probabilities
    echoed: list[str] | None = None  # with `echo`: each prompt's text, which its choices' texts begin with
    tools: ToolPlan | None = None  # a chat request's tools and tool_choice
    continuous_usage: bool = False  # vLLM's stream_options.continuous_usage_stats: usage in every chunk
    return_token_ids: bool = False  # vLLM's: each choice's token ids, and its prompt's
    prompt_logprobs: int | None = None  # vLLM's: the prompt's entries, each with its k most likely

    @property
    def n(self) -> int:
        """Choices per prompt."""
        return self.params.n

    def choices(self) -> list[tuple[list[int], SamplingParams]]:
        """Each choice's prompt and sampling settings, prompt after prompt (SamplingParams.choices)."""
        per_prompt = self.params.choices()
        return [(ids, params) for ids in self.prompts for params in per_prompt]


def _integer_valued(x: float) -> int | float:
    """A JSON number as an int where it is a whole one (2.0 -> 2; 2.5 stays, for the setting to refuse)."""
    return int(x) if x == int(x) else x


def parse(kind: str, body: object, llm, model_name: str, chat_max_tokens: int = 1024) -> Job:
    """The body of a /v1/completions ('completion') or /v1/chat/completions ('chat') request, checked.
    A chat request without max_tokens gets up to `chat_max_tokens`, as far as the context allows (a whole
    context's worth would reserve its caches for every such request)."""
    harmless = {**HARMLESS, "add_special_tokens": (ADDS_SPECIAL_TOKENS[kind],)}
    body = checked_body(body, FIELDS[kind], model_name, harmless)
    n = integer(body, "n", 1, 1, MAX_CHOICES)
    try:
        tools, source, structured = constraints(body, getattr(llm.tokenizer, "chat_template", None), kind == "chat")
    except ConstraintError as exc:
        raise ApiError(400, str(exc), param=exc.param) from None
    ids_of, given = prompts(kind, body, llm, tools)
    truncate = integer(body, "truncate_prompt_tokens", None, float("-inf"))  # its range checked below
    if truncate is not None and truncate < 1 and truncate != -1:  # (one message for 0 and -2: ">= -1" took 0)
        raise ApiError(400, "'truncate_prompt_tokens' must be -1 (the model's length) or an integer >= 1",
                       param="truncate_prompt_tokens")
    if truncate is not None:  # vLLM's: each prompt's last tokens (echo gives their text)
        kept = [llm.truncated(i, g, truncate) for g, i in zip(given, ids_of)]
        given = [g if len(i) == len(k) else k for g, i, k in zip(given, ids_of, kept)]
        ids_of = kept
    echo = flag(body, "echo", False) if kind == "completion" else None  # (1 == True: `in (True, False)` took it)
    ids = max(ids_of, key=len)  # the longest is the one to check
    limit = llm.target.config.max_positions
    completion_limit = body.get("max_completion_tokens") is not None  # a null one leaves max_tokens in force
    max_tokens = body["max_completion_tokens"] if completion_limit else body.get("max_tokens", DEFAULT_MAX_TOKENS[kind])
    if max_tokens is None:  # as much as the longest prompt leaves, up to chat_max_tokens
        max_tokens = max(1, min(chat_max_tokens, limit - len(ids)))
    stop = body.get("stop")
    stop = () if stop is None else (stop,) if isinstance(stop, str) else stop  # ("", 0 or {}: refused below)
    least, name = (0 if echo else 1), ("max_completion_tokens" if completion_limit else "max_tokens")
    max_tokens = whole_number(max_tokens)
    if max_tokens is None or max_tokens < least:
        raise ApiError(400, f"'{name}' must be an integer >= {least}"
                            f"{' (0 only with echo)' if kind == 'completion' and not echo else ''}", param=name)
    # OpenAI's defaults, under the model's generation_config (vLLM's --generation-config auto), whose
    # max_new_tokens bounds every request
    defaults = {**OPENAI_SAMPLING, **llm.sampling_defaults}
    max_tokens = min(max_tokens, defaults.pop("max_tokens", max_tokens))
    sampling = {name: number(body, name, default) for name, default in defaults.items()}
    sampling["top_k"] = _integer_valued(sampling["top_k"])
    logprobs = logprobs_field(kind, body)
    prompt_k = integer(body, "prompt_logprobs", None, 0, MAX_LOGPROBS)
    if prompt_k is not None and flag(body, "stream", False):
        raise ApiError(400, "'prompt_logprobs' is not available when 'stream' is true (streamed chunks carry none)",
                       param="prompt_logprobs")
    scored = [k for k in (logprobs if echo else None, prompt_k) if k is not None]
    bias = {} if body.get("logit_bias") is None else body["logit_bias"]
    if not isinstance(bias, dict):
        raise ApiError(400, "'logit_bias' must map token ids to values from -100 to 100", param="logit_bias")
    try:
        if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
            raise ConfigError("stop must be a string or a list of non-empty strings")  # OpenAI's four: vLLM's any
        params = SamplingParams(max_tokens=max_tokens, **sampling, seed=seed(body, n), n=n,
                                best_of=integer(body, "best_of", None, n, n), stop=tuple(stop),
                                ignore_eos=flag(body, "ignore_eos", False),
                                logprobs=logprobs, prompt_logprobs=max(scored) if scored else None, logit_bias=bias,
                                stop_token_ids=token_ids(body, "stop_token_ids"),
                                min_tokens=integer(body, "min_tokens", 0, 0, max_tokens),
                                structured_outputs=structured,
                                allowed_token_ids=None if body.get("allowed_token_ids") is None else
                                token_ids(body, "allowed_token_ids"),
                                bad_words=strings(body, "bad_words"),
                                include_stop_str_in_output=flag(body, "include_stop_str_in_output", False),
                                skip_special_tokens=flag(body, "skip_special_tokens", True),
                                truncate_prompt_tokens=truncate)
        try:
            params = llm.prepare(params)
        except ConfigError as exc:
            if not str(exc).startswith("structured_outputs"):
                raise
            raise ConfigError(f"{source} is not a valid constraint: {exc}") from None
    except (UserError, TypeError, ValueError) as exc:  # their messages begin with the setting's name
        name = str(exc).split(" ", 1)[0]
        if name == "max_tokens" and completion_limit:
            name = "max_completion_tokens"
        raise ApiError(400, str(exc), param=name if name in FIELDS[kind] else None) from None
    if len(ids) > limit or (len(ids) == limit and max_tokens > 0):  # a whole context may be scored (echo)
        raise ApiError(400, f"the prompt ({len(ids)} tokens) fills the model's {limit} positions",
                       param="messages" if kind == "chat" else "prompt", code="context_length_exceeded")
    if len(ids) + max_tokens > limit:
        raise ApiError(400, f"the prompt ({len(ids)} tokens) and {name} ({max_tokens}) pass the model's "
                            f"{limit} positions", param=name, code="context_length_exceeded")
    options = {} if body.get("stream_options") is None else body["stream_options"]  # (false: read as none)
    if not isinstance(options, dict):
        raise ApiError(400, "'stream_options' must be an object", param="stream_options")
    if options and not flag(body, "stream", False):  # as OpenAI and vLLM refuse it
        raise ApiError(400, "'stream_options' needs 'stream': true", param="stream_options")
    include_usage = flag(options, "include_usage", False)
    continuous = flag(options, "continuous_usage_stats", False) and include_usage  # as vLLM takes it
    echoed = [echoed_text(p, tokens, llm) for p, tokens in zip(given, ids_of)] if echo else None
    tag = body.get("request_id") or uuid.uuid4().hex  # vLLM's: a client's request_id names the answer
    return Job(kind, ids_of, params, flag(body, "stream", False), include_usage,
               f"{'cmpl' if kind == 'completion' else 'chatcmpl'}-{tag}", int(time.time()),
               TokenTexts(llm.tokenizer), echoed, tools, continuous, flag(body, "return_token_ids", False), prompt_k)


def usage(job: Job, outputs: list) -> dict:
    """Token counts of a finished request (`outputs`: the RequestOutput of each choice, Job.choices' order):
    each prompt once, every choice's completion; cached tokens are each prompt's part whose prefill the
    prefix store saved every choice of it (the least over its choices: the others may restore what one of
    them prefilled)."""
    completion = sum(len(output.token_ids) for output in outputs)
    per_prompt = [outputs[i:i + job.n] for i in range(0, len(outputs), job.n)]
    cached = sum(min(out.metrics.cached_prompt_tokens for out in choices) for choices in per_prompt)
    prompt = sum(len(ids) for ids in job.prompts)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def response(job: Job, model: str, outputs: list) -> dict:
    """The whole answer of a request that does not stream (`outputs`: each choice's RequestOutput)."""
    choices = []
    for i, out in enumerate(outputs):
        prompt, choice = job.prompts[i // job.n], {"index": i}
        finish = out.finish_reason
        if job.kind == "chat" and job.tools is not None:
            choice["message"], finish = job.tools.message(out.text, finish)
        elif job.kind == "chat":
            choice["message"] = {"role": "assistant", "content": out.text}
        else:
            choice["text"] = out.text if job.echoed is None else job.echoed[i // job.n] + out.text
        choice["finish_reason"], choice["stop_reason"] = finish, out.stop_reason
        choice["logprobs"] = (choice_logprobs(job.kind, job.texts, out.logprobs, prompt) if job.echoed is None
                              else echoed_logprobs(job.texts, out, prompt, job.params.logprobs))
        if job.prompt_logprobs is not None and job.kind == "completion":  # (a chat answer's is the response's)
            choice["prompt_logprobs"] = prompt_logprobs(job.texts, prompt, out.prompt_logprobs, job.prompt_logprobs)
        if job.return_token_ids:
            choice["token_ids"] = list(out.token_ids)
            if job.kind == "completion":
                choice["prompt_token_ids"] = list(prompt)
        choices.append(choice)
    answer = {"id": job.id, "object": "text_completion" if job.kind == "completion" else "chat.completion",
              "created": job.created, "model": model, "choices": choices, "usage": usage(job, outputs)}
    if job.return_token_ids and job.kind == "chat":
        answer["prompt_token_ids"] = list(job.prompts[0])
    if job.prompt_logprobs is not None and job.kind == "chat":
        answer["prompt_logprobs"] = prompt_logprobs(job.texts, job.prompts[0], outputs[0].prompt_logprobs,
                                                    job.prompt_logprobs)
    return answer


def running_usage(job: Job, index: int, generated: int) -> dict:
    """The token counts of choice `index` so far, `generated` tokens into its answer: what each chunk
    carries under vLLM's stream_options.continuous_usage_stats."""
    prompt = len(job.prompts[index // job.n])
    return {"prompt_tokens": prompt, "completion_tokens": generated, "total_tokens": prompt + generated}


def chunk(job: Job, model: str, text: str | None, finish_reason: str | None = None, first: bool = False,
          index: int = 0, logprobs: dict | None = None, stop_reason: str | int | None = None,
          usage: dict | None = None, token_ids: list[int] = ()) -> dict:
    """One server-sent event of a stream: a piece of choice `index`'s text, or (text None) its end with
    its finish reason and stop reason (vLLM's). `first`: the choice's first event (a chat delta then
    carries the role; with return_token_ids, the prompt's ids); `logprobs`: the entries of the tokens it
    carries (logprobs.StreamedLogprobs); `usage`: its running_usage where the job asked for usage in
    every chunk; `token_ids`: with return_token_ids, the ids of the tokens it adds (joined over a choice's
    chunks: its output's, as vLLM's)."""
    if job.kind == "completion":
        choice = {"index": index, "text": text or "", "finish_reason": finish_reason, "logprobs": logprobs}
        obj = "text_completion"
    else:
        delta = {} if text is None else {"content": text}
        if first:
            delta = {"role": "assistant", **delta}
        choice = {"index": index, "delta": delta, "finish_reason": finish_reason, "logprobs": logprobs}
        obj = "chat.completion.chunk"
    if finish_reason is not None:
        choice["stop_reason"] = stop_reason
    out = {"id": job.id, "object": obj, "created": job.created, "model": model, "choices": [choice]}
    if job.return_token_ids:
        choice["token_ids"] = list(token_ids)
        if first:
            (choice if job.kind == "completion" else out)["prompt_token_ids"] = list(job.prompts[index // job.n])
    return {**out, "usage": usage} if job.include_usage else out  # OpenAI's: null but in the last chunk


def held_chunks(job: Job, model: str, output, index: int, first: bool, streamed: StreamedContent,
                logprobs: dict | None = None, usage: dict | None = None) -> list[dict]:
    """The end of a streamed answer that may hold tool calls (Job.tools.may_call; `streamed`: the content
    sent so far): one delta with its calls and the content not yet sent, and `logprobs`, then its end."""
    message, finish = job.tools.message(output.text, output.finish_reason)
    delta = streamed.rest(message)
    if not first:
        delta.pop("role")
    head = chunk(job, model, None, first=first, index=index, logprobs=logprobs, usage=usage)
    head["choices"][0]["delta"] = delta
    return [head, chunk(job, model, None, finish, index=index, stop_reason=output.stop_reason, usage=usage,
                        token_ids=output.token_ids)]


def usage_chunk(job: Job, model: str, outputs: list) -> dict:
    obj = "text_completion" if job.kind == "completion" else "chat.completion.chunk"
    return {"id": job.id, "object": obj, "created": job.created, "model": model, "choices": [],
            "usage": usage(job, outputs)}
