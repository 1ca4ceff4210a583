"""Chunk scoring, selection and gathering for the retrieval cache (torch; runs on any device).

A chunk is `chunk_size` consecutive tokens; its summary is the mean of its (rotated) keys. A KV head
scores chunk c as the sum, over the query heads of its group and the given query rows, of
query . mean_key[c]. Chunk 0 (the attention sink) and the most recent complete chunk are always kept.
A static rebuild copies only the chunks its new choice brings in, over those it drops (`refill_chunks`).
"""
from __future__ import annotations

import torch

from .cpu import cpu_kernels
from .linear import linear


def chunk_mean_keys(keys: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """keys: [..., C * chunk_size, D] -> [..., C, D] means (accumulated in float32, returned in keys' dtype).
    Summed one position of the chunk at a time into a float32 [..., C, D]: a float32 copy of all the keys
    was fresh memory each call, and its page faults made the means of four restored 8K prompts take 2.9 s
    of a 14.3 s request in a batch of four on the Zen 4; 0.65 s of 12.4 since (`python
    benchmarks/retrieval_build_cost.py`, one run each). Bfloat16 keys on a CPU with the kernels: the same sums
    in one pass over the keys (csrc/retrieval_bf16.cpp, bit for bit these)."""
    *lead, s, d = keys.shape
    if keys.dtype == torch.bfloat16 and keys.device.type == "cpu" and (ext := cpu_kernels()) is not None:
        rows = keys.reshape(-1, s, d)  # a view where each row's keys are contiguous (a cache's, sliced)
        rows = rows if rows.stride(-2) == d and rows.stride(-1) == 1 else rows.contiguous()
        return ext.chunk_means_bf16(rows, chunk_size).view(*lead, s // chunk_size, d)
    by_position = keys.reshape(*lead, s // chunk_size, chunk_size, d)
    sums = by_position[..., 0, :].to(torch.float32, copy=True)  # (never a view of float32 keys)
    for i in range(1, chunk_size):
        sums += by_position[..., i, :]
    return sums.div_(chunk_size).to(keys.dtype)


def select_chunks(queries: torch.Tensor, mean_keys: torch.Tensor, num_chunks: int) -> torch.Tensor:
    """queries: [..., Hq, R, D] (R query rows); mean_keys: [..., Hkv, C, D] (leading dims alike: layers chosen
    for in one call). Returns chunk indices [..., Hkv, num_chunks] (num_chunks <= C), in no particular order."""
    *lead, hq, r, d = queries.shape
    hkv, c = mean_keys.shape[-3], mean_keys.shape[-2]
    # sum over rows of q . m equals (sum of q) . m: one matrix-vector product per KV head.
    summed = queries.reshape(-1, hkv, (hq // hkv) * r, d).float().sum(dim=2).to(mean_keys.dtype).reshape(-1, d)
    means = mean_keys.reshape(-1, c, d)  # [layers x Hkv, C, D]
    if means.device.type == "cpu":  # the decode kernel per head: torch's bmm of one column read the means
        # at a fifth of its rate (a static rebuild of SmolLM2 at 16K: 13 ms of scoring -> 3, AVX2 EPYC)
        scores = torch.stack([linear(summed[i:i + 1], means[i])[0] for i in range(means.shape[0])]).float()
    else:
        scores = torch.bmm(means, summed.unsqueeze(-1)).squeeze(-1).float()  # [layers x Hkv, C]
    scores[:, 0] = float("inf")
    scores[:, c - 1] = float("inf")
    return torch.topk(scores, num_chunks, dim=1, sorted=False).indices.reshape(*lead, hkv, num_chunks)


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


def refill_chunks(buffers: tuple[torch.Tensor, torch.Tensor], held: torch.Tensor | None, chosen: torch.Tensor,
                  sources: tuple[torch.Tensor, torch.Tensor], chunk_size: int) -> torch.Tensor:
    """Makes the first k chunk slots of `buffers` ([..., cap, D] keys and values, contiguous) hold the chunks
    `chosen` ([..., k], distinct in each row) of `sources` ([..., S, D], contiguous), where they held `held`
    (as chosen; None: nothing): only the chosen chunks not held are copied, each over a slot whose chunk was
    not chosen, so a rebuild costs what the choice changed. Slots come in no order; attention does not
    care. Every layer and KV head in one copy per buffer (on a CPU with the kernels, in one call per buffer
    that copies each chunk whole). Returns what the slots hold now."""
    rows, k = chosen.numel() // chosen.shape[-1], chosen.shape[-1]
    chosen = chosen.reshape(rows, k)
    if held is None:
        held = chosen.clone()
        row_ids = torch.arange(rows, device=chosen.device).repeat_interleave(k)
        slots = torch.arange(k, device=chosen.device).repeat(rows)
        entering = chosen.reshape(-1)
    else:
        held = held.reshape(rows, k).clone()
        count = int(max(held.max(), chosen.max())) + 1
        wanted = torch.zeros(rows, count, dtype=torch.bool, device=chosen.device).scatter_(1, chosen, True)
        kept = torch.zeros_like(wanted).scatter_(1, held, True)
        leaving, new = ~wanted.gather(1, held), ~kept.gather(1, chosen)  # as many in each row (k distinct)
        entering = chosen[new]  # row-major: row by row, as leaving's slots below
        row_ids, slots = leaving.nonzero(as_tuple=True)
        held[leaving] = entering
    d, cap, size = buffers[0].shape[-1], buffers[0].shape[-2], sources[0].shape[-2]
    if buffers[0].device.type == "cpu" and (ext := cpu_kernels()) is not None:  # one copy per chunk, no index of
        ids = [t.contiguous() for t in (row_ids, slots, entering)]  # every row (csrc/retrieval_bf16.cpp)
        for buffer, source in zip(buffers, sources):
            ext.copy_chunks(buffer.view(rows, cap, d), source.view(rows, size, d), *ids, chunk_size)
        return held
    offsets = torch.arange(chunk_size, device=chosen.device)
    src = ((row_ids * size + entering * chunk_size).unsqueeze(1) + offsets).reshape(-1)
    dst = ((row_ids * cap + slots * chunk_size).unsqueeze(1) + offsets).reshape(-1)
    for buffer, source in zip(buffers, sources):
        buffer.view(-1, d).index_copy_(0, dst, source.view(-1, d).index_select(0, src))
    return held
