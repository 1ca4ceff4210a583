"""The model's own sampling defaults, as vLLM takes them (its `--generation-config auto`, the default):
generation_config.json's temperature, top_p, top_k, min_p and repetition_penalty are the defaults of
requests that leave them out, and its max_new_tokens the default max_tokens (a server's bound on every
request's). A value equal to transformers' GenerationConfig default is no setting (vLLM reads the file's
differences from those defaults), and `do_sample` is not read (vLLM does not either). Qwen2.5's instruct
models ask for temperature 0.7, top_p 0.8 and top_k 20 there; the GGUF
conversions this project makes name only where generation ends, so they set none.

`generation_config`: 'auto' reads the model folder's file, 'vllm' takes none (vLLM's neutral defaults:
here, the entry point's own), a folder reads that folder's.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from .config import ConfigError, SamplingParams
from .models.config import GENERATION_CONFIG, ModelLoadError

log = logging.getLogger("triforce")

# the file's key -> (SamplingParams' name, transformers' default: not a setting)
KEYS = {"temperature": ("temperature", 1.0), "top_p": ("top_p", 1.0), "top_k": ("top_k", 50),
        "min_p": ("min_p", None), "repetition_penalty": ("repetition_penalty", 1.0),
        "max_new_tokens": ("max_tokens", None)}


def sampling_defaults(choice: str | os.PathLike, model_folder: Path) -> dict[str, float | int]:
    """The SamplingParams settings that generation_config `choice` gives requests that leave them out."""
    if choice == "vllm":
        return {}
    folder = Path(model_folder if choice == "auto" else choice)
    path = folder / GENERATION_CONFIG
    if not path.is_file():
        if choice != "auto":
            raise ConfigError(f"generation_config {str(choice)!r}: no {GENERATION_CONFIG} in that folder (auto: the "
                              f"model's, if it has one; vllm: none)")
        return {}
    try:
        raw = json.loads(path.read_text())
        if not isinstance(raw, dict):
            raise ValueError(f"a {type(raw).__name__}, not an object")
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}: unreadable ({exc})") from None
    defaults = {}
    for key, (name, unset) in KEYS.items():
        value = raw.get(key)
        if value is None or value == unset:
            continue
        try:
            if name == "max_tokens" and value == 0:
                raise ConfigError("max_tokens must be >= 1 here")
            defaults[name] = getattr(SamplingParams(**{name: value}), name)
        except ConfigError as exc:
            log.warning("%s: %s %r left out (%s)", path, key, value, exc)
    if defaults:
        log.warning("sampling defaults from %s for requests that leave them out: %s (generation_config 'vllm', "
                    "--generation-config vllm, leaves them out)", path,
                    ", ".join(f"{name}={value}" for name, value in defaults.items()))
    return defaults
