"""An int8 twin of a model for a proposing tier (`retrieval_weights="int8"`, `draft_weights="int8"`).

The retrieval tier runs the target's weights over a partial KV cache, the draft tier a small model, and
both only propose: the target checks their tokens with its own weights and full cache, so the output is
the target's either way. On a CPU their forwards are bound by reading weights (SmolLM2's 212 MB of layer
matrices against about 46 MB of KV at a budget of 2,048; the whole of a 0.5B draft's), so the twin holds
the decoder layers' four matrices as int8 with a float32 scale per output row (kernels/int8.py: half of
bfloat16's bytes), and the output head as int8 too (its logits float32, as the model's are), and shares
everything else with the model it was made from: embeddings, norms, biases, the rotary table and a draft's
reduced vocabulary. The head's int8 rows cost little acceptance and save most where the vocabulary is large
(Qwen2.5-Coder-0.5B's 151,936 x 896 head: a one-token forward 26.6 -> 22.3 ms, expected acceptance at 0.6
0.972 -> 0.971; SmolLM2's 12.4 -> 11.5 ms, 0.968 -> 0.962). What a twin costs in acceptance and saves in
time: `python benchmarks/int8_retrieval.py` (docs/speed.md).
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from ..errors import UserError
from ..kernels.decoder import FusedLayers
from ..kernels.cpu import cpu_kernels
from ..kernels.int8 import K_STEP, Int8Weight, int8_linear
from ..kernels.linear import linear
from ..memory import available_bytes, size_text
from .llama import DecoderLayer, LlamaModel

MATRICES = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


class Int8Linear(nn.Module):
    """y = x W^T (+ bias) with W an Int8Weight; `weight` and `bias` read as nn.Linear's do."""

    def __init__(self, weight: Int8Weight, bias: torch.Tensor | None):
        super().__init__()
        self.weight, self.bias = weight, bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


class Int8Head(nn.Module):
    """The output head with int8 weights: float32 logits, as the model's own head gives them."""

    def __init__(self, weight: Int8Weight):
        super().__init__()
        self.weight = weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return int8_linear(x, self.weight, float_out=True)


def int8_twin(model: LlamaModel, role: str = "retrieval", head: bool = True) -> LlamaModel:
    """A model that computes as `model` does but with its decoder matrices and (with `head`) its output head
    in int8 (see the module's docstring); the two share every other tensor. CPU only, one process (no
    tensor parallelism). `role`: the tier it serves ("retrieval" or "draft"), for the messages."""
    why = twin_refusal(model, head)
    if why is not None:
        raise UserError(f"--{role}-weights int8 {why}; run without it")
    twin = _shallow_copy(model)
    twin.__dict__.pop("_weights_key", None)  # (priors.weights_key's, cached on the model: the head differs)
    twin.layers = nn.ModuleList(_int8_layer(layer) for layer in model.layers)
    if head:
        twin.lm_head = Int8Head(Int8Weight.of(model.lm_head.weight))
    twin.fused_layers = FusedLayers(twin)
    twin.forward_graphs = None
    twin.quantized = "int8"
    object.__setattr__(twin, "twin_of", model)  # (one twin serves every tier that runs these weights; set past
    # nn.Module's __setattr__, which would make the model a submodule of its twin)
    return twin


def twin_refusal(model: LlamaModel, head: bool = True, memory_share: float = 1.0) -> str | None:
    """Why int8_twin(model, head=head) is refused, in words that follow "the int8 twin" (None: it is made): where
    it cannot run well, or would take more than `memory_share` of the memory free."""
    if model.device.type != "cpu" or model.tp is not None:
        where = "split over a tensor-parallel group" if model.tp is not None else f"on {model.device}"
        return (f"runs on a CPU in the coordinator's process (the int8 kernel is a CPU kernel), and this model is "
                f"{where}")
    if cpu_kernels() is None or model.dtype not in (torch.bfloat16, torch.float32):
        # (the reference product widens the whole matrix to float32 at every call: slower than the model itself)
        return (f"needs the CPU kernels and a bfloat16 or float32 model (here: "
                f"{'no kernels' if cpu_kernels() is None else model.dtype})")
    narrow = [(layer.index, name, tuple(getattr(layer, name).weight.shape)) for layer in model.layers
              for name in MATRICES if getattr(layer, name).weight.shape[1] % K_STEP]
    if narrow:
        layer, name, shape = narrow[0]
        return f"needs matrices of a multiple of {K_STEP} columns (the kernel's), and layer {layer}'s {name} is {shape}"
    needed, free = twin_bytes(model, head), available_bytes(model.device)
    if free is not None and needed > memory_share * free:
        share = "" if memory_share == 1 else f" (it may take {memory_share:.0%} of it by default)"
        return f"needs {size_text(needed)} more memory, and {size_text(free)} is free{share}"
    return None


def _shallow_copy(module: nn.Module) -> nn.Module:
    """A module whose tables (submodules, parameters, buffers, hooks) are its own but hold the same tensors:
    replacing a submodule of the copy leaves the original's in place. The tensors stay shared, so a copy is
    never moved or cast (`.to()` would change the original's too; nothing here does)."""
    twin = copy.copy(module)
    for name, value in vars(module).items():
        if isinstance(value, (dict, set)) and name.startswith("_"):  # _modules, _parameters, _buffers, hooks
            setattr(twin, name, copy.copy(value))
    return twin


def _int8_layer(layer: DecoderLayer) -> DecoderLayer:
    twin = _shallow_copy(layer)
    for name in MATRICES:
        source = getattr(layer, name)
        setattr(twin, name, Int8Linear(Int8Weight.of(source.weight), source.bias))
    return twin


def twin_bytes(model: LlamaModel, head: bool = True) -> int:
    """What int8_twin(model, head=head) adds in memory: its int8 matrices and their scales."""
    weights = [getattr(layer, name).weight for layer in model.layers for name in MATRICES]
    weights += [model.lm_head.weight] if head else []
    return sum(w.numel() + 4 * w.shape[0] for w in weights)
