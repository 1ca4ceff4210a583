"""vLLM's `LLM(...)` engine arguments, as this LLM takes them, so that a script written for vLLM builds it
as it is: `tensor_parallel_size` and `pipeline_parallel_size` of 1 (more is a worker group, which torchrun
launches: docs/distributed.md), `gpu_memory_utilization` (here: the share of the memory free on the
device that requests' caches may take), `seed` (the random stream that seeds requests without a seed, so
that a seeded LLM repeats its samples run after run), `max_model_len` (a bound below the model's
positions), `enable_prefix_caching` (False: no prefix store), `tokenizer` and `tokenizer_revision` (a
tokenizer from elsewhere than the model's folder, as vLLM takes one for a GGUF file), `skip_tokenizer_init`
(none: prompts are token ids, outputs have no text); and, as they change nothing here,
`enforce_eager`, `trust_remote_code` (no model here runs code of its own) and `disable_log_stats`. Any
other is refused by name, as an unknown engine setting.
"""
from __future__ import annotations

import os
import random
from dataclasses import dataclass

from .config import ConfigError, is_integer, is_number

MEMORY_SHARE = 0.9  # of the memory free on the device, what requests' caches may take
HARMLESS = ("enforce_eager", "trust_remote_code", "disable_log_stats")
TAKEN = ("tensor_parallel_size", "pipeline_parallel_size", "gpu_memory_utilization", "seed", "max_model_len",
         "enable_prefix_caching", "tokenizer", "tokenizer_revision", "skip_tokenizer_init", *HARMLESS)


@dataclass
class VllmArgs:
    memory_share: float = MEMORY_SHARE
    seeds: random.Random | None = None  # draws the seeds of requests without one
    max_model_len: int | None = None
    prefix_caching: bool = True
    tokenizer: str | None = None  # a known name, folder, .gguf file or Hugging Face id; None: the model's
    tokenizer_revision: str | None = None
    skip_tokenizer_init: bool = False


def take_vllm_args(settings: dict) -> VllmArgs:
    """vLLM's arguments popped out of LLM's **engine_settings, checked."""
    given = {name: settings.pop(name) for name in TAKEN if name in settings}
    for name in ("tensor_parallel_size", "pipeline_parallel_size"):
        size = given.get(name, 1)
        if not is_integer(size) or size < 1:
            raise ConfigError(f"{name} must be an integer >= 1 (got {size!r})")
        if size != 1:
            raise ConfigError(f"{name} {size}: this LLM runs in one process; a target sharded across processes "
                              f"is a worker group, launched by torchrun (`triforce serve --workers N`, "
                              f"docs/distributed.md)")
    for name in (*HARMLESS, "enable_prefix_caching", "skip_tokenizer_init"):
        if given.get(name) not in (None, True, False):  # 0, 1 and numpy's bools as Python's
            raise ConfigError(f"{name} must be true, false or None (got {given[name]!r})")
    args = VllmArgs()
    if "gpu_memory_utilization" in given:
        share = given["gpu_memory_utilization"]
        if not is_number(share) or not 0 < share <= 1:
            raise ConfigError(f"gpu_memory_utilization must be in (0, 1] (got {share!r})")
        args.memory_share = float(share)
    seed = given.get("seed")
    if seed is not None:
        if not is_integer(seed):
            raise ConfigError(f"seed must be an integer or None (got {seed!r})")
        args.seeds = random.Random(int(seed))
    length = given.get("max_model_len")
    if length is not None and (not is_integer(length) or length < 2):
        raise ConfigError(f"max_model_len must be an integer >= 2 (got {length!r})")
    args.max_model_len = None if length is None else int(length)
    args.prefix_caching = given.get("enable_prefix_caching") in (None, True)
    for name in ("tokenizer", "tokenizer_revision"):
        value = given.get(name)
        if value is not None and (not isinstance(value, (str, os.PathLike)) or not str(value).strip()):
            raise ConfigError(f"{name} must be a non-empty name or path, or None (got {value!r})")
        setattr(args, name, None if value is None else str(value))
    args.skip_tokenizer_init = bool(given.get("skip_tokenizer_init"))
    if args.skip_tokenizer_init and args.tokenizer is not None:
        raise ConfigError("skip_tokenizer_init=True loads no tokenizer, so tokenizer has nothing to name")
    if args.tokenizer_revision is not None and args.tokenizer is None:  # the model's own is at its revision
        raise ConfigError("tokenizer_revision names a revision of tokenizer=, which is not given (the model's "
                          "own tokenizer is at the model's revision)")
    return args
