"""Chunk scoring, selection and gathering for the retrieval cache (torch; runs on any device).

A chunk is `chunk_size` consecutive tokens; its summary is the mean of its (rotated) keys. A KV head
scores chunk c as the sum, over the query heads of its group and the given query rows, of
query . mean_key[c]. Chunk 0 (the attention sink) and the most recent complete chunk are always kept.
"""
from __future__ import annotations

import torch


def chunk_mean_keys(keys: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """keys: [Hkv, C * chunk_size, D] -> [Hkv, C, D] (float32 means)."""
    hkv, s, d = keys.shape
    return keys.float().view(hkv, s // chunk_size, chunk_size, d).mean(dim=2)


def select_chunks(queries: torch.Tensor, mean_keys: torch.Tensor, num_chunks: int) -> torch.Tensor:
    """queries: [Hq, R, D] (R query rows); mean_keys: [Hkv, C, D]. Returns sorted chunk indices
    [Hkv, num_chunks] (num_chunks <= C)."""
    hq, r, d = queries.shape
    hkv, c, _ = mean_keys.shape
    grouped = queries.float().reshape(hkv, (hq // hkv) * r, d)  # [Hkv, G*R, D]
    scores = torch.bmm(grouped, mean_keys.transpose(1, 2)).sum(dim=1)  # [Hkv, C]
    scores[:, 0] = float("inf")
    scores[:, c - 1] = float("inf")
    chosen = torch.topk(scores, num_chunks, dim=1).indices
    return torch.sort(chosen, dim=1).values


def gather_chunks(data: torch.Tensor, chunk_ids: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """data: [Hkv, S, D], contiguous (pass a whole cache buffer, not a slice of it, or it is copied);
    chunk_ids: [Hkv, k]. Returns [Hkv, k * chunk_size, D], chunks in id order."""
    hkv, s, d = data.shape
    offsets = torch.arange(chunk_size, device=data.device)
    token_ids = (chunk_ids.unsqueeze(-1) * chunk_size + offsets).reshape(hkv, -1)  # [Hkv, k*chunk]
    # index_select over the flattened heads is several times faster than torch.gather on CPU.
    flat_ids = (token_ids + torch.arange(hkv, device=data.device).unsqueeze(1) * s).reshape(-1)
    return data.reshape(hkv * s, d).index_select(0, flat_ids).view(hkv, -1, d)
