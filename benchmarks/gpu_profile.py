"""Where a GPU's decode time goes: each mode's generate under torch's profiler and under cProfile.

    python benchmarks/gpu_profile.py --model FOLDER [--draft FOLDER] [--device cuda] [--context 4096]
        [--tokens 48] [--modes ar triforce] [--temperature 0.6] [--dtype bfloat16] [--out DIR]

A decode step of a small model on a GPU is bound by the host (Python, dispatch, kernel launches,
device-to-host syncs), not by the GPU: this says by how much and where. Per mode, after one warm-up
generate of the same request (its tokens/s reported as `cold_tokens_per_s`, the first run at that length
as in `triforce bench`): tokens/s of the decode, the GPU's busy time (the sum of its kernels'
times) per token, kernel launches and host syncs per token (JSON on stdout), and, in DIR, the
profiler's top ops by host time and cProfile's top Python functions by their own time. The target's
forwards of a few tokens replay as CUDA graphs (models/cuda_graphs.py) unless TRIFORCE_CUDA_GRAPHS=0."""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import time
from pathlib import Path

import torch

from triforce import LLM, SamplingParams
from triforce.config import MODES_WITH_DRAFT

def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch")
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


def profile_mode(mode: str, args, ids: list[int], out: Path) -> dict:
    llm = LLM(args.model, args.draft if mode in MODES_WITH_DRAFT else None, mode=mode, dtype=args.dtype,
              device=args.device)
    params = SamplingParams(max_tokens=args.tokens, temperature=args.temperature, seed=0, ignore_eos=True)
    llm.generate(ids[:64], SamplingParams(max_tokens=8))  # as the bench warms up
    synchronize()
    cold = llm.generate(ids, params)[0].metrics  # the first at this length: allocator, graphs, auto's calibration
    synchronize()
    metrics = llm.generate(ids, params)[0].metrics
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA]
                                                          if torch.cuda.is_available() else [])
    with torch.profiler.profile(activities=activities) as prof:
        llm.generate(ids, params)
        synchronize()
    events = prof.key_averages()
    # the kernels' own events (the ops that launched them carry the same time again)
    busy_us = sum(e.self_device_time_total for e in events if e.device_type != torch.autograd.DeviceType.CPU)
    count = lambda names: sum(e.count for e in events if e.key in names)  # noqa: E731
    (out / f"profile_{mode}.txt").write_text(events.table(sort_by="self_cpu_time_total", row_limit=40))
    stats = io.StringIO()
    py = cProfile.Profile()
    py.enable()
    llm.generate(ids, params)
    py.disable()
    pstats.Stats(py, stream=stats).sort_stats("tottime").print_stats(40)
    (out / f"cprofile_{mode}.txt").write_text(stats.getvalue())
    n = metrics.generated_tokens
    return {"mode": mode, "cuda_graphs": os.environ.get("TRIFORCE_CUDA_GRAPHS", "1") != "0",
            "dtype": args.dtype, "context": args.context, "temperature": args.temperature,
            "cold_tokens_per_s": round(cold.tokens_per_s, 1), "tokens_per_s": round(metrics.tokens_per_s, 1),
            "prefill_s": round(metrics.prefill_s, 3),
            "gpu_busy_ms_per_token_with_prefill": round(busy_us / 1e3 / n, 2),
            "ms_per_token": round(1e3 / metrics.tokens_per_s, 2) if metrics.tokens_per_s else None,
            "launches_per_token": round(count(LAUNCHES) / n, 1), "syncs_per_token": round(count(SYNCS) / n, 1),
            "copies_per_token": round(count(("cudaMemcpyAsync",)) / n, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--draft", default=None)
    p.add_argument("--device", default="cuda")
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--modes", nargs="+", default=["ar", "triforce"])
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--out", type=Path, default=Path("."))
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    ids = torch.randint(3, 30000, (args.context,), generator=torch.Generator().manual_seed(0)).tolist()
    for mode in args.modes:
        start = time.perf_counter()
        result = profile_mode(mode, args, ids, args.out)
        result["seconds"] = round(time.perf_counter() - start, 1)
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
