"""A Llama-family GGUF file (llama, mistral, qwen2) as a float32 safetensors folder that loader.py reads.

Tensor by tensor: each GGUF tensor is dequantized (the `gguf` package), renamed to its Hugging Face name
and written into the shard it belongs to, so the conversion holds about a shard (SHARD_BYTES) twice at
most: its tensors and safetensors' serialised copy of them. Before, transformers built the whole float32
model from the whole dequantized checkpoint, both in memory (with the loader's copies, fetching
Qwen2.5-Coder-1.5B, 7.1 GB in float32, peaked at 17.8 GB; now 4.7: docs/qwen.md).
The config and the tokenizer still come from transformers, which reads them from the GGUF's metadata,
except what its reader leaves out or gets otherwise than llama.cpp: the RoPE scaling (rope_scaling, a
Llama 3.x's rope_freqs: llama3_scaling) and parts of the tokenizer (gguf_tokenizer.py); the ids
that end generation are llama.cpp's for the same file (write_generation_config).
"""
from __future__ import annotations

import json
import logging
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from ..files import write_whole
from .config import GENERATION_CONFIG, ModelLoadError, id_list
from .gguf_tokenizer import CHECKED_PRE, mend_pre_tokenizer, special_tokens_mended

log = logging.getLogger(__name__)

SHARD_BYTES = 1 << 30  # safetensors serialises a file in memory: shards bound the conversion's peak
ARCHITECTURES = ("llama", "qwen2")  # GGUF's names: mistral's GGUFs say llama
_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_LAYER = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
          "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
          "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
# llama.cpp ends generation at the GGUF's end-of-sequence id and at any token of these texts (llama-vocab.cpp:
# its end-of-generation texts, then its fill-in-the-middle pad, repository and file separator tokens, then
# DeepSeek's end of turn)
END_OF_GENERATION = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>",
                     "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>",
                     "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "<|fim_repo|>", "<|repo_name|>", "<fim-repo>",
                     "<REPO>", "<reponame>", "<|file_sep|>", "<｜end▁of▁sentence｜>")
_DERIVED = ("rope_freqs",)  # llama.cpp's llama3 RoPE factors: not a weight (read as the config's: llama3_scaling)
# Llama 3.1's llama3 RoPE scaling, whose per-frequency divisors llama.cpp keeps as rope_freqs (3.2 and 3.3 too)
LLAMA3_BANDS = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}

Tensors = list[tuple[str, int, Callable[[], torch.Tensor]]]  # (name, bytes, the tensor when wanted)


def hf_name(gguf_name: str) -> str | None:
    """The Hugging Face name of GGUF tensor `gguf_name` (`blk.3.attn_q.weight` -> `model.layers.3.
    self_attn.q_proj.weight`); None for one that holds no weight (`rope_freqs`)."""
    layer = re.fullmatch(r"blk\.(\d+)\.(\w+)\.(weight|bias)", gguf_name)
    top = re.fullmatch(r"(\w+)\.(weight|bias)", gguf_name)
    if layer and layer[2] in _LAYER:
        return f"model.layers.{layer[1]}.{_LAYER[layer[2]]}.{layer[3]}"
    if top and top[1] in _TOP:
        return f"{_TOP[top[1]]}.{top[2]}"
    if top and top[1] in _DERIVED:
        return None
    raise ModelLoadError(f"GGUF tensor {gguf_name!r} has no place in a Llama-family model")


def unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Undoes llama.cpp's reordering of a llama q or k projection's rows (weight or bias) for its RoPE:
    within each of `heads` heads, the rows of the two rotated halves were interleaved."""
    half = w.shape[0] // heads // 2
    return w.reshape(heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_tensors(reader, architecture: str, config: dict) -> Tensors:
    """The checkpoint's tensors in `reader` (a gguf.GGUFReader), each dequantized to float32 only when
    asked for."""
    from gguf import dequantize

    heads = {"attn_q": config["num_attention_heads"],
             "attn_k": config.get("num_key_value_heads") or config["num_attention_heads"]}

    def tensor(t) -> torch.Tensor:
        w = dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        part = t.name.split(".")[2] if t.name.startswith("blk.") else None
        if architecture == "llama" and part in heads:
            w = unpermute(w, heads[part])
        # F32 tensors are views of the mapped file: copied; the rest are new arrays already
        return torch.from_numpy(np.array(w) if np.may_share_memory(w, t.data) else np.ascontiguousarray(w))

    out = []
    for t in reader.tensors:
        name = hf_name(t.name)
        if name is not None:
            out.append((name, int(t.n_elements) * 4, lambda t=t: tensor(t)))
    return out


def _made(make, nbytes: int, bar: tqdm):
    tensor = make()
    bar.update(nbytes)
    return tensor


def write_shards(tensors: Tensors, folder: Path) -> None:
    """`tensors` as safetensors files of about SHARD_BYTES each (Hugging Face's index where several), each
    made only while its shard is written."""
    from safetensors.torch import save_file

    shards: list[Tensors] = [[]]
    size = 0
    for item in tensors:
        if shards[-1] and size + item[1] > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append(item)
        size += item[1]
    files = ["model.safetensors"] if len(shards) == 1 else \
        [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    with tqdm(total=sum(nbytes for _, nbytes, _ in tensors), desc="convert", unit="B", unit_scale=True,
              file=sys.stderr, leave=False, disable=None) as bar:  # None: only on a terminal
        for file, shard in zip(files, shards):
            save_file({name: _made(make, nbytes, bar) for name, nbytes, make in shard}, str(folder / file),
                      metadata={"format": "pt"})
    if len(shards) > 1:
        weight_map = {name: file for file, shard in zip(files, shards) for name, _, _ in shard}
        total = sum(nbytes for _, nbytes, _ in tensors)
        (folder / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))


def field_value(reader, key: str):
    """GGUF metadata `key` as a number or a string (None where absent), read from the field's parts as every
    gguf release this project takes lays them out (ReaderField.contents() came in later ones)."""
    from gguf import GGUFValueType

    field = reader.fields.get(key)
    if field is None or not field.data:
        return None
    part = field.parts[field.data[0]]
    return bytes(part).decode() if field.types and field.types[0] == GGUFValueType.STRING else part.tolist()[0]


def llama3_scaling(reader, architecture: str) -> dict:
    """The llama3 RoPE parameters of a GGUF that keeps them as llama.cpp does, only as the divisors of its
    `rope_freqs` tensor ({} without one): the converted model ran plain RoPE at every position (a Llama 3.2
    1B turned 17 of its 32 frequency pairs wrong), which transformers' GGUF reader does too."""
    tensor = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    if tensor is None:
        return {}
    from .rope import llama3_inv_freq  # (the rotation's own formula: what it divides each frequency by)

    divisors = torch.from_numpy(np.asarray(tensor.data, dtype=np.float64).reshape(-1))
    theta = float(field_value(reader, f"{architecture}.rope.freq_base") or 10000.0)
    dim = 2 * len(divisors)
    inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    params = {"rope_type": "llama3", "factor": float(divisors.max()), **LLAMA3_BANDS}
    if not torch.allclose(inv_freq / llama3_inv_freq(inv_freq, params), divisors, rtol=1e-3):
        raise ModelLoadError("the GGUF's RoPE divisors (rope_freqs) are no llama3 scaling triforce knows "
                             "(Llama 3.1's bands: low 1, high 4, over 8,192 positions)")
    return params


def rope_scaling(reader, architecture: str) -> dict:
    """The RoPE scaling a GGUF's metadata names (`{arch}.rope.scaling.*`, as llama.cpp applies it), or its
    rope_freqs tensor gives (llama3_scaling), as rope_parameters name it ({} for none). transformers' GGUF
    reader leaves it out of the config for llama and qwen2, so a Qwen2.5 128K GGUF (yarn, factor 4 over
    32,768) ran unscaled at every position."""
    def value(key: str):
        return field_value(reader, f"{architecture}.rope.scaling.{key}")

    kind, factor = value("type"), value("factor")
    if factor is None:  # the key older GGUFs wrote (SuperHOT, LongChat: linear)
        factor = field_value(reader, f"{architecture}.rope.scale_linear")
    if kind is None and factor not in (None, 0.0, 1.0):
        kind = "linear"  # llama.cpp's type where the GGUF names none (it was dropped: positions unscaled)
    if kind in (None, "none"):
        return llama3_scaling(reader, architecture)
    if kind not in ("linear", "yarn"):
        raise ModelLoadError(f"RoPE scaling {kind!r} in the GGUF is not supported (linear and yarn are)")
    if factor is None:
        raise ModelLoadError(f"the GGUF scales RoPE ({kind}) without a factor ({architecture}.rope.scaling.factor)")
    scaling = {"rope_type": kind, "factor": float(factor)}
    if value("original_context_length"):
        scaling["original_max_position_embeddings"] = int(value("original_context_length"))
    for ours, theirs in (("beta_fast", "yarn_beta_fast"), ("beta_slow", "yarn_beta_slow")):
        if kind == "yarn" and value(theirs) is not None:
            scaling[ours] = float(value(theirs))
    others = [k for k in ("attn_factor", "yarn_log_multiplier", "yarn_ext_factor", "yarn_attn_factor")
              if value(k) is not None]
    if others:
        log.warning("RoPE scaling settings of the GGUF not carried over: %s", ", ".join(others))
    return scaling


def scaled(config: dict, scaling: dict) -> dict:
    """`config` (a config.json's dict) with the GGUF's RoPE `scaling` over its own RoPE parameters."""
    if not scaling:
        return config
    params = {**(config.get("rope_parameters") or {"rope_theta": config.get("rope_theta", 10000.0)}), **scaling}
    return {**{k: v for k, v in config.items() if k != "rope_scaling"}, "rope_parameters": params}


def mend_rope_scaling(reader, folder: Path) -> bool:
    """Gives `folder`, converted from the GGUF `reader` reads before conversions carried its RoPE scaling,
    that scaling (its positions ran unscaled); nothing for a GGUF without one, or a folder that has it.
    Whether it changed the config."""
    path = folder / "config.json"
    config = json.loads(path.read_text())
    if config.get("rope_scaling") or (config.get("rope_parameters") or {}).get("rope_type", "default") != "default":
        return False
    mended = scaled(config, rope_scaling(reader, field_value(reader, "general.architecture") or "none"))
    if mended is not config:
        write_whole(path, json.dumps(mended, indent=2))
    return mended is not config


@contextmanager
def alone(gguf: Path) -> Iterator[Path]:
    """`gguf` as a link in a folder of its own, where no other file is read as its config or tokenizer (a
    tokenizer.json of another model beside it made every prompt other token ids); `gguf` itself where this
    file system cannot link."""
    with tempfile.TemporaryDirectory(prefix="triforce-gguf-") as folder:
        lone = Path(folder) / gguf.name
        try:
            lone.symlink_to(gguf.resolve())
        except OSError:
            lone = gguf
        yield lone


def write_hf_folder(gguf: Path, folder: Path) -> None:
    """Dequantizes a Llama-family GGUF into `folder` as a float32 safetensors HF folder (config, tokenizer)."""
    from gguf import GGUFReader
    from transformers import AutoConfig, AutoTokenizer

    try:
        reader = GGUFReader(gguf)
        architecture = field_value(reader, "general.architecture") or "none named"
        if (field_value(reader, "split.count") or 1) > 1:  # llama.cpp's gguf-split: this file holds a part
            raise ModelLoadError(f"{gguf}: one of {field_value(reader, 'split.count')} parts of a split GGUF; join "
                                 f"them first (llama-gguf-split --merge FIRST-PART OUT.gguf)")
        if architecture not in ARCHITECTURES:
            raise ModelLoadError(f"{gguf}: architecture {architecture!r}; triforce reads {', '.join(ARCHITECTURES)}")
        with alone(gguf) as lone:  # (transformers takes a tokenizer.json beside the GGUF over the GGUF's own)
            config = AutoConfig.from_pretrained(lone.parent, gguf_file=lone.name).to_dict()
            tokenizer = AutoTokenizer.from_pretrained(lone.parent, gguf_file=lone.name)
        config = scaled(config, rope_scaling(reader, architecture))
        tensors = gguf_tensors(reader, architecture, config)
        config.pop("quantization_config", None)
        config["dtype"] = "float32"
        write_shards(tensors, folder)  # the tensors are read and dequantized here
        (folder / "config.json").write_text(json.dumps(config, indent=2))
        tokenizer.save_pretrained(folder)
    except ModelLoadError:
        raise
    except Exception as exc:  # transformers, gguf and numpy raise many types for unreadable or unsupported
        # GGUF (and the disk can fill, also as the config and tokenizer are written): one line naming both ends
        raise ModelLoadError(f"{gguf}: cannot convert as a Llama-family GGUF into {folder} ({exc})") from exc
    pre = field_value(reader, "tokenizer.ggml.pre")
    mend_pre_tokenizer(folder, pre)
    special_tokens_mended(folder, reader)
    if field_value(reader, "tokenizer.ggml.model") == "gpt2" and pre not in CHECKED_PRE:
        log.warning("%s: pre-tokenizer %s is not one triforce knows the converted tokenizer to split as llama.cpp "
                    "does (numbers, spaces and newlines may become other tokens); prefer the model's Hugging "
                    "Face folder", gguf, pre or "none named")


def write_generation_config(folder: Path) -> None:
    """generation_config.json in converted `folder`: generation ends where llama.cpp ends it on the same GGUF,
    at config.json's end-of-sequence id and at each token of its tokenizer named in END_OF_GENERATION. The
    GGUF of an instruct model names its turn's end (Qwen2.5's <|im_end|>, SmolLM2's too); a text that ends
    as a document (<|endoftext|>) ended nowhere before, and Qwen's own generation_config lists both."""
    ids = id_list(json.loads((folder / "config.json").read_text()).get("eos_token_id"))
    vocab = folder / "tokenizer.json"
    if vocab.is_file():
        tokenizer = json.loads(vocab.read_text())
        texts = {t.get("content"): t["id"] for t in tokenizer.get("added_tokens", [])}
        words = tokenizer.get("model", {}).get("vocab")
        if isinstance(words, dict):  # BPE's and WordPiece's text -> id
            texts = {**words, **texts}
        ids += sorted(texts[text] for text in END_OF_GENERATION if text in texts)
    # processes topping up one folder each write it whole
    write_whole(folder / GENERATION_CONFIG, json.dumps({"eos_token_id": list(dict.fromkeys(ids))}, indent=2))
