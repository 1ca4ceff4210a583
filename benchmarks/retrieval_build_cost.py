"""What the retrieval cache's static builds cost in a request, part by part: every call of the chunk means
(cache/chunk_means.py: kernels.retrieval.chunk_mean_keys), the chunk choice (select_chunks), the copy of the
chosen chunks into the cache (refill_chunks) and whole rebuilds, timed in `retrieval` mode over a batch of
prompts restored from a prefix store (as the bench runs them), 64 new tokens each. Prints JSON: per part
the calls' seconds in order (a prompt's first means cover it whole, in blocks) and their sum, beside the
requests' wall time. TRIFORCE_CPU_KERNELS=0 times torch's paths.

    python benchmarks/retrieval_build_cost.py [--batch 4] [--length 7936] [--model smollm2]
"""
import argparse
import dataclasses
import json
import time
from collections import defaultdict

import triforce.cache.chunk_means as chunk_means
import triforce.cache.retrieval as retrieval
from triforce import LLM, SamplingParams
from triforce.launch.bench import fill_prefix_store
from triforce.launch.bench_plan import batch_prompt

TEXTS = [f"../shared/data/austen-{name}.txt" for name in (
    "emma", "mansfieldpark", "northangerabbey", "persuasion", "prideprejudice", "sensesensibility")]
PARTS = ((chunk_means, "chunk_mean_keys", "means"), (retrieval, "select_chunks", "choice"),
         (retrieval, "refill_chunks", "copy"), (retrieval.RetrievalKVCache, "rebuild", "rebuild"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=7936)
    parser.add_argument("--model", default="smollm2")
    args = parser.parse_args()
    calls = defaultdict(list)

    def timed(function, part):
        def call(*args, **kwargs):
            start = time.perf_counter()
            out = function(*args, **kwargs)
            calls[part].append(time.perf_counter() - start)
            return out
        return call

    for owner, name, part in PARTS:
        setattr(owner, name, timed(getattr(owner, name), part))
    llm = LLM(args.model, None, "retrieval", prefix_cache_gb=4.0)
    files = [llm.tokenizer(open(path, encoding="utf-8").read())["input_ids"] for path in TEXTS]
    prompts = [batch_prompt(files, i, args.length) for i in range(args.batch)]
    fill_prefix_store(llm, llm.config, prompts)
    llm.config = dataclasses.replace(llm.config, mode="retrieval")
    calls.clear()
    start = time.perf_counter()
    llm.generate(prompts, SamplingParams(max_tokens=64, temperature=0.6, seed=0, ignore_eos=True))
    print(json.dumps({"batch": args.batch, "length": args.length, "wall_s": round(time.perf_counter() - start, 3),
                      **{f"{part}_s": round(sum(calls[part]), 3) for _, _, part in PARTS},
                      **{f"{part}_ms": [round(1e3 * c, 1) for c in calls[part]] for _, _, part in PARTS}}))


if __name__ == "__main__":
    main()
