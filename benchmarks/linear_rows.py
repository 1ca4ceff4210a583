"""Where does the CPU linear kernel stop beating torch's path? Time per row count, one process.

    python benchmarks/linear_rows.py [--rows 8 24 32 48 64 96 128 192] [--dtype bfloat16|float32]

SmolLM2's 30 layers' matrices (qkv 960 x 576, o 576 x 576, gate_up 3072 x 576, down 576 x 1536; 212 MB
in bfloat16, each read from memory on every pass) times n rows of x, through the kernel (linear_bf16's
vector path, or linear_f32) and through the path `linear` takes past the kernel's rows (without native
bfloat16: W widened to float32 a block at a time, then torch's float32 product; with it, and for float32,
torch's own product), the two taking turns. (benchmarks/linear_bandwidth.py measures the bfloat16
kernel against F.linear itself, one shape, as GB/s; the two should become one program with both
comparisons.) Prints a JSON line per row count: the median ms of each and
kernel / torch. kernels/linear.py sets its row bounds from these: on the 2-core Zen 3 EPYC
(results/linear_rows/avx2_epyc_*.jsonl, two bfloat16 runs and one float32; these machines are noisy,
so compare within a run), bfloat16 0.41x at 8 rows, 0.68x at 24, 0.49-0.91x at 32, 0.58-0.84x at 48,
0.77-1.08x at 64, 0.83-1.09x at 96, 1.24x at 128; float32 0.55x at 8, 0.83x at 24, 0.93x at 32, 0.82x
at 48, 1.08x at 64.
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F

from triforce.kernels import linear as linear_module
from triforce.kernels.cpu import cpu_kernels, cpu_model, kernel_path, native_bf16

SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, nargs="+", default=[8, 24, 32, 48, 64, 96, 128, 192])
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--reps", type=int, default=7, help="timed passes of each path per row count")
    args = p.parse_args()
    ext, dtype = cpu_kernels(), getattr(torch, args.dtype)
    if ext is None:
        raise SystemExit("no CPU kernels here (not x86-64 with AVX2 + FMA, or no compiler)")
    weights = [[torch.randn(shape).to(dtype) for shape in SHAPES] for _ in range(30)]
    if dtype == torch.float32:
        kernel, torch_path = ext.linear_f32, F.linear
    else:
        def kernel(x, w):
            return ext.linear_bf16(x, w, float_out=False, allow_amx=False)

        def torch_path(x, w):
            return F.linear(x, w) if native_bf16() else linear_module._float32_linear(x, w).to(x.dtype)
    for n in args.rows:
        xs = {k: torch.randn(n, k).to(dtype) for k in (576, 1536)}
        times: dict[str, list[float]] = {"kernel": [], "torch": []}
        for rep in range(args.reps + 1):
            paths = [("kernel", kernel), ("torch", torch_path)]
            for name, fn in paths if rep % 2 else paths[::-1]:
                start = time.perf_counter()
                for layer in weights:
                    for w in layer:
                        fn(xs[w.shape[1]], w)
                if rep:  # the first pass of each warms up
                    times[name].append(time.perf_counter() - start)
        median = {k: sorted(v)[len(v) // 2] * 1e3 for k, v in times.items()}
        print(json.dumps({"cpu": cpu_model(), "kernels": kernel_path(), "dtype": args.dtype, "rows": n,
                          "threads": torch.get_num_threads(), **{f"{k}_ms": round(v, 1) for k, v in median.items()},
                          "kernel_over_torch": round(median["kernel"] / median["torch"], 2)}), flush=True)


if __name__ == "__main__":
    main()
