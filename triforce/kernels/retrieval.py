"""Chunk scoring, selection and gathering for the retrieval cache (torch; runs on any device).

A chunk is `chunk_size` consecutive tokens; its summary is the mean of its (rotated) keys. A KV head
scores chunk c as the sum, over the query heads of its group and the given query rows, of
query . mean_key[c]. Chunk 0 (the attention sink) and the most recent complete chunk are always kept.
"""
from __future__ import annotations

import torch


def chunk_mean_keys(keys: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """keys: [..., C * chunk_size, D] -> [..., C, D] means (accumulated in float32, returned in keys' dtype)."""
    *lead, s, d = keys.shape
    return keys.float().reshape(*lead, s // chunk_size, chunk_size, d).mean(dim=-2).to(keys.dtype)


def select_chunks(queries: torch.Tensor, mean_keys: torch.Tensor, num_chunks: int) -> torch.Tensor:
    """queries: [Hq, R, D] (R query rows); mean_keys: [Hkv, C, D]. Returns chunk indices [Hkv, num_chunks]
    (num_chunks <= C), in no particular order."""
    hq, r, d = queries.shape
    hkv, c, _ = mean_keys.shape
    # sum over rows of q . m equals (sum of q) . m: one matrix-vector product per KV head.
    summed = queries.reshape(hkv, (hq // hkv) * r, d).float().sum(dim=1)  # [Hkv, D]
    scores = torch.bmm(mean_keys, summed.to(mean_keys.dtype).unsqueeze(-1)).squeeze(-1).float()  # [Hkv, C]
    scores[:, 0] = float("inf")
    scores[:, c - 1] = float("inf")
    return torch.topk(scores, num_chunks, dim=1, sorted=False).indices


def chunk_token_ids(chunk_ids: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """chunk_ids: [Hkv, k] -> the token indices of those chunks, [Hkv, k * chunk_size]."""
    offsets = torch.arange(chunk_size, device=chunk_ids.device)
    return (chunk_ids.unsqueeze(-1) * chunk_size + offsets).reshape(chunk_ids.shape[0], -1)


def gather_tokens(token_ids: torch.Tensor, *buffers: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """token_ids: [Hkv, T] (each head its own tokens); buffers: [Hkv, S, D] each, contiguous (pass whole
    cache buffers, not slices of them, or they are copied). Returns one [Hkv, T, D] per buffer."""
    hkv, s, d = buffers[0].shape
    # index_select over the flattened heads is several times faster than torch.gather on CPU.
    flat_ids = (token_ids + torch.arange(hkv, device=token_ids.device).unsqueeze(1) * s).reshape(-1)
    return tuple(b.view(hkv * s, d).index_select(0, flat_ids).view(hkv, -1, d) for b in buffers)
