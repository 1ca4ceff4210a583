"""What a sampling profiler sees of a batch's decode: a process to record with py-spy (pip install py-spy).

    py-spy record --format raw -o batch.raw [--native] -- python benchmarks/batch_profile.py decode \
        [--mode triforce] [--batch 8] [--temperature 0]
    py-spy record --format raw -o forward.raw --native -- python benchmarks/batch_profile.py forwards \
        [--batch 8] [--tokens 5] [--context 640] [--seconds 25]

`decode`: the prompts (cut from --text as the bench cuts them) are first prefilled and stored in mode ar
(max_tokens 1), so the timed generate in --mode restores their target KV and mostly decodes; the stacks
of the first generate and of model loading are in the recording too (filter by `LLM.generate`, api.py,
and drop those under `_prefill`). `forwards`: SmolLM2 bfloat16 forwards of --batch sequences of --tokens
new tokens over full caches of --context random entries, repeated for --seconds (with --native, the C++
kernels' frames and OpenMP's waits show). docs/amx.md, *Where a batch of 8 spends its decode*, read such
profiles (`decode` at batch 8 greedy; `forwards` at 8 x 5 tokens over 640 keys)."""
from __future__ import annotations

import argparse
import dataclasses
import time

import torch


def decode(args) -> None:
    from triforce import LLM, SamplingParams

    llm = LLM("smollm2", None, "auto", prefix_cache_gb=4)
    ids = llm.tokenizer(open(args.text).read())["input_ids"]
    prompts = [ids[i * args.length:(i + 1) * args.length] for i in range(args.batch)]
    base = llm.config
    llm.config = dataclasses.replace(base, mode="ar")
    llm.generate(prompts, SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))
    llm.config = dataclasses.replace(base, mode=args.mode)
    start = time.perf_counter()
    llm.generate(prompts, SamplingParams(max_tokens=args.max_new_tokens, temperature=args.temperature, seed=0,
                                         ignore_eos=True))
    elapsed = time.perf_counter() - start
    print(f"{args.mode}: {args.batch * args.max_new_tokens / elapsed:.1f} tokens/s over {elapsed:.1f} s")


def forwards(args) -> None:
    from triforce.cache.full import FullKVCache
    from triforce.models.hub import resolve_model
    from triforce.models.loader import load_model
    from triforce.step import Step

    model = load_model(resolve_model("smollm2"), "bfloat16", torch.device("cpu"))
    caches = [FullKVCache(model.config, args.context + args.tokens, model.dtype, "cpu") for _ in range(args.batch)]
    for cache in caches:
        cache.keys.normal_()
        cache.values.normal_()
    start, count = time.perf_counter(), 0
    while time.perf_counter() - start < args.seconds:
        for cache in caches:
            cache.length = args.context
        model.forward_batch([Step.chain(torch.randint(0, 1000, (args.tokens,)), args.context) for _ in caches], caches)
        count += 1
    print(f"{count} forwards, {1e3 * args.seconds / count:.1f} ms each")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=("decode", "forwards"))
    p.add_argument("--mode", default="triforce")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--text", default="../shared/data/austen-emma.txt")
    p.add_argument("--length", type=int, default=7936)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--tokens", type=int, default=5)
    p.add_argument("--context", type=int, default=640)
    p.add_argument("--seconds", type=float, default=25.0)
    args = p.parse_args()
    (decode if args.what == "decode" else forwards)(args)


if __name__ == "__main__":
    main()
