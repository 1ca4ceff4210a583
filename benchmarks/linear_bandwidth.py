"""The CPU linear kernel against torch, by rows of x (activation rows: a decode step is 1, a check of a
chain gamma + 1, a batch the sum of its sequences').

    python benchmarks/linear_bandwidth.py     # prints JSON: GB/s per number of activation rows
    python benchmarks/linear_bandwidth.py --past-rows [--rows 8 24 32 48 64 96 128 192] [--dtype float32]
                                          [--pieces]

Default: weight-read bandwidth of decode-sized bfloat16 linears, F.linear against the kernel's vector
path (and its AMX tile path where the CPU has one). 60 distinct 3072x576 matrices (SmolLM2's gate/up
shape, 212 MB in all) so the weights come from memory, not cache; best of 5 passes. Rows of x: 1, 2,
4 to 8, 16, 24 and 32.

--past-rows: where the kernel stops beating the path `linear` takes past the kernel's rows
(kernels/linear.py sets its row bounds from this). SmolLM2's 30 layers' matrices (qkv 960 x 576, o 576
x 576, gate_up 3072 x 576, down 576 x 1536; 212 MB in bfloat16, each read from memory on every pass)
times n rows of x, through the kernel (linear_bf16: its tiles on an AMX CPU, else its vector path; or
linear_f32) and through that path
(without native bfloat16: W widened to float32 a block at a time, then torch's float32 product; with
it, and for float32, torch's own product), the two taking turns. A JSON line per row count: the median
ms of each and kernel / torch. On the 2-core Zen 3 EPYC (results/linear_rows/avx2_epyc_*.jsonl, two
bfloat16 runs and one float32; these machines are noisy, so compare within a run), bfloat16 0.41x at 8
rows, 0.68x at 24, 0.49-0.91x at 32, 0.58-0.84x at 48, 0.77-1.08x at 64, 0.83-1.09x at 96, 1.24x at
128; float32 0.55x at 8, 0.83x at 24, 0.93x at 32, 0.82x at 48, 1.08x at 64.

--pieces: the kernel in pieces of kernel_max_rows() (what `linear` sends it up to pieced_max_rows()),
not in one call (results/linear_rows/avx2_epyc_pieces.jsonl).
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F

from triforce.kernels import linear as linear_module
from triforce.kernels.cpu import cpu_kernels, cpu_model, kernel_path, native_bf16

SMOLLM2_SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536))


def bandwidth(fn, weights) -> float:
    fn(weights[0])
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for w in weights:
            fn(w)
        best = min(best, time.perf_counter() - start)
    return round(sum(w.numel() * w.element_size() for w in weights) / best / 1e9, 2)


def bandwidth_by_rows() -> None:
    weights = [torch.randn(3072, 576).bfloat16() for _ in range(60)]
    kernel = cpu_kernels()
    rows = {}
    for n in (1, 2, 4, 5, 6, 7, 8, 16, 24, 32):
        x = torch.randn(n, 576).bfloat16()
        rows[n] = {"torch_GBps": bandwidth(lambda w: F.linear(x, w), weights)}
        if kernel is not None:
            rows[n]["vector_kernel_GBps"] = bandwidth(lambda w: kernel.linear_bf16(x, w, allow_amx=False), weights)
        if kernel is not None and kernel.amx_usable():
            rows[n]["amx_kernel_GBps"] = bandwidth(lambda w: kernel.linear_bf16(x, w), weights)
    print(json.dumps({"threads": torch.get_num_threads(), "rows": rows}, indent=1))


def past_rows(row_counts: list[int], dtype: torch.dtype, reps: int, pieces: bool) -> None:
    ext = cpu_kernels()
    if ext is None:
        raise SystemExit("no CPU kernels here (not x86-64 with AVX2 + FMA, or no compiler)")
    weights = [[torch.randn(shape).to(dtype) for shape in SMOLLM2_SHAPES] for _ in range(30)]
    if pieces:
        def kernel(x, w):  # in pieces of kernel_max_rows(dtype) rows
            return linear_module._kernel_linear(x, w, False)
    elif dtype == torch.float32:
        kernel = ext.linear_f32
    else:
        def kernel(x, w):  # one call (AMX tiles where the CPU has them)
            return ext.linear_bf16(x, w, float_out=False)
    if dtype == torch.float32:
        torch_path = F.linear
    else:
        def torch_path(x, w):
            return F.linear(x, w) if native_bf16() else linear_module._float32_linear(x, w).to(x.dtype)
    for n in row_counts:
        xs = {k: torch.randn(n, k).to(dtype) for k in (576, 1536)}
        times: dict[str, list[float]] = {"kernel": [], "torch": []}
        for rep in range(reps + 1):
            paths = [("kernel", kernel), ("torch", torch_path)]
            for name, fn in paths if rep % 2 else paths[::-1]:
                start = time.perf_counter()
                for layer in weights:
                    for w in layer:
                        fn(xs[w.shape[1]], w)
                if rep:  # the first pass of each warms up
                    times[name].append(time.perf_counter() - start)
        median = {k: sorted(v)[len(v) // 2] * 1e3 for k, v in times.items()}
        print(json.dumps({"cpu": cpu_model(), "kernels": kernel_path(), "dtype": str(dtype).split(".")[-1],
                          "rows": n, "piece": linear_module.kernel_max_rows(dtype) if pieces else n, "threads": torch.get_num_threads(),
                          **{f"{k}_ms": round(v, 1) for k, v in median.items()},
                          "kernel_over_torch": round(median["kernel"] / median["torch"], 2)}), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--past-rows", action="store_true",
                   help="time the kernel against the path linear takes past its rows, SmolLM2's shapes")
    p.add_argument("--rows", type=int, nargs="+", default=[8, 24, 32, 48, 64, 96, 128, 192],
                   help="with --past-rows: the row counts")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"), help="with --past-rows")
    p.add_argument("--reps", type=int, default=7, help="with --past-rows: timed passes of each path per row count")
    p.add_argument("--pieces", action="store_true",
                   help="with --past-rows: the kernel in pieces of its most rows a call, as `linear` sends them")
    args = p.parse_args()
    if args.past_rows:
        past_rows(args.rows, getattr(torch, args.dtype), args.reps, args.pieces)
    else:
        bandwidth_by_rows()


if __name__ == "__main__":
    main()
