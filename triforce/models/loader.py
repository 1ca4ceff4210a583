"""Load a Hugging Face Llama-family folder (config.json + safetensors, single file or sharded index)."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from ..errors import UserError
from .config import DTYPE_CHOICES, ModelConfig, ModelLoadError
from .llama import LlamaModel
from .parallel import TensorParallel
from .vocab import ReducedVocabulary

DTYPES = {name: getattr(torch, name) for name in DTYPE_CHOICES if name != "auto"}


def resolve_device(spec: str | torch.device | None) -> torch.device:
    """`spec` ('cpu', 'cuda', 'cuda:N'; None: cuda where this process has a GPU, else cpu) as a device this
    process can run on; a UserError naming it where it is none."""
    if not spec:  # None, or an empty --device "$UNSET"
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(spec)
    except (RuntimeError, TypeError):
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise UserError(f"device must be cpu, cuda or cuda:N (got {spec!r})")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"device {spec}: this process sees no CUDA GPU (a CPU-only torch, or no GPU here); "
                             "use cpu")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise UserError(f"device {spec}: this process sees {torch.cuda.device_count()} CUDA GPU(s)")
    return device


def resolve_dtype(dtype: str, device: str | torch.device, checkpoint: str | None = None) -> str:
    """'auto' -> bfloat16 where bfloat16 is fast: a CUDA GPU that has it (else float16; a float16
    `checkpoint` stays float16 there, as vLLM keeps it: its outputs are vLLM's and transformers'); a CPU with
    AVX512-BF16; a CPU with AVX2 where our kernels built (bfloat16 storage, float32 arithmetic: half the
    bytes per decode step, and prefill in float32 over the bfloat16 weights). float32 on a CPU with neither:
    torch computes bfloat16 there by converting to float32 and back, several times slower than float32.
    Other names pass through."""
    if dtype != "auto":
        return dtype
    device = torch.device(device)
    if device.type == "cuda":  # native bfloat16 on the GPU named: compute capability 8 and later (torch's
        # is_bf16_supported counts emulation on a T4 or V100, and asks the current GPU)
        native = torch.cuda.is_bf16_supported() if torch.version.hip else \
            torch.cuda.get_device_capability(device)[0] >= 8
        return "bfloat16" if native and checkpoint != "float16" else "float16"
    from ..kernels.cpu import kernel_path, native_bf16

    return "bfloat16" if native_bf16() or kernel_path() != "torch" else "float32"


def checkpoint_dtype(folder: str | Path) -> str | None:
    """The dtype a model folder's config.json says its weights are (transformers' `dtype`, `torch_dtype`
    before), or None."""
    try:
        config = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    named = (config.get("dtype") or config.get("torch_dtype")) if isinstance(config, dict) else None
    return named if isinstance(named, str) else None


def _checkpoint_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:  # (ValueError: not JSON or UTF-8; the others: no weight_map object of file names)
            files = [folder / n for n in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ModelLoadError(f"{index}: unreadable shard index ({exc})") from exc
    elif (folder / "model.safetensors").is_file():  # as transformers reads a folder: others beside it (an
        files = [folder / "model.safetensors"]  # adapter's, Mistral's consolidated copy) are not the model's
    else:
        files = sorted(folder.glob("*.safetensors"))
    missing = [str(f) for f in files if not f.is_file()]
    if missing or not files:
        raise ModelLoadError(f"{folder}: missing safetensors weights {missing or '(none found)'}")
    return files


def _read_tensors(files: list[Path], dtype: torch.dtype, part=lambda name: None) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors, each in `dtype` as soon as it is read: a float32 checkpoint loaded in
    bfloat16 is held once at half its size, not whole in float32 first. `part(name)`: the index of the part
    of tensor `name` to read (`_shard_part`), or None for all of it."""
    tensors: dict[str, torch.Tensor] = {}
    for path in files:
        try:
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():
                    short = name.removeprefix("model.")
                    index = part(short)
                    tensor = f.get_tensor(name) if index is None else _part_of(f.get_slice(name), index, short)
                    tensors[short] = tensor.to(dtype)
        except ModelLoadError:
            raise
        except Exception as exc:  # safetensors raises its own error types per version
            raise ModelLoadError(f"{path}: corrupt or unreadable safetensors file ({exc})") from exc
    return tensors


def _part_of(whole, index: tuple[slice, ...], name: str) -> torch.Tensor:
    """This rank's part of a checkpoint tensor (a safetensors slice); a ModelLoadError naming the tensor
    where it has not the shape the config gives it (not a corrupt file)."""
    shape = tuple(whole.get_shape())
    if len(shape) < len(index) or any(s.stop is not None and s.stop > n for s, n in zip(index, shape)):
        raise ModelLoadError(f"tensor {name!r} has shape {shape}, which the config's split does not fit")
    return whole[index]


def _fused_state_dict(cfg: ModelConfig, raw: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Maps Hugging Face tensor names onto ours, fusing q/k/v and gate/up."""
    def take(name):
        try:
            return raw.pop(name)
        except KeyError:
            raise ModelLoadError(f"checkpoint lacks tensor {name!r}") from None

    state = {"embed_tokens.weight": take("embed_tokens.weight"), "norm.weight": take("norm.weight")}
    head = raw.pop("lm_head.weight", None)
    if not cfg.tie_word_embeddings:
        if head is None:
            raise ModelLoadError("checkpoint lacks tensor 'lm_head.weight' and does not tie embeddings")
        state["lm_head.weight"] = head
    for i in range(cfg.num_layers):
        src, dst = f"layers.{i}.", f"layers.{i}."
        attn, mlp = src + "self_attn.", src + "mlp."
        state[dst + "qkv_proj.weight"] = torch.cat([take(attn + f"{p}_proj.weight") for p in "qkv"])
        if cfg.attention_bias:
            state[dst + "qkv_proj.bias"] = torch.cat([take(attn + f"{p}_proj.bias") for p in "qkv"])
        state[dst + "o_proj.weight"] = take(attn + "o_proj.weight")
        state[dst + "gate_up_proj.weight"] = torch.cat([take(mlp + "gate_proj.weight"), take(mlp + "up_proj.weight")])
        state[dst + "down_proj.weight"] = take(mlp + "down_proj.weight")
        state[dst + "input_norm.weight"] = take(src + "input_layernorm.weight")
        state[dst + "post_attention_norm.weight"] = take(src + "post_attention_layernorm.weight")
    raw.pop("rotary_emb.inv_freq", None)
    for i in range(cfg.num_layers):
        raw.pop(f"layers.{i}.self_attn.rotary_emb.inv_freq", None)
    if raw:
        raise ModelLoadError(f"checkpoint has tensors this architecture does not use: {sorted(raw)[:5]}")
    return state


def _shard_part(cfg: ModelConfig, tp: TensorParallel, name: str) -> tuple[slice, ...] | None:
    """The part of checkpoint tensor `name` this rank keeps (see models/parallel.py for the split), read
    alone: q, k, v and gate, up by output rows, o and down by input columns, the embedding and output head
    by vocabulary rows; None (all of it) for the norms. (Each rank read the whole checkpoint and sliced it,
    the group holding W copies of the model at once.) Fused after, q/k/v and gate/up come out in the
    layout of this rank's fused layers."""
    d = cfg.head_dim
    q_heads, kv_heads = tp.head_slices(cfg)
    mlp = slice(tp.rank * cfg.intermediate_size // tp.size, (tp.rank + 1) * cfg.intermediate_size // tp.size)
    if name in ("embed_tokens.weight", "lm_head.weight"):
        return (tp.rows(cfg.vocab_size),)
    proj = name.rsplit(".", 2)[-2]
    if proj == "q_proj":  # weight or bias: rows
        return (slice(q_heads.start * d, q_heads.stop * d),)
    if proj in ("k_proj", "v_proj"):
        return (slice(kv_heads.start * d, kv_heads.stop * d),)
    if proj == "o_proj":
        return (slice(None), slice(q_heads.start * d, q_heads.stop * d))
    if proj in ("gate_proj", "up_proj"):
        return (mlp,)
    if proj == "down_proj":
        return (slice(None), mlp)
    return None


def _finite(tensor: torch.Tensor) -> bool:
    """Whether `tensor` holds no NaN or infinity (damaged bytes, or values past its dtype's range): its sum is
    finite, at a tenth of isfinite's cost in bfloat16; float16's sum is taken in float32, past its range."""
    return bool(tensor.sum(dtype=torch.float32 if tensor.dtype == torch.float16 else None).isfinite())


def load_model(folder: str | Path, dtype: str | torch.dtype = "float32",
               device: str | torch.device = "cpu", tp: TensorParallel | None = None,
               rope_scaling: str | None = None) -> LlamaModel:
    """Loads a model folder onto `device` in `dtype`; with `tp`, only this rank's shard; `rope_scaling`
    'KIND:FACTOR' stretches its positions (ModelConfig.with_rope_scaling). Raises ModelLoadError with a
    one-line reason."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ModelLoadError(f"{folder}: not a model folder")
    if isinstance(dtype, str) and dtype not in DTYPE_CHOICES:  # (a KeyError traceback from DTYPES before)
        raise ModelLoadError(f"dtype must be one of {', '.join(DTYPE_CHOICES)} (got {dtype!r})")
    torch_dtype = DTYPES[resolve_dtype(dtype, device, checkpoint_dtype(folder))] if isinstance(dtype, str) else dtype
    cfg = ModelConfig.from_folder(folder)
    if rope_scaling:
        cfg = cfg.with_rope_scaling(rope_scaling)
    files, part = _checkpoint_files(folder), lambda name: None
    if tp is not None and tp.size > 1:
        tp.check(cfg)
        part = lambda name: _shard_part(cfg, tp, name)  # noqa: E731
    else:
        tp = None
    raw = _read_tensors(files, torch_dtype, part)
    if tp is not None:
        cfg = tp.local_config(cfg)
    state = _fused_state_dict(cfg, raw)
    with torch.device("meta"):
        model = LlamaModel(cfg, tp).to(torch_dtype)  # allocated once, in its dtype
    model = model.to_empty(device=device)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    expected = dict(model.state_dict())
    for name, tensor in state.items():
        if name not in expected:
            raise ModelLoadError(f"unexpected tensor {name!r}")
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise ModelLoadError(f"tensor {name!r} has shape {tuple(tensor.shape)}, config implies "
                                 f"{tuple(expected[name].shape)}")
    missing = set(expected) - set(state) - ({"lm_head.weight"} if cfg.tie_word_embeddings else set())
    if missing:
        raise ModelLoadError(f"checkpoint lacks tensors {sorted(missing)[:5]}")
    with torch.no_grad():  # each tensor into its parameter (whose pages the copy touches first), then dropped:
        for name in list(state):  # the process holds the weights about once, not twice
            expected[name].copy_(state.pop(name))
            if not _finite(expected[name]):
                raise ModelLoadError(f"{folder}: tensor {name!r} holds NaN or infinite values in {torch_dtype}")
    vocab = ReducedVocabulary.from_folder(folder, cfg.vocab_size)
    model.vocab = None if vocab is None else vocab.to(torch.device(device))
    return model.finalize()
