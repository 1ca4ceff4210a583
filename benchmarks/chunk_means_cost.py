"""What the retrieval cache's chunk means (cache/chunk_means.py) cost in a request: every call of
kernels.retrieval.chunk_mean_keys timed, in `retrieval` mode over a batch of prompts restored from a prefix
store (as the bench runs them), 64 new tokens each. Prints JSON: the seconds of each call, in order (a
prompt's first means cover it whole, in blocks), and their sum beside the requests' wall time.

    python benchmarks/chunk_means_cost.py [--batch 4] [--length 7936] [--model smollm2]
"""
import argparse
import dataclasses
import json
import time

import triforce.cache.chunk_means as chunk_means
from triforce import LLM, SamplingParams
from triforce.launch.bench import fill_prefix_store
from triforce.launch.bench_plan import batch_prompt

TEXTS = [f"../shared/data/austen-{name}.txt" for name in (
    "emma", "mansfieldpark", "northangerabbey", "persuasion", "prideprejudice", "sensesensibility")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=7936)
    parser.add_argument("--model", default="smollm2")
    args = parser.parse_args()
    calls = []
    means = chunk_means.chunk_mean_keys

    def timed(keys, chunk_size):
        start = time.perf_counter()
        out = means(keys, chunk_size)
        calls.append(time.perf_counter() - start)
        return out

    chunk_means.chunk_mean_keys = timed
    llm = LLM(args.model, None, "retrieval", prefix_cache_gb=4.0)
    files = [llm.tokenizer(open(path, encoding="utf-8").read())["input_ids"] for path in TEXTS]
    prompts = [batch_prompt(files, i, args.length) for i in range(args.batch)]
    fill_prefix_store(llm, llm.config, prompts)
    llm.config = dataclasses.replace(llm.config, mode="retrieval")
    calls.clear()
    start = time.perf_counter()
    llm.generate(prompts, SamplingParams(max_tokens=64, temperature=0.6, seed=0, ignore_eos=True))
    print(json.dumps({"batch": args.batch, "length": args.length, "wall_s": round(time.perf_counter() - start, 3),
                      "means_s": round(sum(calls), 3), "calls_ms": [round(1e3 * c, 1) for c in calls]}))


if __name__ == "__main__":
    main()
