"""The two float32 CPU attention paths for several new tokens: one masked SDPA pass against the split pass
(an unmasked flash pass over the earlier keys, a causal or masked one over the last, merged), which
`attention` chooses between by DENSE_MASK_ENTRIES (kernels/attention.py).

    python benchmarks/attention_paths.py [--threads 1]

Shapes: SmolLM2's heads (9 query, 3 KV, head dim 64) for checks and prefill chunks over 200-4,096 keys,
and the tests' tiny models (4 query, 2 KV, head dim 16). Prints a JSON line per shape: microseconds per
call of each path (median of 5 timings), their ratio (dense / split) and the mask entries
(query heads per KV head x new tokens x keys); then the threshold in force."""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from triforce.kernels import attention as attn
from triforce.step import ancestor_mask

SHAPES = [  # (query heads, KV heads, head dim, new tokens, keys, tree)
    (9, 3, 64, 2, 200, False), (9, 3, 64, 8, 500, False), (9, 3, 64, 8, 1000, True), (9, 3, 64, 16, 1000, False),
    (9, 3, 64, 16, 4000, False), (9, 3, 64, 32, 2000, False), (9, 3, 64, 64, 1024, False),
    (9, 3, 64, 128, 512, False), (9, 3, 64, 128, 2048, False), (9, 3, 64, 512, 4096, False),
    (4, 2, 16, 4, 100, False), (4, 2, 16, 8, 90, True), (4, 2, 16, 16, 300, False), (4, 2, 16, 80, 80, False),
]


def timed(fn, work: int) -> float:
    repeats = max(3, int(2e7 / work))
    fn()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        times.append((time.perf_counter() - start) / repeats * 1e6)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    threshold = attn.DENSE_MASK_ENTRIES
    try:
        for hq, hkv, d, n, s, tree in SHAPES:
            print(json.dumps(compare(hq, hkv, d, n, s, tree)))
    finally:
        attn.DENSE_MASK_ENTRIES = threshold
    print(json.dumps({"threads": args.threads, "dense_mask_entries": threshold}))


def compare(hq: int, hkv: int, d: int, n: int, s: int, tree: bool) -> dict:
    """Both paths, each forced, on one shape."""
    g = torch.Generator().manual_seed(n * s)
    q, k, v = (torch.randn(h, length, d, generator=g) for h, length in ((hq, n), (hkv, s), (hkv, s)))
    mask = ancestor_mask([-1] + [(i - 1) // 2 for i in range(1, n)]) if tree else None
    paths = {}
    for name, entries in (("split", 0), ("dense", 1 << 62)):
        attn.DENSE_MASK_ENTRIES = entries
        paths[name] = timed(lambda: attn.attention(q, k, v, 0.125, mask), hq * n * s * d)
    return {"heads": [hq, hkv, d], "new_tokens": n, "keys": s, "tree": tree, "mask_entries": hq // hkv * n * s,
            "split_us": round(paths["split"], 1), "dense_us": round(paths["dense"], 1),
            "dense_over_split": round(paths["dense"] / paths["split"], 2)}


if __name__ == "__main__":
    main()
