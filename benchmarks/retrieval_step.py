"""What one forward of the retrieval tier costs per policy: SmolLM2 (bfloat16, --rope-scaling) over a full
KV cache of --context random entries, the retrieval cache choosing --budget tokens (chunks of 8, the first
2 layers whole), median of 9 forwards of 1 and 7 tokens for the static and the dynamic policy; --profile
prints where a dynamic one-token forward spends its time (cProfile, 5 forwards). --int8 times the static
policy on the int8 twin too (models/quantized.py: what `--retrieval-weights int8` runs), forward by forward
in turn with the model's own weights; --tokens sets the forwards' sizes.

    python benchmarks/retrieval_step.py --context 16000 --rope-scaling yarn:4 [--profile]
    python benchmarks/retrieval_step.py --context 32000 --budget 8192 --rope-scaling yarn:4 --int8 --tokens 1 5"""
import argparse
import cProfile
import json
import pstats
import time

import torch

from triforce.cache.full import FullKVCache
from triforce.cache.retrieval import LocalKVSource, RetrievalKVCache
from triforce.models.hub import resolve_model
from triforce.models.loader import load_model
from triforce.models.quantized import int8_twin


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--context", type=int, default=16000)
    p.add_argument("--budget", type=int, default=2048)
    p.add_argument("--rope-scaling", default=None)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--int8", action="store_true")
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 7])
    args = p.parse_args()
    model = load_model(resolve_model("smollm2"), "bfloat16", torch.device("cpu"), rope_scaling=args.rope_scaling)
    full = FullKVCache(model.config, args.context + 64, model.dtype, "cpu")
    full.keys.normal_()
    full.values.normal_()
    full.length = args.context - 1
    model(torch.randint(0, 100, (1,)), full)  # one target step: the latest query a static choice reads
    weights = {"": model, **({"int8_": int8_twin(model)} if args.int8 else {})}
    report = {}
    for policy in ("static", "dynamic"):
        for n in args.tokens:
            ids = torch.randint(0, model.config.vocab_size, (n,))
            kinds = weights if policy == "static" else {"": model}
            caches = {}
            for kind in kinds:
                caches[kind] = RetrievalKVCache(LocalKVSource(full), args.budget, 8, policy, full_layers=2,
                                                refresh_every=512)
                caches[kind].sync()
            times = {kind: [] for kind in kinds}
            for _ in range(9):
                for kind, weighted in kinds.items():  # (in turn: a slow spell of a shared machine touches both)
                    start = time.perf_counter()
                    weighted(ids, caches[kind])
                    times[kind].append(time.perf_counter() - start)
                    caches[kind].rollback(n)
            for kind in kinds:
                report[f"{kind}{policy}_n{n}_ms"] = round(sorted(times[kind])[4] * 1e3, 1)
            if args.profile and policy == "dynamic" and n == 1:
                cache = caches[""]
                profile = cProfile.Profile()
                profile.enable()
                for _ in range(5):
                    model(ids, cache)
                    cache.rollback(n)
                profile.disable()
                pstats.Stats(profile).sort_stats("tottime").print_stats(12)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
