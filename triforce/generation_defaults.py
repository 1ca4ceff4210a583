"""The model's own sampling defaults, as vLLM takes them (its `--generation-config auto`, the default):
generation_config.json's temperature, top_p, top_k, min_p and repetition_penalty are the defaults of
requests that leave them out, and its max_new_tokens bounds the max_tokens of the server's (and batch jobs')
requests (as vLLM's server bounds them) and is the default of `LLM.generate` without sampling params, as far
as the model's positions reach (a SamplingParams of the user's is taken as given, as in vLLM). As vLLM reads
the file's differences from transformers' GenerationConfig defaults, a top_p or repetition_penalty of 1, a
top_k of 50 or a min_p of 0 set nothing; a temperature is taken at any value, and `do_sample: true` without
one means transformers' 1 (vLLM's own default is 1 where ours, SamplingParams(), is greedy: a model that
asks to be sampled is). Qwen2.5's instruct models ask for temperature 0.7, top_p 0.8 and top_k 20 there,
among others; the GGUF conversions this project makes name only where generation ends, so they set none.

`generation_config`: 'auto' reads the model folder's file, 'vllm' takes none (vLLM's neutral defaults:
here, the entry point's own), a folder reads that folder's.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

from .config import ConfigError
from .sampling_params import SamplingParams
from .models.config import GENERATION_CONFIG, generation_eos_ids, read_generation_config

log = logging.getLogger("triforce")

# the file's key -> (SamplingParams' name, the value that sets nothing)
KEYS = {"temperature": ("temperature", None), "top_p": ("top_p", 1.0), "top_k": ("top_k", 50),
        "min_p": ("min_p", 0.0), "repetition_penalty": ("repetition_penalty", 1.0),
        "max_new_tokens": ("max_tokens", None)}


def sampling_defaults(choice, model_folder: Path) -> dict[str, float | int]:
    """The SamplingParams settings that generation_config `choice` gives requests that leave them out."""
    path = _file(choice, model_folder)
    if path is None:
        return {}
    raw = read_generation_config(path)
    if raw.get("temperature") is None and raw.get("do_sample") is True:
        raw = {**raw, "temperature": 1.0}  # transformers' temperature, which do_sample asks for
    defaults = {}
    for key, (name, unset) in KEYS.items():
        value = raw.get(key)
        if value is None or (value == unset and not isinstance(value, bool)):
            continue
        try:
            if isinstance(value, bool) or (name == "max_tokens" and not (isinstance(value, int) and value >= 1)):
                raise ConfigError(f"{key} must be {'an integer >= 1' if name == 'max_tokens' else 'a number'}")
            defaults[name] = getattr(SamplingParams(**{name: value}), name)
        except ConfigError as exc:
            log.warning("%s: %s %r left out (%s)", path, key, value, exc)
    if defaults:
        bound = defaults.get("max_tokens")
        log.warning("sampling defaults from %s for requests that leave them out: %s%s (generation_config 'vllm', "
                    "--generation-config vllm, leaves them out)", path,
                    ", ".join(f"{name}={value}" for name, value in defaults.items() if name != "max_tokens") or "none",
                    "" if bound is None else f"; every request's max_tokens at most {bound}")
    return defaults


def added_eos_ids(choice, model_folder: Path) -> tuple[int, ...]:
    """The end-of-sequence ids of a generation_config folder other than the model's, which end generation
    as vLLM's do (it reads them from the folder it is given); the model's own file's are in its config
    (models/config.py)."""
    path = None if choice == "auto" else _file(choice, model_folder)
    return () if path is None else generation_eos_ids(path)


def _file(choice, model_folder: Path) -> Path | None:
    """The generation_config.json that `choice` names (None: none to read)."""
    if choice == "vllm":
        return None
    if not isinstance(choice, (str, os.PathLike)):
        raise ConfigError(f"generation_config must be 'auto', 'vllm' or a folder (got {choice!r})")
    folder = Path(model_folder if choice == "auto" else choice)
    if choice == "auto":
        return folder / GENERATION_CONFIG if (folder / GENERATION_CONFIG).is_file() else None
    if folder.is_file():
        why = "a file; name the folder that holds it"
    elif not folder.is_dir():
        why = "no such folder"
    elif not (folder / GENERATION_CONFIG).is_file():
        why = f"no {GENERATION_CONFIG} in that folder"
    else:
        return folder / GENERATION_CONFIG
    raise ConfigError(f"generation_config {str(choice)!r}: {why} (auto: the model's, if it has one; vllm: none)")
