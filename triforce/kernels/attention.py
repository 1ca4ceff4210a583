"""Attention of n new queries over a key/value sequence whose last n entries are those same tokens.

Every cache policy hands the model keys laid out with the new tokens last (cache/base.py), so one rule
covers prefill chunks, decode, chain checks and trees: `mask` [n, m] (triforce/step.py) says which of the
last m keys each new query sees, every earlier key is seen by all; without a mask (a chain) query i
(0-based among the n new ones) sees keys [0, S - n + i].

Paths: `flash_attn` on CUDA when installed, on Ampere or newer (import-guarded; never run in CI, which has
no GPU): causal for
chains, and for a mask an unmasked flash pass over the keys before the last m merged with a small masked
pass over those m (a mask over every key, as a CUDA graph's forward has, takes masked SDPA); on a CPU with
the kernels (kernels/cpu.py: AVX2, AVX512-BF16 or AMX), the csrc decode-attention kernel for bfloat16 decode
steps and speculative checks (head dim 64 or 128), which reads a cold KV cache faster than SDPA and, with
AMX tiles, checks a chain of 7 tokens in about the time of one (benchmarks/attention_bandwidth.py), and
its AVX2 range pass for float32 ones (csrc/attention_f32.cpp, every level), which, unlike torch's paths,
sums a check's row as a one-token step sums it (benchmarks/check_rows.py --dtype float32), both in pieces
of new tokens past the kernel's rows (prefill chunks, large trees; not bfloat16 at the AVX2 level); on CPU
otherwise, except float32 under DENSE_MASK_ENTRIES, torch's flash attention in an unmasked pass and a causal
(or masked) pass over the last keys, merged by log-sum-exp (`_split_attention`); on CUDA in float32 for a
few rows, plain matmuls and a softmax (`_matmul_attention`); masked SDPA elsewhere.
`reference_attention` is the plain loop that the tests compare them all against.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from .cpu import cpu_kernels, native_bf16

# Rows are query heads per KV head x new tokens; the kernel takes up to 128 (csrc/flash_decode.h), 42 new
# tokens for SmolLM2. Its cost grows with the rows (vector dot products), but it stays ahead of torch's
# paths up to there: over SmolLM2's 30 layers at 8K on Zen 4, 48 rows took 49 ms against SDPA's 107 and
# 126 rows 84 ms against 246; at the AVX2 level 126 rows took 198 ms against float32 flash's 369.
KERNEL_MAX_ROWS = 128

# Up to this many mask entries (query heads per KV head x new tokens x keys), one masked float32 SDPA pass
# beats the split one (two flash passes and their merge, about ten ops). One core of the AVX2 EPYC: 1.6-3.5x
# faster up to 2.5e4 entries (1.1-5.6x for the tests' tiny heads), 1.16x at 5e4, and 1.02-1.13x slower from
# 2e5 on (an 8K prefill chunk's dense mask cost as much as its attention). `benchmarks/attention_paths.py`;
# bfloat16 (CPUs with native bfloat16) keeps the split pass: not measured there.
DENSE_MASK_ENTRIES = 1 << 16

# More rows than that (a prefill chunk) run the kernel in pieces of new tokens (takes_kernel_in_pieces),
# where torch's CPU flash pass took about twice as long: a 512-token chunk of SmolLM2 over 4,096 keys took
# 15.6 ms a layer against 32.4 on the 2-core Zen 4 (1.6-2.1x from 512 to 32K keys), its 7,936-token prefill
# 13.9 s against 21.6 and 32,000 tokens 159 s against 269 (`python benchmarks/prefill_attention.py`, which
# turns this off to compare). float32 takes them for exactness (a row sums as a step sums it) too.
KERNEL_IN_PIECES = True

# On CUDA, float32 SDPA takes the memory-efficient kernel, which gives a KV head's few query rows one block
# that walks every key: about 1 ms a layer at 8K keys on an H200, 93% of a float32 decode step (27 tokens/s
# with CUDA graphs). Three plain ops (scores, masked softmax, weighted sum) spread the keys over the whole
# GPU instead; `_matmul_attention` takes up to this many query rows per KV head (a prefill chunk keeps SDPA),
# and scores of up to MATMUL_MAX_SCORES entries (KV heads x rows x keys; 512 MiB in float32).
MATMUL_MAX_ROWS = 256
MATMUL_MAX_SCORES = 1 << 27


def kernel_max_rows() -> int:
    """Most query rows per KV head that `attention` sends to the CPU kernel (0: no kernel here)."""
    return 0 if cpu_kernels() is None else KERNEL_MAX_ROWS


def kernel_takes(rows: int, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether `attention` sends keys and values k, v [Hkv, S, D] with `rows` query rows per KV head
    (query heads per KV head x new tokens) to the CPU kernel."""
    d = k.shape[-1]
    return (k.dtype in (torch.bfloat16, torch.float32) and v.dtype == k.dtype and k.device.type == "cpu"
            and d in (64, 128) and k.stride(-1) == 1 and k.stride(-2) == d and v.stride() == k.stride() and rows <= kernel_max_rows())


def _flash_attn():  # pragma: no cover - GPU only
    """flash-attn's flash_attn_func, from 2.1 on (before, its causal mask is aligned top-left where queries
    are fewer than keys: a prefill chunk or a chain check would attend wrongly, silently); None without it,
    or where it does not import (a build for another torch: undefined symbols)."""
    try:
        import flash_attn
        from flash_attn import flash_attn_func
    except Exception:  # (the CPU path: none)
        return None
    version = tuple(int(x) for x in flash_attn.__version__.split(".")[:2] if x.isdigit())
    return flash_attn_func if version >= (2, 1) else None


_flash_attn_func = _flash_attn()


def causal_tail_mask(n: int, s: int, device) -> torch.Tensor:
    """[n, s] bool, True where query i (of the last n) may attend key j."""
    rows = torch.arange(n, device=device).unsqueeze(1) + (s - n)
    return torch.arange(s, device=device).unsqueeze(0) <= rows


def visible_keys(n: int, s: int, mask: torch.Tensor | None, device) -> torch.Tensor:
    """[n, s] bool: the keys each of the n new queries sees, under `mask` [n, m] over the last m keys
    (None: the causal tail)."""
    if mask is None:
        return causal_tail_mask(n, s, device)
    visible = torch.ones(n, s, dtype=torch.bool, device=device)
    visible[:, s - mask.shape[1]:] = mask
    return visible


def grouped_tail_mask(n: int, s: int, g: int, device: torch.device) -> torch.Tensor:
    """causal_tail_mask repeated for the g query heads of a KV head: [g*n, s]. Every layer of a forward
    asks for the same one: on a CPU it is built once per forward (an 8K prefill built it 480 times: 0.9 s);
    on a GPU, where filling it is cheap, per layer: two kept there (a 512-token chunk of a 128K prompt's,
    512 MB each for a model of 4 query heads a KV head) stayed allocated after the request, and memory
    admission counted them as used."""
    if device.type == "cpu":
        return _kept_tail_mask(n, s, g, device)
    return causal_tail_mask(n, s, device).repeat(g, 1)


@functools.lru_cache(maxsize=2)
def _kept_tail_mask(n: int, s: int, g: int, device) -> torch.Tensor:
    return causal_tail_mask(n, s, device).repeat(g, 1)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
              mask: torch.Tensor | None = None) -> torch.Tensor:
    """q: [Hq, n, D]; k, v: [Hkv, S, D] with the n new tokens last; mask: [n, m] bool over the last m
    keys, or None for a chain. Returns [Hq, n, D].

    Grouped-query attention without repeating K/V: the G query heads that share a KV head are folded
    into the query-length axis, so each KV head is read once.
    """
    hq, n, d = q.shape
    hkv, s, _ = k.shape
    q_dtype = q.dtype
    if takes_flash_attn(q, mask, s):
        if mask is not None:
            return _split_attention(q, k, v, scale, mask, _cuda_flash).to(q_dtype)
        # flash-attn aligns the causal mask to the bottom right when n < S, which is our rule.
        out = _flash_attn_func(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                               softmax_scale=scale, causal=True)
        return out[0].transpose(0, 1)
    if q.dtype == k.dtype and kernel_takes((hq // hkv) * n, k, v):
        return _kernel(q, k, v, scale, mask)
    if takes_kernel_in_pieces(q, k, v, mask):
        return _kernel_in_pieces(q, k, v, scale, mask)
    if q.device.type == "cpu" and not native_bf16() and q.dtype == torch.bfloat16:
        # Without AVX512-BF16, torch's bfloat16 attention is far slower than float32 (prefill chunks).
        q, k, v = q.float(), k.float(), v.float()
    g = hq // hkv
    small = q.dtype == torch.float32 and g * n * s <= DENSE_MASK_ENTRIES
    if n > 1 and q.device.type == "cpu" and _flash_cpu is not None and not small:
        return _split_attention(q, k, v, scale, mask, _cpu_flash).to(q_dtype)
    qg = q.reshape(1, hkv, g * n, d)  # rows ordered (group member, query index)
    if mask is not None:
        attn_mask = visible_keys(n, s, mask, q.device).repeat(g, 1)
    else:
        attn_mask = None if n == 1 else grouped_tail_mask(n, s, g, q.device)  # [g*n, S], never written to
    if takes_matmul(q, g * n, s, hkv):
        out = _matmul_attention(qg, k, v, scale, attn_mask)
    else:  # 4-D inputs: torch's fused CPU attention kernel takes them; 3-D ones fall back to a slow path
        out = F.scaled_dot_product_attention(qg, k.unsqueeze(0), v.unsqueeze(0), attn_mask=attn_mask, scale=scale)
    return out.reshape(hq, n, d).to(q_dtype)


def _kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, mask: torch.Tensor | None):
    """The CPU kernel's attention of q [Hq, n, D] (rows within kernel_max_rows) in q's dtype."""
    if q.dtype == torch.float32:
        return cpu_kernels().decode_attention_f32(q, k, v, scale, mask)
    return cpu_kernels().decode_attention_bf16(q, k, v, scale, True, mask)


def takes_kernel_in_pieces(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> bool:
    """Whether `attention` runs the CPU kernel in pieces of new tokens (more rows than one call takes): in
    float32, and in bfloat16 where the CPU multiplies it natively; at the AVX2 level the kernel widens
    bfloat16 to float32 and ran level with torch's float32 flash pass (0.91-1.16x a layer, 1.0x an 8K
    prefill, the 2-core Zen 4 at that level), which stays. Never for a mask that lets a token see a later one (pieces drop those keys)."""
    return (KERNEL_IN_PIECES and q.dtype == k.dtype and (q.dtype == torch.float32 or native_bf16())
            and kernel_takes(q.shape[0] // k.shape[0], k, v) and not _sees_later_tokens(mask))


def _sees_later_tokens(mask: torch.Tensor | None) -> bool:
    """Whether a mask [n, m] lets a new token see one after it (never a chain's or a tree's, whose nodes
    come after their ancestors)."""
    return mask is not None and bool(mask[:, mask.shape[1] - mask.shape[0]:].triu(1).any())


def _kernel_in_pieces(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                      mask: torch.Tensor | None) -> torch.Tensor:
    """`attention` of more new tokens than one kernel call takes (a prefill chunk: 1,536 rows for SmolLM2's
    512 tokens; a tree of over 128 / G nodes) by the CPU kernel, a call per piece of new tokens over the keys up
    to the piece's last, its rows of the mask cut there. A row sums in one order however many keys follow
    the ones it sees (the kernel's key ranges sit at fixed offsets), so every token gets what it gets in one
    call, and a chain's what a one-token step gives it, bit for bit."""
    n, s = q.shape[1], k.shape[1]
    piece = kernel_max_rows() // (q.shape[0] // k.shape[0])
    parts = []
    for a in range(0, n, piece):
        after = max(0, n - a - piece)  # new tokens past the piece: keys none of its rows sees
        rows = None if mask is None else mask[a:n - after, :mask.shape[1] - after]
        parts.append(_kernel(q[:, a:n - after], k[:, :s - after], v[:, :s - after], scale, rows))
    return torch.cat(parts, dim=1)


def takes_flash_attn(q: torch.Tensor, mask: torch.Tensor | None, keys: int) -> bool:
    """Whether `attention` runs flash-attn: installed, q on a CUDA GPU it runs on in half precision, and no
    mask over all `keys` keys (a CUDA graph's, which SDPA takes)."""
    return (_flash_attn_func is not None and q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)
            and (mask is None or mask.shape[1] < keys) and ampere_or_newer(q.device))


@functools.cache
def ampere_or_newer(device: torch.device) -> bool:
    """Whether flash-attn 2 runs on the GPU: compute capability 8.0 or later (on a T4 or V100 it raised
    "FlashAttention only supports Ampere GPUs or newer" in every forward; SDPA runs there instead)."""
    return torch.cuda.get_device_capability(device)[0] >= 8


def takes_matmul(q: torch.Tensor, rows: int, keys: int, kv_heads: int) -> bool:
    """Whether `attention` computes q's rows (query heads per KV head x new tokens) over `keys` keys as
    `_matmul_attention`."""
    return (q.is_cuda and q.dtype == torch.float32 and rows <= MATMUL_MAX_ROWS
            and kv_heads * rows * keys <= MATMUL_MAX_SCORES)


def _matmul_attention(qg: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                      attn_mask: torch.Tensor | None) -> torch.Tensor:
    """SDPA's result in plain ops: qg [1, Hkv, R, D] over k, v [Hkv, S, D] under attn_mask [R, S] (None:
    every key). Returns [1, Hkv, R, D]."""
    scores = torch.matmul(qg[0] * scale, k.transpose(1, 2))  # [Hkv, R, S]
    if attn_mask is not None:
        scores.masked_fill_(~attn_mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v).unsqueeze(0)


# torch's CPU flash attention, which also returns each row's log-sum-exp (internal; absent: the masked path)
_flash_cpu = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _cpu_flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool):
    """torch's CPU flash attention: (out [Hq, n, D] float32, lse [Hq, n, 1]). Unmasked, a KV head's query
    heads are folded into rows so each KV head is read once; causal (the new tokens among themselves,
    a few keys) repeats the keys per query head instead."""
    hq, n, d = q.shape
    hkv = k.shape[0]
    g = hq // hkv
    if causal:
        out, lse = _flash_cpu(q[None], *(t.repeat_interleave(g, dim=0)[None] for t in (k, v)), 0.0, True, scale=scale)
        return out[0].float(), lse[0].unsqueeze(-1)
    out, lse = _flash_cpu(q.reshape(1, hkv, g * n, d), k[None], v[None], 0.0, False, scale=scale)
    return out.reshape(hq, n, d).float(), lse.reshape(hq, n, 1)


def _cuda_flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool):  # pragma: no cover
    """flash-attn's pass with its log-sum-exp: (out [Hq, n, D] float32, lse [Hq, n, 1])."""
    out, lse, _ = _flash_attn_func(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                   softmax_scale=scale, causal=causal, return_attn_probs=True)
    return out[0].transpose(0, 1).float(), lse[0].unsqueeze(-1)


def _masked_tail(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, mask: torch.Tensor):
    """Attention of q [Hq, n, D] over a few keys k, v [Hkv, m, D] under mask [n, m], in float32 torch:
    (out [Hq, n, D], lse [Hq, n, 1]). Every row sees at least itself (Step checks it)."""
    g = q.shape[0] // k.shape[0]
    scores = q.float() @ k.repeat_interleave(g, dim=0).float().transpose(1, 2) * scale  # [Hq, n, m]
    scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    return torch.exp(scores - lse) @ v.repeat_interleave(g, dim=0).float(), lse


def _split_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, mask: torch.Tensor | None,
                     flash) -> torch.Tensor:
    """`attention` without a dense mask: the keys before the last m (= n without a mask) in one unmasked
    flash pass, the last m in a causal flash pass (a chain) or a small masked one (a tree), merged by
    their log-sum-exps. `flash` is a backend pass (`_cpu_flash`, `_cuda_flash`). On CPU the dense masked
    form built and converted a [G*n, S] mask every layer: as long as the attention itself in an 8K
    prefill. Returns float32."""
    n, s = q.shape[1], k.shape[1]
    past = s - (n if mask is None else mask.shape[1])
    tail_k, tail_v = k[:, past:], v[:, past:]
    out_new, lse_new = (flash(q, tail_k, tail_v, scale, True) if mask is None
                        else _masked_tail(q, tail_k, tail_v, scale, mask))
    if past == 0:
        return out_new
    out_past, lse_past = flash(q, k[:, :past], v[:, :past], scale, False)
    top = torch.maximum(lse_past, lse_new)
    w_past, w_new = torch.exp(lse_past - top), torch.exp(lse_new - top)
    return (out_past * w_past + out_new * w_new) / (w_past + w_new)


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                        mask: torch.Tensor | None = None) -> torch.Tensor:
    """Loop-based float32 reference of `attention` for tests, with its own rule of which keys a query sees
    (not visible_keys, which the paths it checks use): new query i sits at key s - n + i and sees every
    key before the last m = mask.shape[1], and among those m the ones its mask row allows (None: the keys
    up to its own)."""
    hq, n, d = q.shape
    hkv, s, _ = k.shape
    m = n if mask is None else mask.shape[1]
    rows = None if mask is None else mask.cpu().tolist()
    seen = [[j for j in range(s) if j < s - m or (j <= s - n + i if rows is None else rows[i][j - (s - m)])]
            for i in range(n)]
    out = torch.empty(hq, n, d, dtype=torch.float32)
    for h in range(hq):
        kh, vh = k[h // (hq // hkv)].float().cpu(), v[h // (hq // hkv)].float().cpu()
        for i in range(n):
            weights = torch.softmax((kh[seen[i]] @ q[h, i].float().cpu()) * scale, dim=0)
            out[h, i] = weights @ vh[seen[i]]
    return out.to(q.dtype)
