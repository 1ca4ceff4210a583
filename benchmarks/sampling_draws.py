"""What one sampled token, and one node's children, cost to draw from a row of SmolLM2's vocabulary:
`sample_distinct` (inverse CDF, what the engine uses) against `torch.multinomial` (what it used before).

    python benchmarks/sampling_draws.py [--vocab 49152] [--draws 300]

Prints JSON: microseconds per draw of k = 1, 4 and 8 distinct tokens for each."""
from __future__ import annotations

import argparse
import json
import time

import torch

from triforce.speculation.sampling import sample_distinct


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--draws", type=int, default=300)
    args = p.parse_args()
    g = torch.Generator().manual_seed(0)
    row = torch.softmax(3 * torch.randn(args.vocab, generator=g), 0)
    ways = {"sample_distinct": lambda k: sample_distinct(row, k, g),
            "torch.multinomial": lambda k: torch.multinomial(row, k, replacement=False, generator=g).tolist()}
    out = {"vocab": args.vocab, "threads": torch.get_num_threads(), "us_per_draw": {}}
    for name, draw in ways.items():
        for k in (1, 4, 8):
            draw(k)
            start = time.perf_counter()
            for _ in range(args.draws):
                draw(k)
            out["us_per_draw"][f"{name} k={k}"] = round((time.perf_counter() - start) / args.draws * 1e6, 1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
