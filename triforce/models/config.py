"""ModelConfig: the Llama-family hyperparameters we need, read from a Hugging Face config.json (and the ids
that end generation from generation_config.json beside it, where transformers and vLLM look for them).

Accepts both config layouts that transformers has written: 4.x (`rope_theta` + `rope_scaling`) and 5.x
(`rope_parameters`). Architectures: Llama 2/3, Mistral, Qwen2 (qkv bias). Anything else is refused with a
clear error instead of being loaded wrong.
"""
from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from ..config import is_number
from ..errors import UserError

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
# transformers' defaults where config.json leaves them out (KV heads: as many as attention heads, Llama's
# rule for every type; Mistral's and Qwen2's classes default to 8 and 32, which real configs always override)
TYPE_DEFAULTS = {"llama": {"max_position_embeddings": 2048}, "mistral": {"max_position_embeddings": 131072},
                 "qwen2": {"max_position_embeddings": 32768}}
SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")
ROPE_KEYS_NEEDED = {"linear": ("factor",), "dynamic": ("factor",), "yarn": ("factor",),
                    "llama3": ("factor", "low_freq_factor", "high_freq_factor")}  # what each kind reads
ROPE_SCALING_KINDS = ("linear", "dynamic", "yarn", "llama3")  # what --rope-scaling KIND:FACTOR takes
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")  # what --dtype takes (auto: the checkpoint's)
MAX_ROPE_FACTOR = 64  # the RoPE table covers every stretched position up front (models/rope.py)
SUPPORTED_ACTIVATIONS = ("silu", "swish")  # the MLP's gate; transformers' names for one function
GENERATION_CONFIG = "generation_config.json"

log = logging.getLogger(__name__)


class ModelLoadError(UserError):
    """A model folder that is missing, incomplete or describes a model we cannot run."""


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict = field(default_factory=dict)  # {"rope_type": ..., "factor": ..., ...}; empty = default
    attention_bias: bool = False  # Qwen2: bias on q, k, v
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    sliding_window: int | None = None
    position_limit: int | None = None  # a bound below the model's own (vLLM's max_model_len)

    def __post_init__(self):
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ModelLoadError(
                f"model_type {self.model_type!r} is not supported (supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
        sizes = {"vocab_size": self.vocab_size, "hidden_size": self.hidden_size, "head_dim": self.head_dim,
                 "intermediate_size": self.intermediate_size, "num_hidden_layers": self.num_layers,
                 "num_attention_heads": self.num_heads, "num_key_value_heads": self.num_kv_heads}
        bad = [f"{name} {value}" for name, value in sizes.items() if value < 1]
        if bad:  # (0 heads: a ZeroDivisionError traceback; negative sizes went on to torch's errors)
            raise ModelLoadError(f"config sizes must be positive (got {', '.join(bad)})")
        if self.num_heads % self.num_kv_heads:
            raise ModelLoadError(f"num_attention_heads {self.num_heads} is not a multiple of "
                                 f"num_key_value_heads {self.num_kv_heads}")
        rope_type = self.rope_type
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ModelLoadError(f"RoPE scaling {rope_type!r} is not supported "
                                 f"(supported: {', '.join(SUPPORTED_ROPE_TYPES)})")

    def with_rope_scaling(self, spec: str) -> "ModelConfig":
        """This config with RoPE stretched over FACTOR times its positions (`--rope-scaling KIND:FACTOR`): the
        parameters transformers reads for that kind, the original length being max_position_embeddings."""
        kind, factor = parse_rope_scaling(spec)
        if self.rope_scaling:
            raise ModelLoadError(f"--rope-scaling {spec}: the model's config already scales RoPE "
                                 f"({self.rope_type}); the flag is for models without scaling")
        original = self.max_position_embeddings
        params = {"rope_type": kind, "factor": factor, "original_max_position_embeddings": original}
        if kind == "llama3":
            params.update(low_freq_factor=1.0, high_freq_factor=4.0)  # Llama 3.1's
        return dataclasses.replace(self, rope_scaling=params, max_position_embeddings=int(original * factor))

    @property
    def rope_type(self) -> str:
        return self.rope_scaling.get("rope_type", self.rope_scaling.get("type", "default")) or "default"

    @property
    def rope_spec(self) -> str | None:
        """Its RoPE scaling as --rope-scaling writes it ('yarn:4'), None where it has none."""
        factor = self.rope_scaling.get("factor")
        if self.rope_type == "default" or factor is None:
            return None
        return f"{self.rope_type}:{repr(float(factor)).removesuffix('.0')}"

    def kv_bytes_per_token(self, bytes_per_value: int) -> int:
        """Keys and values of one token across all layers."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * bytes_per_value

    @property
    def max_positions(self) -> int:
        """Longest sequence (prompt + generation) the model attends over exactly (or position_limit)."""
        # Past the window Mistral-style models attend to a band we do not implement; refuse instead.
        bounds = (self.max_position_embeddings, self.sliding_window, self.position_limit)
        return min(b for b in bounds if b)

    @classmethod
    def from_hf_dict(cls, raw: dict) -> "ModelConfig":
        if not isinstance(raw, dict):
            raise ModelLoadError(f"config.json holds a {type(raw).__name__}, not an object of settings")
        model_type = raw.get("model_type", "llama")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ModelLoadError(
                f"model_type {model_type!r} is not supported (supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
        quantized = raw.get("quantization_config")
        if quantized:  # (its tensors were named as missing or extra ones, the weight scales among them)
            method = quantized.get("quant_method", "some") if isinstance(quantized, dict) else "some"
            raise ModelLoadError(f"a {method} quantized checkpoint (quantization_config): triforce loads "
                                 "unquantized weights, or a GGUF, which it dequantizes")
        raw = {**TYPE_DEFAULTS[model_type], **raw}  # (2048 positions for every type, before)
        activation = raw.get("hidden_act", "silu")
        if activation not in SUPPORTED_ACTIVATIONS:
            raise ModelLoadError(f"hidden_act {activation!r} is not supported (the MLP gate is SiLU)")
        try:
            num_heads = int(raw["num_attention_heads"])
            hidden = int(raw["hidden_size"])
            rope, scaling = dict(raw.get("rope_parameters") or {}), dict(raw.get("rope_scaling") or {})
            # rope_scaling's kind wins: a config transformers 5 saved holds rope_parameters {"rope_type":
            # "default", ...}, and the yarn block Qwen2.5's card has users add was dropped without a word
            kind = scaling.get("rope_type") or scaling.get("type") or rope.get("rope_type") or rope.get("type") \
                or "default"
            rope.update(scaling)
            if rope.get("rope_type", rope.get("type")) != kind:  # (a legacy "type" alone is left as it was:
                rope["rope_type"] = kind  # the dict keys the priors, priors.py)
            theta = float(rope.pop("rope_theta", raw.get("rope_theta", 10000.0)))
            missing = [k for k in ROPE_KEYS_NEEDED.get(kind, ()) if k not in rope]
            if missing:  # transformers refuses it too; here it was a KeyError traceback as the model loaded
                raise ModelLoadError(f"rope_scaling {kind!r} lacks {', '.join(missing)}")
            for key in ROPE_KEYS_NEEDED.get(kind, ()):  # (a null or "2" failed in rope.py as the model was built)
                if not is_number(rope[key]) or (key == "factor" and rope[key] <= 0):
                    raise ModelLoadError(f"rope_scaling {kind!r}: {key} must be a {'positive ' * (key == 'factor')}"
                                         f"number (got {rope[key]!r})")
            if float(rope.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))) != 1.0:
                raise ModelLoadError("partial_rotary_factor: a rotation of part of each head is not supported "
                                     "(the whole head would have been rotated)")
            if raw.get("mlp_bias") or (model_type != "qwen2" and raw.get("attention_bias")):
                raise ModelLoadError("attention_bias / mlp_bias: biases on the attention output or the MLP "
                                     "(transformers' Llama puts attention_bias on o_proj too) are not supported")
            if kind == "default":
                rope = {}
            elif kind == "dynamic":  # transformers' dynamic NTK reads max_position_embeddings, not this key
                rope.pop("original_max_position_embeddings", None)
            elif kind in ("llama3", "yarn"):  # as transformers reads them: a top-level value first (Phi-3's
                # place), else the one in rope_scaling, else max_position_embeddings (a KeyError before)
                rope["original_max_position_embeddings"] = int(raw.get(
                    "original_max_position_embeddings",
                    rope.get("original_max_position_embeddings", raw["max_position_embeddings"])))
            positions = int(raw["max_position_embeddings"])
            if kind in ("linear", "yarn"):  # the positions they stretch over, as vLLM counts them (Qwen2.5's
                # card adds yarn x4 of 32,768 to reach 131,072, max_position_embeddings left at 32,768); a yarn
                # config that wrote the stretched count keeps it. A linear one without
                # original_max_position_embeddings is multiplied as vLLM multiplies it, also where it wrote the
                # stretched count (LongChat's 32,768 x 8: past what it was trained on, as in vLLM). (Dynamic
                # NTK's rotation depends on the length: left as written, where it equals transformers'; llama3
                # configs write the stretched count.)
                original = rope["original_max_position_embeddings"] if kind == "yarn" else \
                    int(rope.get("original_max_position_embeddings") or positions)
                positions = max(positions, int(original * min(float(rope["factor"]), MAX_ROPE_FACTOR)))
            eos = raw.get("eos_token_id")
            eos_ids = tuple(int(i) for i in id_list(eos))
            # transformers' MistralConfig bands attention at 4096 tokens where config.json does not say; its
            # Llama has no window; its Qwen2 bands the layers from max_window_layers on, with use_sliding_window
            window = raw.get("sliding_window", 4096 if model_type in ("mistral", "qwen2") else None)
            layers = int(raw["num_hidden_layers"])
            types = raw.get("layer_types")  # where given, transformers' Qwen2 bands the layers it names
            banded = "sliding_attention" in types if isinstance(types, list) else \
                int(raw.get("max_window_layers", 28) or 0) < layers
            if model_type == "llama" or (model_type == "qwen2" and
                                         not (raw.get("use_sliding_window", False) and banded)):
                window = None
            return cls(
                model_type=model_type,
                vocab_size=int(raw["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(raw["intermediate_size"]),
                num_layers=layers,
                num_heads=num_heads,
                num_kv_heads=int(raw.get("num_key_value_heads") or num_heads),
                head_dim=int(raw.get("head_dim") or (hidden // num_heads if num_heads > 0 else 0)),
                max_position_embeddings=positions,
                rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                rope_theta=theta,
                rope_scaling=rope,
                attention_bias=model_type == "qwen2" or bool(raw.get("attention_bias", False)),  # (Qwen2's always)
                tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
                bos_token_id=raw.get("bos_token_id"),
                eos_token_ids=eos_ids,
                sliding_window=int(window) if window else None,
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, ModelLoadError):
                raise
            raise ModelLoadError(f"config.json lacks or has a bad value for {exc}") from exc

    @classmethod
    def from_folder(cls, folder: str | Path) -> "ModelConfig":
        path = Path(folder) / "config.json"
        if not path.is_file():
            raise ModelLoadError(f"{folder}: no config.json (expected a Hugging Face model folder)")
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError) as exc:  # ValueError: not JSON, or not UTF-8
            raise ModelLoadError(f"{path}: unreadable config ({exc})") from exc
        config = cls.from_hf_dict(raw)
        eos = tuple(dict.fromkeys(config.eos_token_ids + generation_eos_ids(Path(folder) / GENERATION_CONFIG)))
        outside = [i for i in eos if not 0 <= i < config.vocab_size]
        if outside:  # no logit row can give them (transformers and vLLM load such folders too)
            log.warning("%s: end-of-sequence ids %s lie outside the vocabulary of %d: left out", folder, outside,
                        config.vocab_size)
        return dataclasses.replace(config, eos_token_ids=tuple(i for i in eos if i not in outside))


def id_list(value) -> list:
    """An `eos_token_id` as Hugging Face configs write it (one id, a list of them, or none) as a list."""
    return list(value) if isinstance(value, list) else [] if value is None else [value]


def read_generation_config(path: Path) -> dict:
    """generation_config.json at `path` as a dict ({} without one); a ModelLoadError where it is unreadable."""
    if not path.is_file():
        return {}
    try:
        raw = json.loads(path.read_text())
        if not isinstance(raw, dict):
            raise ValueError(f"a {type(raw).__name__}, not an object")
    except (OSError, ValueError) as exc:  # ValueError: not JSON, not UTF-8, not an object
        raise ModelLoadError(f"{path}: unreadable ({exc})") from None
    return raw


def generation_eos_ids(path: Path) -> tuple[int, ...]:
    """The `eos_token_id` (an id or a list) of generation_config.json at `path`, () without one. Generation
    ends at these as well as at config.json's: Qwen2.5's instruct models name <|im_end|> there and add
    <|endoftext|> here, and transformers' and vLLM's generate stop at both."""
    eos = read_generation_config(path).get("eos_token_id")
    ids = id_list(eos)
    if not all(type(i) is int for i in ids):
        raise ModelLoadError(f"{path}: eos_token_id must be a token id or a list of them, not {eos!r}")
    return tuple(ids)


def parse_rope_scaling(spec: str) -> tuple[str, float]:
    """'yarn:4' -> ('yarn', 4.0); a one-line UserError for anything else."""
    kind, sep, factor = str(spec).partition(":")
    kind = kind.strip().lower()
    try:
        value = float(factor)
    except ValueError:
        value = 0.0
    if not sep or kind not in ROPE_SCALING_KINDS or not 1.0 < value <= MAX_ROPE_FACTOR:
        raise UserError(f"--rope-scaling takes KIND:FACTOR with KIND one of {', '.join(ROPE_SCALING_KINDS)} "
                        f"and FACTOR > 1 (at most {MAX_ROPE_FACTOR}), e.g. yarn:4 (got {spec!r})")
    return kind, value


def rope_scaling_spec(spec: str) -> str:
    """--rope-scaling as recorded: ' YARN:2.0' -> 'yarn:2'; a one-line UserError where it is not KIND:FACTOR
    (an empty one too: it stretched nothing, silently)."""
    kind, factor = parse_rope_scaling(spec)
    return f"{kind}:{repr(factor).removesuffix('.0')}"  # every digit: the factor as parsed, read back
