"""Where a request's own work between forwards goes (what mode auto's overhead per tier and role holds):
cProfile of one request, its time per call in the coordinator's functions, as JSON.

    python benchmarks/own_work_profile.py [--mode retrieval] [--length 7936] [--max-new-tokens 96]
        [--text ../shared/data/austen-emma.txt] [--model smollm2]

The profiler inflates functions made of many small torch calls several-fold: read it for where the time
goes, then time what it points at directly. SmolLM2 at 7,936 tokens of Emma, `retrieval` mode, greedy, 96
new tokens, on the 2-core AVX2 EPYC: the retrieval tier's sync after each check showed 3.0 ms here (19
calls), several times what the cache's sync of a few tokens takes when timed alone (a RetrievalKVCache
over a FullKVCache of SmolLM2's shape at 8K; not a script here yet); a rebuild of its chunks 96 ms (2
calls), the batch's verification 2.1 ms per check; the target's forwards 43.4 of the 43.9 s.
"""
import argparse
import cProfile
import json
import pstats
import time

from triforce.api import LLM
from triforce.config import SamplingParams

WATCHED = ("retrieval.py", "tiers.py", "engine.py", "verify.py", "sampling.py", "batch.py", "lookup.py")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", default="retrieval")
    p.add_argument("--length", type=int, default=7936)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--text", default="../shared/data/austen-emma.txt")
    p.add_argument("--model", default="smollm2")
    args = p.parse_args()
    llm = LLM(args.model, mode=args.mode, prefix_cache_gb=0)
    with open(args.text) as f:
        prompt = llm.tokenizer.decode(llm.tokenizer(f.read())["input_ids"][:args.length])
    profile = cProfile.Profile()
    start = time.perf_counter()
    profile.enable()
    llm.generate([prompt], SamplingParams(max_tokens=args.max_new_tokens, temperature=0, ignore_eos=True))
    profile.disable()
    wall = time.perf_counter() - start
    rows = []
    for (file, line, name), (_, calls, _, cumulative, _) in pstats.Stats(profile).stats.items():
        if file.endswith(WATCHED) and "triforce" in file:
            rows.append({"function": f"{file.split('triforce/')[-1]}:{line}({name})", "calls": calls,
                         "seconds": round(cumulative, 4), "ms_per_call": round(1e3 * cumulative / calls, 3)})
    rows.sort(key=lambda r: -r["seconds"])
    print(json.dumps({"mode": args.mode, "length": args.length, "max_new_tokens": args.max_new_tokens,
                      "wall_s": round(wall, 2), "functions": rows[:40]}, indent=1))


if __name__ == "__main__":
    main()
