"""What taking AMX tiles for one-token steps costs: a one-token forward of SmolLM2 in bfloat16 over a
full KV cache of --context random entries, its linear layers through the tile path at every row count
(what kernels/linear.py does where the CPU has tiles, so a check rounds each token as a step does) and
through the vector path below 3 rows (what it did before), alternating in one process.

    python benchmarks/amx_step.py [--context 8000] [--reps 24]

Both arms run the layer-by-layer loop (the fused loop always takes tiles), with attention's tiles as
usual. Prints JSON: the min and median ms per forward of each arm and their ratio. Needs an AMX CPU."""
import argparse
import json
import time

import torch

import triforce.kernels.linear as linear
from triforce.cache.full import FullKVCache
from triforce.kernels.cpu import cpu_kernels, cpu_model, kernel_path
from triforce.models.hub import resolve_model
from triforce.models.loader import load_model
from triforce.step import Step


def vector_below_3_rows(x, weight, float_out):
    return cpu_kernels().linear_bf16(x, weight, float_out=float_out, allow_amx=x.shape[0] >= 3)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--context", type=int, default=8000)
    p.add_argument("--reps", type=int, default=24, help="alternations of the two arms (5 forwards each)")
    args = p.parse_args()
    if kernel_path() != "amx":
        raise SystemExit(f"the kernels here are {kernel_path()}: this compares AMX paths")
    model = load_model(resolve_model("smollm2"), "bfloat16")
    model.fused_layers = None
    cache = FullKVCache(model.config, args.context + 8, model.dtype, "cpu")
    cache.keys[:, :, : args.context].normal_()
    cache.values[:, :, : args.context].normal_()
    cache.length = args.context
    arms = {"tiles": linear._kernel_linear, "vector_below_3_rows": vector_below_3_rows}
    times: dict[str, list[float]] = {name: [] for name in arms}
    for rep in range(args.reps + 2):
        for name in list(arms) if rep % 2 else list(arms)[::-1]:
            linear._kernel_linear = arms[name]
            start = time.perf_counter()
            for i in range(5):
                model(Step.chain(torch.tensor([100 + i]), args.context), cache)
                cache.truncate(args.context)
            if rep >= 2:  # two warm-up rounds
                times[name].append((time.perf_counter() - start) / 5 * 1e3)
    linear._kernel_linear = arms["tiles"]
    stats = {name: {"min_ms": round(min(v), 2), "median_ms": round(sorted(v)[len(v) // 2], 2)}
             for name, v in times.items()}
    print(json.dumps({"cpu": cpu_model(), "context": args.context, "threads": torch.get_num_threads(), **stats,
                      "tiles_over_vector_median": round(stats["tiles"]["median_ms"]
                                                        / stats["vector_below_3_rows"]["median_ms"], 3)}))


if __name__ == "__main__":
    main()
