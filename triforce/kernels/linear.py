"""Linear layers for decoding: a CPU bfloat16 kernel for a few rows, torch everywhere else.

`linear(x, weight, bias)` is F.linear, except on an x86-64 CPU for bfloat16 inputs of a few rows
(decode steps and speculative checks), where torch's own bf16 matrix-vector path reads weights at well
under the memory bandwidth. The kernel is csrc/linear_bf16.cpp (built by build.py): with AMX tiles
where the CPU has them (csrc/linear_amx.cpp, at about the same read rate for 1 to 16 rows), else with
vector instructions (AVX512-BF16, or csrc/linear_avx2.cpp), whose rate falls with every row; up to
kernel_max_rows() rows in one call (24; 96 at the avx2 level, 128 at amx), and up to pieced_max_rows()
(192) in pieces of kernel_max_rows(); torch's path past that. `reference_linear` is what the tests compare it
with. Float32 inputs of up to FLOAT32_MAX_ROWS rows go to csrc/linear_f32.cpp on every level (AVX2 + FMA),
where torch's float32 product of a few rows read the weights at a fraction of the memory bandwidth
(benchmarks/float32_rows.py).

`logits_linear` is the output head: float32 logits. The kernel hands over its float32 sums unrounded:
rounded to bfloat16 (8 bits of mantissa, a step of 0.125 at a logit of 20), near-equal candidates tie,
and greedy decoding then depends on how many tokens a forward happened to carry.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .cpu import cpu_kernels, has_amx, native_bf16
from .int8 import Int8Weight, int8_linear

# The vector kernel takes 8 rows of x per pass over a tile of W, so W comes from memory once for any row
# count, but its rate falls with every row (benchmarks/linear_bandwidth.py, Zen 4 AVX512-BF16, 3072 x 576:
# 28 GB/s at 1 row, 16 at 8, 10 at 16, 7.7 at 24, 5.4 at 32, against torch's 10.9, 9.0, 7.4, 6.2, 5.7).
KERNEL_MAX_ROWS = 24
# Without native bfloat16 (the avx2 level) torch's path widens W to float32 a block at a time, and the
# AVX2 kernel stays ahead of it longer: SmolLM2's 30 layers' bfloat16 matrices on the 2-core Zen 3 EPYC,
# kernel time over that path's in two runs, 0.49 and 0.91 at 32 rows, 0.58 and 0.84 at 48, 1.08 and 0.77
# at 64, 1.09 and 0.83 at 96, 1.24 at 128 (`python benchmarks/linear_bandwidth.py --past-rows`;
# benchmarks/results/linear_rows/). So bfloat16 checks and batches of up to 96 rows take it there, and
# each row sums as a one-token step's does, bit for bit: a batch of 8 whose target checks 7 proposals and
# a catch-up token or two each (at 24 rows 3 of 8 greedy requests equalled `ar` in `triforce bench
# --batch 8` at 1K, at 64 5, at 96 all 8).
AVX2_BF16_MAX_ROWS = 96
# The float32 kernel sums a row alike at every row count too, so a batch's float32 rows (its sequences'
# steps and checks) go to it in one call up to this many, and each row sums as its one-token step alone
# does: a request's greedy output in float32, the dtype of exact comparisons, does not depend on its batch
# (past 24 rows torch's product, whose rounding depends on the row count, parted a batch member's logits
# from its solo run's until 2026-12-02). Its time over torch's float32 product, the 2-core Zen 3 EPYC
# (`python benchmarks/linear_bandwidth.py --past-rows --dtype float32`): 0.55x at 8 rows, 0.83x at 24,
# 0.82x at 48, 1.08x at 64 (avx2_epyc_float32.jsonl), and in another run 0.76x at 24, 1.07x at 64, 1.17x
# at 96, 1.06x at 128, 1.27x at 192 (avx2_epyc_float32_rows192.jsonl): a cost paid for the exactness.
FLOAT32_MAX_ROWS = 192
# Where the CPU has AMX tiles the kernel takes its tile path for every number of rows: a row's sums there
# do not depend on the other rows, so a check (and a batch) gives each token what a one-token step gives,
# bit for bit, as the vector paths do (tests/kernels/test_check_rows.py); steps with the vector path below
# 3 rows rounded otherwise. A one-token forward of SmolLM2 in bfloat16 costs what it did on the vector
# path (0.99-1.04x, benchmarks/amx_step.py; docs/amx.md). Up to 128 rows take the tiles, so checks and
# batches stay bit-exact: `triforce bench --batch 8` at 1K greedy gave 3 of 8 requests equal to `ar` with
# 24 or 64 rows, 8 of 8 with 128, and `triforce` ran 77.5 and 107.3 tokens/s at 64, 92.9 and 109.6 at 128
# (two runs each; results/linear_rows/amx_b8_1k_rows*.json). Kernel time over torch's product (oneDNN, on
# tiles too), SmolLM2's 30 layers on a 2-core Xeon (`python benchmarks/linear_bandwidth.py --past-rows`):
# 0.52-0.66 at 16-32 rows, 0.64 at 48, 0.70-0.84 at 64, 0.91-1.02 at 96, 0.96-1.15 at 128 (three runs,
# amx_xeon_pieces.jsonl), when each pass over W served up to 96 rows; one pass per 16 rows had been
# 0.91-1.03 at 64 and 1.08-1.28 at 96-128 (amx_xeon.jsonl). Passes now take at most 64 rows, balanced,
# which took 88-96 rows in 0.71x the time of one pass (linear_amx.cpp).
AMX_BF16_MAX_ROWS = 128
# A batch's bfloat16 rows at a tier (its sequences' steps and checks, each within kernel_max_rows()) go
# through the kernel in pieces of kernel_max_rows() up to this many, at every level: each row then sums as
# its one-token step alone does, so a request's greedy output does not depend on its batch (past the
# kernel's rows torch's product parted them at near-ties: at the avx2 level past 96 rows, docs/batches.md;
# at the avx512 level past 24, where `exactness_fuzz.py --seed 4 --only 52` at 452720f found a batch of
# four whose greedy member parted from `ar` at its second token). Pieces over torch's path, SmolLM2's 30
# layers' matrices (`python benchmarks/linear_bandwidth.py --past-rows --pieces`): on the 2-core Zen 3 EPYC
# (avx2) 1.02x at 128 rows, 1.18x at 192, 1.21x at 256 (results/linear_rows/avx2_epyc_pieces.jsonl); on a
# 2-core Zen 4 (avx512) 0.90x at 32, 0.99x at 48, 1.06x at 64, 1.18x at 96, 1.26x at 128, 1.33x at 192
# (zen4_avx512_pieces.jsonl): a cost paid for the exactness past about 64 rows, as float32's is. At the amx
# level the tiles take 128 rows in one call; pieces past that are unmeasured. The output head's logits
# take the same pieces, where the path past them widens the weights to float32 (`python
# benchmarks/head_rows.py`, SmolLM2's head: pieces over that path 0.28x at 88 rows on the AMX Xeon, 2.4x at
# its avx2 level; 0.11-0.83x at 24-192 rows in two runs at the Zen 4's avx512 level,
# results/linear_rows/zen4_head_rows.jsonl).
PIECED_MAX_ROWS = 192
FLOAT32_BLOCK_ROWS = 1024  # without the kernel: weight rows converted to float32 at a time (2.3 MB at K = 576)


def kernel_max_rows(dtype: torch.dtype = torch.bfloat16) -> int:
    """Most rows of x of `dtype` that `linear` sends to the CPU kernel in one call (0: no kernel here). One
    bound for every weight, so the fused layer loop sends a product where `linear` does: at the amx level a weight
    whose rows are not a multiple of 16 takes the vector path up to 128 rows too (slower past 24 than
    torch's product; no model here has one)."""
    if cpu_kernels() is None:
        return 0
    if dtype != torch.bfloat16:
        return FLOAT32_MAX_ROWS
    if not native_bf16():
        return AVX2_BF16_MAX_ROWS
    return AMX_BF16_MAX_ROWS if has_amx() else KERNEL_MAX_ROWS


def pieced_max_rows(dtype: torch.dtype = torch.bfloat16) -> int:
    """Most rows of x of `dtype` that `linear` sends to the CPU kernel, in pieces of kernel_max_rows()
    (bfloat16: PIECED_MAX_ROWS)."""
    most = kernel_max_rows(dtype)
    return max(most, PIECED_MAX_ROWS) if most and dtype == torch.bfloat16 else most


K_STEP = {torch.bfloat16: 32, torch.float32: 16}  # the kernels' K must be a multiple of this


def kernel_takes(rows: int, weight: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> bool:
    """Whether `linear` sends `rows` rows times this weight, both of `dtype`, to the CPU kernel
    (csrc/linear_bf16.cpp or linear_avx2.cpp for bfloat16, linear_f32.cpp for float32), in pieces of
    kernel_max_rows() where they are more."""
    k = weight.shape[1]
    return (weight.dtype == dtype and weight.device.type == "cpu" and weight.is_contiguous()
            and k > 0 and k % K_STEP[dtype] == 0 and 1 <= rows <= pieced_max_rows(dtype))


def linear(x: torch.Tensor, weight: torch.Tensor | Int8Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x: [n, K] -> [n, N]."""
    if isinstance(weight, Int8Weight):  # (a proposing tier's copy of the target: models/quantized.py)
        return int8_linear(x, weight, bias)
    if x.dim() != 2:  # (the kernels take [n, K])
        return F.linear(x, weight, bias)
    if x.dtype == torch.float32 and kernel_takes(x.shape[0], weight, torch.float32):
        out = _kernel_linear(x, weight, float_out=True)
    elif x.dtype != torch.bfloat16:
        return F.linear(x, weight, bias)
    elif kernel_takes(x.shape[0], weight):
        out = _kernel_linear(x, weight, float_out=False)
    elif x.device.type == "cpu" and not native_bf16():
        # Prefill chunks on a CPU without AVX512-BF16: torch's bfloat16 product is many times slower
        # than float32 there (a 4K prefill on Zen 3: 66 s against 13.5 s), so compute in float32.
        out = _float32_linear(x, weight).to(x.dtype)
    else:
        return F.linear(x, weight, bias)
    return out if bias is None else out + bias


def _kernel_linear(x: torch.Tensor, weight: torch.Tensor, float_out: bool) -> torch.Tensor:
    """x . weight^T through the CPU kernel of x's dtype: bfloat16 in pieces of kernel_max_rows() rows where
    x has more (float_out: its sums handed over as float32, unrounded)."""
    ext, piece = cpu_kernels(), kernel_max_rows(x.dtype)
    if x.dtype == torch.float32:  # (one call: the float32 kernel takes every row `linear` sends it)
        return ext.linear_f32(x, weight)
    if x.shape[0] <= piece:  # a decode step or a check: one piece, no concatenation copy
        return ext.linear_bf16(x, weight, float_out=float_out)
    return torch.cat([ext.linear_bf16(rows, weight, float_out=float_out) for rows in x.split(piece)])


def logits_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x: [n, K] -> float32 [n, N]."""
    if x.dtype == torch.float32:
        return linear(x, weight)
    if mm_widens(x, weight):
        return torch.mm(x, weight.T, out_dtype=torch.float32)
    if not kernel_takes(1, weight):  # (first: on a GPU it loads no CPU kernels)
        return _float32_linear(x, weight)
    if x.shape[0] > pieced_max_rows():
        return _float32_linear(x, weight)
    return _kernel_linear(x, weight, float_out=True)


def mm_widens(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether torch's matrix product itself hands out float32 sums of these half-precision inputs
    (cuBLAS does, with `out_dtype`; torch 2.8 on): the head's weights are then read once, at their size,
    where the block-wise widening below reads them and writes and reads a float32 copy (about five times
    the traffic; SmolLM2's head is a fifth of its weights)."""
    return (x.device.type == "cuda" and x.dtype == weight.dtype and x.dtype in (torch.bfloat16, torch.float16)
            and _MM_TAKES_OUT_DTYPE)


_MM_TAKES_OUT_DTYPE = "dtype" in torch.ops.aten.mm.overloads()


def _float32_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x . weight^T as float32 sums, never rounded to x's dtype (for logits: F.linear(x, w).float() rounds
    them to bfloat16 first, and greedy decoding then turns on near-ties). The weight goes to float32 a block
    of rows at a time, so the copy stays in cache instead of writing the whole matrix out at twice its size."""
    x32 = x.float()
    out = x32.new_empty(x.shape[0], weight.shape[0])
    # On a GPU, bigger blocks (fewer launches); a whole copy of a 128K-row head would be gigabytes.
    rows = FLOAT32_BLOCK_ROWS * (16 if weight.device.type == "cuda" else 1)
    for start in range(0, weight.shape[0], rows):
        block = weight[start:start + rows]
        torch.mm(x32, block.float().T, out=out[:, start:start + block.shape[0]])
    return out


def reference_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """float32 accumulation, rounded once to x's dtype."""
    return (x.float() @ weight.float().T).to(x.dtype)
