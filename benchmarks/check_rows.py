"""Does a check of k tokens give each token what k one-token steps give it? Bit for bit, on a real model.

    python benchmarks/check_rows.py [--dtype bfloat16] [--contexts 100 700 1020 2100] [--rows 2 4 5 8 12 24]
                                    [--tree]

For each context length c and row count k: SmolLM2 (the default model) prefills c random token ids into
two full caches, runs the next k ids as k one-token forwards on one and as one k-token chain (a
speculative check) on the other, and compares the k rows of logits. Prints a JSON line per (c, k): how
many rows are equal bit for bit, the largest difference, and how many rows' argmax differ (a greedy
token that a check would pick otherwise than plain decoding). If rows differ, greedy speculative output
can part from plain decoding at a near-tie. With --tree the check is a token tree of k nodes (seeded,
branches running deep: a node's parent is the node before it three times in four), and each node's row
is compared with one-token steps along its path from the prefix.

On the 2-core AMD EPYC with AVX2 only (results/check_rows/avx2_epyc_*.jsonl), bfloat16: before a92c3c3,
at contexts 100, 700 and 2100, 15 of 165 rows were equal (every row from k = 5, where the linear
kernel's blocks summed in another order, and at 700 keys from k = 4, where decode attention split the
keys by the sequence's length), by up to 0.69, and 6 rows' argmax differed; after it, with 1020 added,
all 220 are equal. Float32 (--dtype float32, the defaults): 0 of 220 equal at 69cb54a (torch's
attention paths; up to 4e-5 apart), all 220 after 3f34d9f's float32 attention kernel.

Trees (--tree --contexts 100 700 1020 2100 --rows 4 8 12 16 24, *_tree_*.jsonl): before the attention
kernel ran a node's scattered keys in a step's order, bfloat16 223 of 256 rows equal (up to 0.46 apart,
no argmax flip seen) and float32 113 of 256 (up to 2.6e-5); after it, 256 of 256 in both.

On a 2-core Xeon at the amx level (results/check_rows/amx_xeon_*.jsonl, bfloat16), while steps of 1-2
rows took the linear kernel's vector path and checks its tiles: 8 of 220 rows equal (up to 0.61 apart,
3 argmax flips), trees 0 of 256 (7 flips); with steps on the tiles too, 220 of 220 and 256 of 256.
"""
import argparse
import json

import torch

from triforce.cache.full import FullKVCache
from triforce.kernels.cpu import cpu_model, kernel_path
from triforce.models.hub import fetch_model
from triforce.models.loader import load_model
from triforce.step import Step, ancestor_mask


def compare(model, ids: torch.Tensor, context: int, k: int) -> dict:
    caches = [FullKVCache(model.config, context + k, model.dtype, "cpu") for _ in range(2)]
    for cache in caches:
        model(Step.chain(ids[:context], 0), cache, logits_for="none")
    steps = torch.cat([model(Step.chain(ids[context + i:context + i + 1], context + i), caches[0])
                       for i in range(k)])
    check = model(Step.chain(ids[context:context + k], context), caches[1])
    return {"context": context, "rows": k, "rows_equal": sum(bool(torch.equal(a, b)) for a, b in zip(steps, check)),
            "max_abs_diff": float((steps - check).abs().max()),
            "argmax_differs": int((steps.argmax(-1) != check.argmax(-1)).sum())}


def deep_tree(k: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return [-1] + [i - 1 if torch.rand((), generator=g) < 0.75 else int(torch.randint(-1, i, (), generator=g))
                   for i in range(1, k)]


def compare_tree(model, ids: torch.Tensor, context: int, k: int) -> dict:
    parents = deep_tree(k, context + k)
    cache = FullKVCache(model.config, context + k, model.dtype, "cpu")
    model(Step.chain(ids[:context], 0), cache, logits_for="none")
    check = model(Step.tree(ids[context:context + k], parents, context), cache)
    mask, steps = ancestor_mask(parents), [None] * k
    for node in range(k):
        if steps[node] is None:  # the steps along its path give every node on it
            cache.truncate(context)
            path = [j for j in range(k) if mask[node, j]]
            rows = model(Step.chain(ids[context + path[0]:context + path[0] + 1], context), cache)
            for depth, j in enumerate(path[1:], 1):
                rows = torch.cat([rows, model(Step.chain(ids[context + j:context + j + 1], context + depth), cache)])
            for j, row in zip(path, rows):
                steps[j] = row
    steps = torch.stack(steps)
    return {"context": context, "rows": k, "tree": parents, "depth": int(mask.sum(1).max()),
            "rows_equal": sum(bool(torch.equal(a, b)) for a, b in zip(steps, check)),
            "max_abs_diff": float((steps - check).abs().max()),
            "argmax_differs": int((steps.argmax(-1) != check.argmax(-1)).sum())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtype", default="bfloat16", help="bfloat16 (default) or float32")
    p.add_argument("--contexts", type=int, nargs="+", default=[100, 700, 1020, 2100],
                   help="tokens before the check (1020: the checks straddle the attention kernel's split at 1024)")
    p.add_argument("--rows", type=int, nargs="+", default=[2, 4, 5, 8, 12, 24], help="tokens per check")
    p.add_argument("--seed", type=int, default=0, help="seeds the random token ids")
    p.add_argument("--tree", action="store_true", help="checks of token trees of k nodes (default: chains)")
    args = p.parse_args()
    model = load_model(fetch_model("smollm2"), args.dtype)
    ids = torch.randint(100, model.config.vocab_size, (max(args.contexts) + max(args.rows),),
                        generator=torch.Generator().manual_seed(args.seed))
    for context in args.contexts:
        for k in args.rows:
            print(json.dumps({"cpu": cpu_model(), "kernels": kernel_path(), "dtype": args.dtype,
                              **(compare_tree if args.tree else compare)(model, ids, context, k)}), flush=True)


if __name__ == "__main__":
    main()
