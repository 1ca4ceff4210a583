"""The draft's step over this checkout's streaming cache against the one of an earlier revision, paired:
both caches' batches take turns step by step in one process (this host's noise moves one run's step time
by half; a pair's two steps see the same moment).

    python benchmarks/streaming_ab.py --against REV [--batch 1 4 8] [--steps 300]

SmolLM2's shipped draft in bfloat16 (the fused layer loop), sinks 16, window 256; each batch's B
sequences prefilled with 1,024 tokens of *Emma* (offsets 100 apart), then one-token steps whose logits
of the last row are kept, as proposals take them, every fourth followed by a rollback of three (the
window moves back over entries it had left). Prints a JSON line per batch size: the median ms of a step
each way, the median of the pairs' ratios (before / now) and whether every step's logits were equal; with
--hooks also each way's ms per step in the caches' `begin`, `layer_buffers` and `end`, all sequences
together (timers around them, which add their own few microseconds per call).
Only triforce/cache/streaming.py comes from REV (the model, kernels and the rest are this checkout's).

    python benchmarks/streaming_ab.py --against REV --modes draft triforce [--batch 8] [--length 7936]
        [--temperature 0] [--max-new-tokens 128] [--turns 3]

instead runs whole requests: LLM.generate of B prompts cut from the six novels (their KV restored from a
prefix store after a first, unmeasured turn), each mode's turns alternating between the two caches. Prints
per mode and batch size the aggregate tokens/s of each turn (generated tokens over the longest decode),
the median of the turns' ratios and whether the outputs were equal.
"""
from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

import triforce.cache.streaming as current
import triforce.coordinator.hierarchy as hierarchy
from triforce import LLM, SamplingParams
from triforce.step import Step

ROOT = Path(__file__).resolve().parents[1]


def module_at(rev: str):
    """triforce/cache/streaming.py as it was at `rev`, imported beside this checkout's."""
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:triforce/cache/streaming.py"], check=True,
                            capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "streaming_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("triforce.cache.streaming_before", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", required=True, help="the revision whose streaming cache to compare with")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--text", default=str(ROOT.parent / "shared/data/austen-emma.txt"))
    parser.add_argument("--modes", nargs="+", choices=("draft", "triforce"),
                        help="run whole requests of these modes (the fixed modes with a draft)")
    parser.add_argument("--length", type=int, default=7936)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--turns", type=int, default=3, help="measured turns each way (--modes)")
    parser.add_argument("--hooks", action="store_true", help="also time the caches' begin, layer_buffers, end")
    args = parser.parse_args()
    before = module_at(args.against)
    if args.modes:
        generate(args, before)
        return
    hooks = {"before": timed_hooks(before.StreamingKVCache), "now": timed_hooks(current.StreamingKVCache)} \
        if args.hooks else None
    llm = LLM("smollm2", mode="draft", dtype="bfloat16")
    draft = llm.draft
    ids = llm.encode(Path(args.text).read_text(encoding="utf-8"))[:100 * max(args.batch) + 1100 + args.steps]
    for batch in args.batch:
        caches = {}
        for name, module in (("before", before), ("now", current)):
            caches[name] = []
            for b in range(batch):
                cache = module.StreamingKVCache(draft.config, 16, 256, 64, draft.rope, draft.dtype, "cpu")
                draft(torch.tensor(ids[100 * b:100 * b + 1024]), cache, logits_for="none")
                caches[name].append(cache)
        seconds, logits = {"before": [], "now": []}, {"before": [], "now": []}
        for spent in (hooks or {}).values():
            spent.clear()
        for i in range(args.steps):
            for name in ("before", "now") if i % 2 else ("now", "before"):
                steps = [Step.chain(torch.tensor([ids[1024 + i + b]]), c.length) for b, c in enumerate(caches[name])]
                start = time.perf_counter()
                out = draft.forward_batch(steps, caches[name], "last")
                seconds[name].append(time.perf_counter() - start)
                logits[name].append(torch.cat(out))
                if i % 4 == 3:
                    for cache in caches[name]:
                        cache.rollback(3)
        ratios = [b / n for b, n in zip(seconds["before"], seconds["now"])]
        print(json.dumps({"batch": batch, "against": args.against,
                          **{f"{name}_ms": round(1e3 * statistics.median(s), 3) for name, s in seconds.items()},
                          "median_ratio": round(statistics.median(ratios), 3),
                          "logits_equal": all(torch.equal(a, b) for a, b in zip(logits["before"], logits["now"])),
                          **({f"{name}_hooks_ms": {hook: round(1e3 * t / args.steps, 3) for hook, t in spent.items()}
                              for name, spent in hooks.items()} if hooks else {})}),
              flush=True)


def timed_hooks(cls) -> dict[str, float]:
    """Wraps cls's begin, layer_buffers and end with timers; returns the seconds each has taken (a dict
    that the wrappers add to)."""
    spent: dict[str, float] = {}
    for hook in ("begin", "layer_buffers", "end"):
        def timed(self, *args, _inner=getattr(cls, hook), _hook=hook):
            start = time.perf_counter()
            try:
                return _inner(self, *args)
            finally:
                spent[_hook] = spent.get(_hook, 0.0) + time.perf_counter() - start
        setattr(cls, hook, timed)
    return spent


def generate(args, before) -> None:
    """--modes: whole requests, turns alternating between the caches (the module docstring)."""
    texts = sorted(glob.glob(str(ROOT.parent / "shared/data/austen-*.txt")))
    for mode in args.modes:
        llm = LLM("smollm2", mode=mode, dtype="bfloat16", prefix_cache_gb=4)
        files = [llm.tokenizer(Path(t).read_text(encoding="utf-8"))["input_ids"] for t in texts]
        for batch in args.batch:
            prompts = [files[i % len(files)][:args.length] for i in range(batch)]
            params = SamplingParams(max_tokens=args.max_new_tokens, temperature=args.temperature, seed=0,
                                    ignore_eos=True)
            rates, outputs = {"before": [], "now": []}, {"before": [], "now": []}
            for turn in range(2 * args.turns + 1):  # the first fills the prefix store, unmeasured
                name = ("now", "before")[turn % 2]
                hierarchy.StreamingKVCache = (current if name == "now" else before).StreamingKVCache
                outs = llm.generate(prompts, params)
                if turn:
                    decode = max(o.metrics.decode_s for o in outs)
                    rates[name].append(sum(len(o.token_ids) for o in outs) / decode)
                    outputs[name].append([o.token_ids for o in outs])
            hierarchy.StreamingKVCache = current.StreamingKVCache
            ratios = [n / b for b, n in zip(rates["before"], rates["now"])]
            print(json.dumps({"mode": mode, "batch": batch, "length": args.length, "temperature": args.temperature,
                              "against": args.against,
                              **{f"{name}_tokens_per_s": [round(r, 2) for r in rs] for name, rs in rates.items()},
                              "median_ratio": round(statistics.median(ratios), 3),
                              "outputs_equal": all(o == outputs["now"][0] for rs in outputs.values() for o in rs)}),
                  flush=True)
        del llm


if __name__ == "__main__":
    main()
