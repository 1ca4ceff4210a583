"""An int8 twin of a model for a proposing tier (`retrieval_weights="int8"`, `draft_weights="int8"`).

The retrieval tier runs the target's weights over a partial KV cache, the draft tier a small model, and
both only propose: the target checks their tokens with its own weights and full cache, so the output is
the target's either way. On a CPU their forwards are bound by reading weights (SmolLM2's 212 MB of layer
matrices against about 46 MB of KV at a budget of 2,048; the whole of a 0.5B draft's), so the twin holds
the decoder layers' four matrices as int8 with a float32 scale per output row (kernels/int8.py: half of
bfloat16's bytes) and shares everything else with the model it was made from: embeddings, norms, biases,
the output head (kept as it is: the logits' resolution matters most to acceptance), the rotary table and
a draft's reduced vocabulary. What it costs in acceptance and saves in time: `python
benchmarks/int8_retrieval.py` (docs/speed.md).
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from ..errors import UserError
from ..kernels.decoder import FusedLayers
from ..kernels.int8 import Int8Weight
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


def int8_twin(model: LlamaModel, role: str = "retrieval") -> LlamaModel:
    """A model that computes as `model` does but with its decoder matrices in int8 (see the module's
    docstring); the two share every other tensor. CPU only, one process (no tensor parallelism). `role`:
    the tier it serves ("retrieval" or "draft"), for the messages."""
    flag = f"--{role}-weights"
    if model.device.type != "cpu" or model.tp is not None:
        raise UserError(f"{flag} int8 runs on a CPU in the coordinator's process (the int8 kernel is a CPU "
                        f"kernel); this model is on {model.device}")
    needed, free = twin_bytes(model), available_bytes(model.device)
    if free is not None and needed > free:
        raise UserError(f"{flag} int8 needs {size_text(needed)} more memory, and {size_text(free)} is free; run "
                        f"without it")
    twin = copy.copy(model)
    twin._modules = dict(model._modules)  # (its own table of submodules: the layers are replaced below)
    twin.layers = nn.ModuleList(_int8_layer(layer) for layer in model.layers)
    twin.fused_layers = FusedLayers(twin)
    twin.forward_graphs = None
    twin.quantized = "int8"
    return twin


def _int8_layer(layer: DecoderLayer) -> DecoderLayer:
    twin = copy.copy(layer)
    twin._modules = dict(layer._modules)
    for name in MATRICES:
        source = getattr(layer, name)
        setattr(twin, name, Int8Linear(Int8Weight.of(source.weight), source.bias))
    return twin


def twin_bytes(model: LlamaModel) -> int:
    """What int8_twin(model) adds in memory: its layers' int8 matrices and scales."""
    return sum(getattr(layer, name).weight.numel() + 4 * getattr(layer, name).weight.shape[0]
               for layer in model.layers for name in MATRICES)
