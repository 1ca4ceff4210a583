"""All decoder layers of one bfloat16 CPU forward in one call (csrc/decoder_bf16.cpp).

models/llama.py runs a layer as about 20 Python-side torch calls around the kernels. `FusedLayers` runs
the same calls in C++ where every step of every layer takes the CPU kernels anyway (so both paths give
bit-identical results) and the cache keeps each layer's keys and values in a buffer that the new tokens
are written into at an offset (`KVCache.layer_buffers`: the full cache and the static retrieval cache).
A batch of sequences runs as one call too: the weights are read once per layer for all of them, and each
sequence attends over its own cache's buffers. Elsewhere, and with tensor parallelism, the model runs its
layers one by one.
"""
from __future__ import annotations

import torch

from . import attention, int8, linear
from .cpu import cpu_kernels, native_bf16
from .int8 import Int8Weight

UNLIMITED_ROWS = 1 << 30


class FusedLayers:
    def __init__(self, model):
        """model: a LlamaModel with its weights loaded (LlamaModel.finalize builds this)."""
        cfg = model.config
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.eps, self.scale = cfg.rms_norm_eps, cfg.head_dim ** -0.5
        self.weights: list[torch.Tensor] = []
        self.max_rows = 0  # most new tokens per forward it takes, all sequences together; 0: never
        if model.tp is not None or model.dtype != torch.bfloat16 or model.device.type != "cpu" or cpu_kernels() is None:
            return
        no_bias = torch.empty(0, dtype=model.dtype)
        no_scale = torch.empty(0, dtype=torch.float32)
        matrices = []
        for layer in model.layers:  # the order csrc/decoder_bf16.cpp reads them in
            mats = (layer.qkv_proj.weight, layer.o_proj.weight, layer.gate_up_proj.weight, layer.down_proj.weight)
            tensors = [w.q if isinstance(w, Int8Weight) else w for w in mats]
            self.weights += [layer.input_norm.weight, tensors[0],
                             no_bias if layer.qkv_proj.bias is None else layer.qkv_proj.bias, tensors[1],
                             layer.post_attention_norm.weight, tensors[2], tensors[3],
                             *(w.scale if isinstance(w, Int8Weight) else no_scale for w in mats)]
            matrices += mats
        if all(int8.weight_fits(w) if isinstance(w, Int8Weight) else linear.kernel_takes(1, w)
               for w in matrices):  # (attention's rows are checked per sequence)
            # `linear` takes the kernel in pieces up to pieced_max_rows() and torch's product past them, as the
            # C++ loop does where bfloat16 is native; without it, past the pieces it computes in float32,
            # which the loop does not mirror: the layer loop runs those forwards.
            self.max_rows = UNLIMITED_ROWS if native_bf16() else linear.pieced_max_rows()

    def __call__(self, x: torch.Tensor, caches, masks, rows: list[int], cos: torch.Tensor,
                 sin: torch.Tensor) -> torch.Tensor | None:
        """x: [n, hidden] after the embedding: the rows of len(caches) sequences one after another (rows[i]
        each), between every cache's begin(step) and end(); masks: their steps'; cos, sin: [n, head_dim],
        each row's position's. The hidden states after the
        last layer, or None where this forward must take the layer-by-layer path."""
        n = x.shape[0]
        group = self.num_heads // self.num_kv_heads
        if n > self.max_rows or x.dtype != torch.bfloat16:
            return None
        keys, values, offsets, last_queries = [], [], [], []
        for cache, r in zip(caches, rows):
            buffers = cache.layer_buffers()
            if buffers is None or not attention.kernel_takes(group * r, buffers.keys[0], buffers.values[0]):
                return None
            keys += buffers.keys
            values += buffers.values
            offsets += buffers.offsets
            last_query = buffers.last_query
            if last_query is None:
                last_query = x.new_empty(len(buffers.keys), self.num_heads, 1, self.head_dim)
            last_queries.append(last_query)
        return cpu_kernels().decoder_layers_bf16(
            x, self.weights, keys, values, offsets, rows, cos, sin, self.num_heads, self.num_kv_heads, self.eps,
            self.scale, linear.kernel_max_rows(), linear.pieced_max_rows(), last_queries, list(masks))
