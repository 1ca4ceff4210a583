"""A prompt's prefill with the CPU attention kernel in pieces (kernels/attention.py KERNEL_IN_PIECES, the
default) against torch's CPU flash pass, which prefill chunks took before: past the kernel's 128 rows per
KV head (42 tokens of SmolLM2) attention fell back to torch.

    python benchmarks/prefill_attention.py [--model smollm2] [--text FILE] [--tokens 4096]
        [--contexts 512 4096 8192] [--turns 3]

Two parts, each path in turn (pieces, torch, pieces, ...), the pieces forced where bfloat16 keeps torch's
pass by default (the AVX2 level; `default` in the output says which a prefill takes here):
- `attention`: one layer's attention of a 512-token chunk (the model's heads, bfloat16, random) over each
  of --contexts keys; ms, the median of 5 calls.
- `prefill`: the model in bfloat16 prefilling the first --tokens tokens of --text (random ids without it)
  in the engine's chunks of 512 into a full KV cache, logits unused; seconds per turn, and whether the two
  paths' caches hold the same keys and values (they need not: the paths round apart).
Prints one JSON object. Needs the CPU kernels (a compiler) and the model (`triforce fetch-model NAME`)."""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import triforce.kernels.attention as attention_module
from triforce.cache.full import FullKVCache
from triforce.config import PREFILL_CHUNK
from triforce.kernels.cpu import cpu_kernels, isa_level
from triforce.models.hub import resolve_model
from triforce.models.loader import load_model
from triforce.models.tokenizer import load_tokenizer
from triforce.step import Step

PATHS = ("pieces", "torch")
NATIVE_BF16 = attention_module.native_bf16


def take(path: str) -> None:
    """Makes `attention` take `path` for a prefill chunk: the kernel in pieces (also in bfloat16 at the AVX2
    level, whose default is torch's float32 pass), or torch's pass."""
    attention_module.KERNEL_IN_PIECES = path == "pieces"
    attention_module.native_bf16 = (lambda: True) if path == "pieces" else NATIVE_BF16


def default_path() -> str:
    """The path a bfloat16 prefill chunk takes here by default."""
    take("torch")
    attention_module.KERNEL_IN_PIECES = True
    q, k = torch.zeros(9, PREFILL_CHUNK, 64).bfloat16(), torch.zeros(3, PREFILL_CHUNK, 64).bfloat16()
    return "pieces" if attention_module.takes_kernel_in_pieces(q, k, k, None) else "torch"


def layer_attention_ms(config, contexts: list[int], turns: int) -> dict:
    g = torch.Generator().manual_seed(0)
    heads, kv_heads, d = config.num_heads, config.num_kv_heads, config.head_dim
    out = {}
    for s in contexts:
        q = torch.randn(heads, PREFILL_CHUNK, d, generator=g).bfloat16()
        k, v = (torch.randn(kv_heads, s, d, generator=g).bfloat16() for _ in range(2))
        times = {path: [] for path in PATHS}
        for _ in range(turns):
            for path in PATHS:
                take(path)
                attention_module.attention(q, k, v, d ** -0.5)
                calls = []
                for _ in range(5):
                    start = time.perf_counter()
                    attention_module.attention(q, k, v, d ** -0.5)
                    calls.append(time.perf_counter() - start)
                times[path].append(statistics.median(calls) * 1e3)
        out[str(s)] = {path: round(min(t), 2) for path, t in times.items()}
        out[str(s)]["torch_over_pieces"] = round(out[str(s)]["torch"] / out[str(s)]["pieces"], 2)
    return out


def prefill_seconds(model, ids: list[int], turns: int) -> dict:
    caches, times = {}, {path: [] for path in PATHS}
    for _ in range(turns):
        for path in PATHS:
            take(path)
            cache = FullKVCache(model.config, len(ids), model.dtype, "cpu")
            start = time.perf_counter()
            for fed in range(0, len(ids), PREFILL_CHUNK):
                model.forward(Step.chain(ids[fed:fed + PREFILL_CHUNK], cache.length), cache, "none")
            times[path].append(round(time.perf_counter() - start, 2))
            caches[path] = cache
    same = all(torch.equal(getattr(caches["pieces"], name), getattr(caches["torch"], name)) for name in ("keys", "values"))
    return {"tokens": len(ids), "seconds": times, "same_cache": same,
            "torch_over_pieces": round(min(times["torch"]) / min(times["pieces"]), 2)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2", help="a known name or a model folder")
    p.add_argument("--text", help="a text file whose first --tokens tokens are prefilled (default: random ids)")
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--contexts", type=int, nargs="+", default=[512, 4096, 8192])
    p.add_argument("--turns", type=int, default=3)
    args = p.parse_args()
    if cpu_kernels() is None:
        raise SystemExit("the CPU kernels are not built here: nothing to compare")
    model = load_model(resolve_model(args.model), "bfloat16", torch.device("cpu"))
    report = {"model": args.model, "cpu_level": isa_level(), "threads": torch.get_num_threads(),
              "default": default_path(),
              "attention_ms": layer_attention_ms(model.config, args.contexts, args.turns)}
    if args.text:
        tokenizer = load_tokenizer(resolve_model(args.model), model.config.vocab_size)
        with open(args.text, encoding="utf-8") as f:
            ids = tokenizer.encode(f.read())[:args.tokens]
    else:
        ids = torch.randint(0, model.config.vocab_size, (args.tokens,), generator=torch.Generator().manual_seed(0)).tolist()
    report["prefill"] = prefill_seconds(model, ids, args.turns)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
