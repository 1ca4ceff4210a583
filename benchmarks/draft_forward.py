"""What one forward of the shipped SmolLM2 draft costs over a full streaming cache (16 sinks, a window of
256), one new token: the draft's share of a speculative round (two to five such forwards per check).

    python benchmarks/draft_forward.py [--forwards 300] [--repeats 3]

bfloat16 on the CPU at the process's kernel level (TRIFORCE_CPU_ISA picks a lower one). Prints JSON: ms per
forward of each repeat (after 20 forwards of warm-up), and the median."""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import triforce
from triforce.cache.streaming import StreamingKVCache
from triforce.kernels.cpu import isa_level, kernel_path
from triforce.models.loader import load_model

DRAFT = Path(triforce.__file__).parent / "drafts" / "smollm2"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--forwards", type=int, default=300)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    draft = load_model(DRAFT, "bfloat16", torch.device("cpu"))
    cache = StreamingKVCache(draft.config, 16, 256, 16, draft.rope, draft.dtype, "cpu")
    tokens = torch.randint(0, draft.config.vocab_size, (300 + 20 + args.forwards * args.repeats,),
                           generator=torch.Generator().manual_seed(0))
    draft.forward(tokens[:300], cache, "none")  # sinks and a full window
    fed = 300

    def forwards(count: int) -> float:
        nonlocal fed
        start = time.perf_counter()
        for _ in range(count):
            draft.forward(tokens[fed:fed + 1], cache, "all")
            fed += 1
        return (time.perf_counter() - start) / count * 1e3

    forwards(20)
    runs = [round(forwards(args.forwards), 3) for _ in range(args.repeats)]
    print(json.dumps({"isa_level": isa_level(), "kernel_path": kernel_path(), "ms_per_forward": runs,
                      "median_ms": statistics.median(runs)}))


if __name__ == "__main__":
    main()
