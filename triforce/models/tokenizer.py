"""A model's tokenizer: the one in its folder, or vLLM's tokenizer= (another source, checked against the
model's vocabulary)."""
from __future__ import annotations

import json
import logging
from pathlib import Path

from .config import ModelLoadError
from .folders import READY
from .hub import tokenizer_source

log = logging.getLogger(__name__)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")  # a folder with one of these has a tokenizer
GENERIC_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")  # transformers' tokenizer.json-only classes


def load_tokenizer(model_path: Path, vocab_size: int, spec: str | None = None, revision: str | None = None):
    """The tokenizer of the model folder `model_path` (None where it has none), or with `spec` vLLM's
    tokenizer=: a known model's, a folder's or a .gguf file's (converted as a model is), or a Hugging Face
    id's (transformers reads it from the hub cache), which must load and fit the model's `vocab_size` rows.
    A tokenizer that is there but does not load is a ModelLoadError, not taken for none."""
    source = model_path if spec is None else tokenizer_source(spec, revision)
    try:
        tokenizer = _loader(Path(source)).from_pretrained(source, revision=revision)
    except Exception as exc:  # noqa: BLE001 (transformers and tokenizers raise many types: a tokenizer.json
        # of another version's layout was a KeyError, or tokenizers' plain Exception, and a traceback)
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if spec is not None and not any((Path(source) / n).is_file() for n in TOKENIZER_FILES):
            raise ModelLoadError(f"no tokenizer in {source} (none of {', '.join(TOKENIZER_FILES)})") from None
        if spec is not None:
            raise ModelLoadError(f"cannot load the tokenizer {spec}: {reason}") from None
        present = [n for n in TOKENIZER_FILES if (model_path / n).is_file()]
        if present:  # there is one, and it is damaged: not the same as none
            raise ModelLoadError(f"cannot read the tokenizer in {model_path} ({', '.join(present)}): "
                                 f"{reason}") from None
        log.info("no tokenizer in %s: prompts must be token ids", model_path)
        return None
    if spec is not None and len(tokenizer) > vocab_size:
        raise ModelLoadError(f"the tokenizer {spec} has {len(tokenizer)} tokens, more than the {vocab_size} of the "
                             f"model's vocabulary: it is another model's")
    return tokenizer


def _loader(folder: Path):
    """What loads the tokenizer of `folder`: transformers' generic tokenizer.json class where triforce converted
    the folder from a GGUF (READY), its model is a Llama (SmolLM2) and its tokenizer_config.json names that
    class; else AutoTokenizer. AutoTokenizer loads that same class there, after reading the model's config
    through the model type's config module, whose imports (torch.distributed.tensor, sympy) took about 1 s of
    a command's start on the 2-core Zen 4: 0.24 s against 0.9-1.3 for SmolLM2's tokenizer. (For some model
    types, qwen2 among them, AutoTokenizer overrides a generic class with their own: those keep it.)"""
    import transformers

    named = None
    if (folder / READY).is_file():
        try:
            if json.loads((folder / "config.json").read_text()).get("model_type") == "llama":
                named = json.loads((folder / "tokenizer_config.json").read_text()).get("tokenizer_class")
        except (OSError, ValueError):  # (unreadable: AutoTokenizer says why)
            pass
    if named in GENERIC_CLASSES and getattr(transformers, named, None) is not None:
        return getattr(transformers, named)
    return transformers.AutoTokenizer
