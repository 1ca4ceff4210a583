"""One request: its engine (its own caches), detokenizer and output, for LLM.generate and a server's
continuous batch alike (`Request.run` is its generation, for a SequenceBatch)."""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .sampling_params import SamplingParams
from .coordinator.batchmates import Batchmates
from .coordinator.hierarchy import build_engine, graph_sizes, speculation_slack
from .coordinator.metrics import RequestMetrics
from .coordinator.remote import RemoteVerifier
from .detokenize import IncrementalDetokenizer
from .logprobs import TokenLogprobs, TokenTexts, name_tokens

if TYPE_CHECKING:
    from .api import LLM


@dataclass
class CompletionOutput:
    """One generated sequence of a prompt: vLLM's CompletionOutput (its fields in its order), and its metrics."""
    index: int  # which of the prompt's SamplingParams.n outputs
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None  # the sum of the token ids' log-probabilities (None unless logprobs asked)
    logprobs: list[TokenLogprobs] | None  # one per token id, when SamplingParams.logprobs asked
    # "stop" (EOS, a stop token id or a stop string), "length", or "abort" (cancelled first: a server's client gone)
    finish_reason: str | None = None
    stop_reason: str | int | None = None  # the stop string or stop token id that ended it (vLLM's; EOS: None)
    metrics: RequestMetrics | None = None  # this sequence's generation (ours)

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """A prompt's outputs, as vLLM's RequestOutput: `outputs` holds SamplingParams.n of them. `text`,
    `token_ids`, `finish_reason`, `stop_reason`, `logprobs` and `metrics` read the first's (n = 1: the only one)."""
    request_id: str
    prompt: str | None  # the prompt as given, when it was a string; a chat's as its template laid it out
    prompt_token_ids: list[int]
    prompt_logprobs: list[TokenLogprobs | None] | None  # one per prompt token (None first), when asked
    outputs: list[CompletionOutput]
    finished: bool = True
    num_cached_tokens: int = 0  # prompt tokens restored from the prefix store, not prefilled

    text = property(lambda self: self.outputs[0].text)
    token_ids = property(lambda self: self.outputs[0].token_ids)
    finish_reason = property(lambda self: self.outputs[0].finish_reason)
    stop_reason = property(lambda self: self.outputs[0].stop_reason)
    logprobs = property(lambda self: self.outputs[0].logprobs)
    metrics = property(lambda self: self.outputs[0].metrics)


class Request:
    """One prompt's engine (its own caches), detokenizer and output. `run()` is its generation, for a
    `SequenceBatch` (LLM.generate's, or a server's that requests join and leave); `cancel()` ends it after
    the round or prefill chunk in progress."""

    def __init__(self, llm: LLM, ids: list[int], params: SamplingParams, stream: Callable[[str], None] | None,
                 batchmates: Batchmates | None = None):
        self.llm, self.ids, self.params, self.stream = llm, ids, params, stream
        verifier = None
        if llm.workers is not None:
            capacity = len(ids) + params.max_tokens + speculation_slack(llm.config)
            verifier = RemoteVerifier(llm.workers, llm.target, capacity,
                                      graph_sizes(llm.config, llm.workers.prefill_chunk))
            w = llm.workers
            self.sent = (w.messages, w.bytes, w.wait_s, w.bulk_bytes)
        try:
            self.engine = build_engine(llm.config, llm.target, llm.draft_model, len(ids) + params.max_tokens, verifier,
                                       batchmates, llm.prefixes, llm.retrieval_model)
            self.verifier = verifier
            self.ends = params.end_ids(llm.eos_ids())  # the tokens that end it, once rather than every round
            self.main_eos = llm.main_eos_id()
            self.guide = llm.grammars.guide(params.structured_outputs)
            self.detok = (None if llm.tokenizer is None or not params.detokenize
                          else IncrementalDetokenizer(llm.tokenizer, params.stop, params.min_tokens, ids,
                                                     params.include_stop_str_in_output, params.skip_special_tokens))
        except BaseException:  # no Request to close: the group's sequence, started above, would hold its
            # cache for good (a coordinator out of memory for the draft's caches, say)
            if verifier is not None:
                with contextlib.suppress(Exception):
                    verifier.close()
            raise
        self.cancelled = False
        self._logprobs_taken = self._ids_taken = 0
        self._prompt_logprobs: list[TokenLogprobs | None] | None = None  # kept by `close`

    @property
    def prompt_logprobs(self) -> list[TokenLogprobs | None] | None:
        """The prompt tokens' entries (complete once the prompt is prefilled; None: not asked for)."""
        if self.params.prompt_logprobs is None:
            return None
        engine = self.engine  # once: the scheduler's thread may close the request (engine None) meanwhile
        return self._prompt_logprobs if engine is None else engine.prompt_logprobs

    def new_token_ids(self) -> list[int]:
        """The ids of the tokens a streamed output keeps (up to the one that completed a stop string; a stream
        has the tokenizer's text) since the last call: a chunk's."""
        new = self.detok.kept_ids(self._ids_taken)
        self._ids_taken += len(new)
        return new

    def new_logprobs(self) -> list[TokenLogprobs] | None:
        """The log-probability entries of the tokens generated since the last call, up to the one that
        completed a stop string (None: not asked for)."""
        if self.params.logprobs is None:
            return None
        end = len(self.engine.logprobs) if self.detok is None else self.detok.tokens_through_stop()
        new = self.engine.logprobs[self._logprobs_taken:end]
        self._logprobs_taken += len(new)
        return new

    def run(self, show_progress: bool = False):
        return self.engine.run(self.ids, self.params, self.llm.eos_ids(), self.on_tokens, show_progress,
                               lambda: self.cancelled, self.guide)

    def cancel(self) -> None:
        self.cancelled = True

    def close(self) -> None:
        """The request is over (also when it failed): a worker group frees its sequence, and its caches go
        now, with its engine, as does its stream callback. A streamed request in a server is in a reference
        cycle while it runs (its callback names the server's ticket that holds it), which kept its caches
        until Python's cyclic collector ran, rarely in a server's large heap: a 75-minute soak held up to 2
        GB of finished requests' caches (docs/serving.md, Memory over hours). The prompt's log-probabilities
        stay readable."""
        try:
            if self.verifier is not None:
                self.verifier.close()
        finally:  # the caches go even where the worker group could not end the sequence
            if self.engine is not None:
                self._prompt_logprobs = self.prompt_logprobs
                self.engine = self.verifier = None
            self.stream = None  # called no more: `output`, before this, streamed the last piece

    def on_tokens(self, new: list[int]) -> bool:
        if self.detok is None:
            return self.cancelled
        # the token that ended generation: its text left out, unless the request asks for it
        end = new[-1] if new and new[-1] in self.ends and not self.params.include_stop_str_in_output else None
        piece = self.detok.add(new if end is None else new[:-1], end)
        if self.stream is not None and piece:
            self.stream(piece)
        return self.detok.stopped or self.cancelled

    def output(self, tokens: list[int], metrics: RequestMetrics) -> RequestOutput:
        """The request's output (one), once its generation (`Request.run`) has returned `tokens` and `metrics`."""
        workers = self.llm.workers
        if workers is not None:
            metrics.control_messages = workers.messages - self.sent[0]
            metrics.control_bytes = workers.bytes - self.sent[1]
            metrics.worker_wait_s = workers.wait_s - self.sent[2]
            metrics.bulk_bytes = workers.bulk_bytes - self.sent[3]
        text = ""
        logprobs = None if self.params.logprobs is None else self.engine.logprobs
        if self.detok is not None:
            rest = self.detok.finish()
            if self.stream is not None and rest:
                self.stream(rest)
            text = self.detok.text
            kept = self.detok.tokens_through_stop()  # the round that completed a stop string may have gone on
            tokens, logprobs = tokens[:kept], logprobs if logprobs is None else logprobs[:kept]
            metrics.generated_tokens = len(tokens)  # the output's, as vLLM counts them (and tokens/s)
        hit_end = bool(tokens) and tokens[-1] in self.ends
        stop_string = None if self.detok is None else self.detok.stop_string
        cut = self.cancelled and (len(tokens) < self.params.max_tokens or not self.engine.prefilled)
        finish = "stop" if hit_end or stop_string is not None else "abort" if cut else "length"
        # vLLM's: the model's end of sequence names no stop_reason, also where stop_token_ids has it, unless
        # ignore_eos made it a stop token like any
        eos_stops = self.params.ignore_eos and self.main_eos in self.params.stop_token_ids
        stop_reason = stop_string if stop_string is not None else (
            tokens[-1] if hit_end and (tokens[-1] != self.main_eos or eos_stops) else None)
        cumulative = None if logprobs is None else sum(entry.logprob for entry in logprobs)
        if self.detok is not None:  # vLLM's decoded_token, each decoded when its dict view is first read
            texts = TokenTexts(self.llm.tokenizer)
            name_tokens(texts, self.ids, tokens, logprobs or [])
            name_tokens(texts, [], self.ids, self.prompt_logprobs or [])
        completion = CompletionOutput(0, text, tokens, cumulative, logprobs, finish, stop_reason, metrics)
        return RequestOutput("", None, self.ids, self.prompt_logprobs, [completion],
                             num_cached_tokens=metrics.cached_prompt_tokens)
