"""The Python API, in vLLM's shape:

    from triforce import LLM, SamplingParams
    llm = LLM(model="smollm2", mode="triforce")
    out = llm.generate(["Once upon a time"], SamplingParams(max_tokens=64, temperature=0.6))[0]
    print(out.text, out.metrics.tokens_per_s)
"""
from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import torch

from .config import ConfigError, EngineConfig, SamplingParams
from .coordinator.hierarchy import build_engine, speculation_slack
from .coordinator.metrics import RequestMetrics
from .detokenize import IncrementalDetokenizer
from .errors import UserError
from .models.config import ModelLoadError
from .models.hub import DEFAULT_MODEL, resolve_model
from .models.loader import DTYPE_CHOICES, load_model, resolve_dtype
from .models.vocab import read_draft_metadata, tokenizer_fingerprint

log = logging.getLogger("triforce")

# Drafts shipped inside the package for known targets (made by `triforce train-draft`; see README). For
# other targets without --draft, mode `triforce` falls back to `retrieval` with a one-line notice.
DEFAULT_DRAFTS: dict[str, Path] = {"smollm2": Path(__file__).parent / "drafts" / "smollm2"}


@dataclass
class RequestOutput:
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str  # "stop" (EOS or stop string) or "length"
    metrics: RequestMetrics


def _available_memory_bytes(device: torch.device) -> int | None:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class LLM:
    def __init__(self, model: str | os.PathLike = DEFAULT_MODEL, draft: str | os.PathLike | None = None,
                 mode: str = "triforce", dtype: str = "auto", device: str | None = None, workers=None,
                 rope_scaling: str | None = None, **engine_settings):
        """`engine_settings` are EngineConfig fields (gamma1, gamma2, budget, chunk_size, ...). `workers`: a
        ControlChannel to a worker group that verifies with the full cache (launch/distributed.py);
        None verifies in this process. `rope_scaling`: 'KIND:FACTOR' (linear, dynamic, yarn, llama3)
        stretches target and draft alike over FACTOR times their positions."""
        if dtype not in DTYPE_CHOICES:
            raise ConfigError(f"dtype must be one of {', '.join(DTYPE_CHOICES)} (got {dtype!r})")
        unknown = set(engine_settings) - {f.name for f in fields(EngineConfig)}
        if unknown:
            raise ConfigError(f"unknown engine settings: {', '.join(sorted(unknown))}")
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.dtype = resolve_dtype(dtype, self.device)  # 'auto' decided once, for target and draft alike
        self.workers = workers
        EngineConfig(mode=mode, **engine_settings)  # fail on bad settings before loading anything
        self.model_path = resolve_model(model)
        if draft is None and mode in ("triforce", "draft"):
            shipped = DEFAULT_DRAFTS.get(str(model))
            draft = shipped if shipped is not None and (shipped / "config.json").is_file() else None
        if draft is None and mode == "draft":
            raise ConfigError("mode 'draft' needs a draft model (--draft)")
        self.draft_path = resolve_model(draft) if draft is not None and mode in ("triforce", "draft") else None
        self.rope_scaling = rope_scaling
        self.target = load_model(self.model_path, self.dtype, self.device, rope_scaling=rope_scaling)
        self.draft = (None if self.draft_path is None
                      else load_model(self.draft_path, self.dtype, self.device, rope_scaling=rope_scaling))
        if self.draft is None and mode == "triforce":
            print("triforce: no draft model for this target; mode 'triforce' falls back to 'retrieval'",
                  file=sys.stderr)
            mode = "retrieval"
        self.config = EngineConfig(mode=mode, **engine_settings)
        self.tokenizer = self._load_tokenizer()
        self._check_draft_vocabulary()

    def _load_tokenizer(self):
        from transformers import AutoTokenizer

        try:
            return AutoTokenizer.from_pretrained(self.model_path)
        except (OSError, ValueError, TypeError):
            log.info("no tokenizer in %s: prompts must be token ids", self.model_path)
            return None

    def _check_draft_vocabulary(self) -> None:
        if self.draft is None:
            return
        target_vocab, draft_vocab = self.target.config.vocab_size, self.draft.output_vocab_size
        if target_vocab != draft_vocab:
            raise ModelLoadError(f"draft vocabulary ({draft_vocab} tokens) differs from the target's "
                                 f"({target_vocab}); the draft must share the target's tokenizer")
        if self.tokenizer is None:
            return
        recorded = read_draft_metadata(self.draft_path).get("target_tokenizer")
        if recorded is not None:
            if recorded != tokenizer_fingerprint(self.tokenizer):
                raise ModelLoadError("draft was trained for a target with a different tokenizer")
            return
        from transformers import AutoTokenizer

        try:
            draft_tok = AutoTokenizer.from_pretrained(self.draft_path)
        except (OSError, ValueError, TypeError):
            return
        if draft_tok.get_vocab() != self.tokenizer.get_vocab():
            raise ModelLoadError("draft tokenizer differs from the target's; the draft must share it")

    def _encode(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise UserError("empty prompt")
            if self.tokenizer is None:
                raise UserError(f"{self.model_path} has no tokenizer; pass token ids")
            ids = self.tokenizer(prompt).input_ids
        else:
            ids = [int(t) for t in prompt]
        if not ids:
            raise UserError("empty prompt")
        vocab = self.target.config.vocab_size
        if min(ids) < 0 or max(ids) >= vocab:
            raise UserError(f"prompt token ids must lie in [0, {vocab})")
        return ids

    def _check_fits(self, prompt_len: int, max_tokens: int) -> None:
        cfg = self.target.config
        if prompt_len + max_tokens > cfg.max_positions:
            raise UserError(f"prompt ({prompt_len} tokens) + max new tokens ({max_tokens}) exceeds the model's "
                            f"{cfg.max_positions} positions")
        if self.workers is not None:
            return  # the full cache lives on the workers, which check their own capacity
        itemsize = torch.finfo(self.target.dtype).bits // 8
        capacity = prompt_len + max_tokens + speculation_slack(self.config)
        kv_bytes = cfg.kv_bytes_per_token(itemsize) * capacity
        free = _available_memory_bytes(self.device)
        if free is not None and kv_bytes > 0.9 * free:
            raise UserError(f"the KV cache for {capacity} tokens needs {kv_bytes / 2**30:.1f} GiB; "
                            f"only {free / 2**30:.1f} GiB is free on {self.device}")

    def _eos_ids(self) -> tuple[int, ...]:
        ids = set(self.target.config.eos_token_ids)
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return tuple(sorted(ids))

    def generate(self, prompts: str | Sequence[str] | Sequence[Sequence[int]], params: SamplingParams | None = None,
                 stream: Callable[[str], None] | None = None, show_progress: bool = False) -> list[RequestOutput]:
        """One output per prompt, in order. `stream` receives text pieces as they are committed."""
        params = params or SamplingParams()
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        return [self._generate_one(p, params, stream, show_progress) for p in prompts]

    def _generate_one(self, prompt, params: SamplingParams, stream, show_progress: bool) -> RequestOutput:
        ids = self._encode(prompt)
        self._check_fits(len(ids), params.max_tokens)
        verifier = None
        if self.workers is not None:
            from .coordinator.remote import RemoteVerifier

            capacity = len(ids) + params.max_tokens + speculation_slack(self.config)
            verifier = RemoteVerifier(self.workers, self.target, capacity, self.config.prefill_chunk)
            sent = (self.workers.messages, self.workers.bytes, self.workers.wait_s, self.workers.bulk_bytes)
        engine = build_engine(self.config, self.target, self.draft, len(ids) + params.max_tokens, verifier)
        detok = None if self.tokenizer is None else IncrementalDetokenizer(self.tokenizer, params.stop)

        def on_tokens(new: list[int]) -> bool:
            if detok is None:
                return False
            piece = detok.add(new)
            if stream is not None and piece:
                stream(piece)
            return detok.stopped

        tokens, metrics = engine.generate(ids, params, self._eos_ids(), on_tokens, show_progress)
        if self.workers is not None:
            metrics.control_messages = self.workers.messages - sent[0]
            metrics.control_bytes = self.workers.bytes - sent[1]
            metrics.worker_wait_s = self.workers.wait_s - sent[2]
            metrics.bulk_bytes = self.workers.bulk_bytes - sent[3]
        text = ""
        if detok is not None:
            rest = detok.finish()
            if stream is not None and rest:
                stream(rest)
            text = detok.text
        hit_eos = bool(tokens) and tokens[-1] in self._eos_ids() and not params.ignore_eos
        finish = "stop" if hit_eos or (detok is not None and detok.stopped) else "length"
        return RequestOutput(ids, tokens, text, finish, metrics)
