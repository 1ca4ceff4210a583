"""What the retrieval tier's int8 weights (--retrieval-weights int8, models/quantized.py) save and cost.

Speed: one forward of the retrieval tier (static policy, --budget tokens in chunks of 8, the first 2 layers
whole) over a full KV cache of --context random entries (with --batch B, B sequences in one forward, each
over its own), with the target's bfloat16 weights, with the
int8 twin of its layer matrices and with the twin whose output head is int8 too (`int8_head`, what
--retrieval-weights int8 runs), median of 15 forwards of each
token count, the three taking turns.
Acceptance: over --sequences held-out sequences of 1,024 tokens of --text (both read the whole sequence,
no retrieval), how often the twin's argmax is the target's and the expected acceptance of one
speculative-sampling draw from the twin at temperatures 0.6 and 1 (the sum of min(p, q)): what the
quantization alone costs a proposing tier.

    python benchmarks/int8_retrieval.py --text ../shared/data/austen-emma.txt [--model qwen2.5-coder-0.5b]
    python benchmarks/int8_retrieval.py --text ../shared/data/austen-emma.txt --batch 8 --tokens 1 5 --sequences 0"""
import argparse
import json
import time

import torch

from triforce.cache.full import FullKVCache
from triforce.cache.retrieval import LocalKVSource, RetrievalKVCache
from triforce.draft.data import leading_sequences
from triforce.kernels.cpu import cpu_model, kernel_path
from triforce.models.hub import resolve_model
from triforce.models.loader import load_model
from triforce.models.quantized import int8_twin, twin_bytes
from triforce.models.tokenizer import load_tokenizer
from triforce.speculation.sampling import probabilities
from triforce.step import Step


def forward_ms(models: dict, context: int, budget: int, tokens: list[int], batch: int = 1) -> dict:
    target = models["target"]
    fulls = []
    for _ in range(batch):  # each sequence of the batch over its own cache
        full = FullKVCache(target.config, context + 64, target.dtype, "cpu")
        full.keys.normal_()
        full.values.normal_()
        full.length = context - 1
        target(torch.randint(0, 100, (1,)), full)  # one target step: the latest query a static choice reads
        fulls.append(full)
    times = {(name, n): [] for name in models for n in tokens}
    caches = {}
    for name in models:
        caches[name] = [RetrievalKVCache(LocalKVSource(full), budget, 8, "static", full_layers=2, refresh_every=512)
                        for full in fulls]
        for cache in caches[name]:
            cache.sync()
    for _ in range(15):
        for n in tokens:
            steps = [Step.chain(torch.randint(0, target.config.vocab_size, (n,)), caches["target"][0].length)
                     for _ in range(batch)]
            for name, model in models.items():
                start = time.perf_counter()
                model.forward_batch(steps, caches[name])
                times[name, n].append(time.perf_counter() - start)
                for cache in caches[name]:
                    cache.rollback(n)
    return {f"{name}_n{n}_ms": round(sorted(t)[len(t) // 2] * 1e3, 2) for (name, n), t in times.items()}


def acceptance(target, twin, text: str, sequences: int) -> dict:
    tokenizer = load_tokenizer(resolve_model(ARGS.model), target.config.vocab_size)
    rows = leading_sequences(tokenizer, [text], 1024, sequences + 20)[20:20 + sequences]
    agree = count = 0
    accept = {0.6: 0.0, 1.0: 0.0}
    for row in rows:
        p = target(row, FullKVCache(target.config, row.numel(), target.dtype, "cpu"))
        q = twin(row, FullKVCache(target.config, row.numel(), target.dtype, "cpu"))
        agree += (p.argmax(-1) == q.argmax(-1)).sum().item()
        count += row.numel()
        for t in accept:
            accept[t] += torch.minimum(probabilities(p, t), probabilities(q, t)).sum().item()
    return {"top1_agreement": round(agree / count, 4), "tokens": count,
            **{f"expected_acceptance_t{t}": round(a / count, 4) for t, a in accept.items()}}


def main() -> None:
    global ARGS
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--text", required=True)
    p.add_argument("--context", type=int, default=7936)
    p.add_argument("--budget", type=int, default=2048)
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 5, 7])
    p.add_argument("--sequences", type=int, default=4, help="held-out sequences for the acceptance (0: speed only)")
    p.add_argument("--batch", type=int, default=1, help="sequences per forward, each over its own cache")
    ARGS = p.parse_args()
    target = load_model(resolve_model(ARGS.model), "bfloat16", torch.device("cpu"))
    models = {"target": target, "int8": int8_twin(target, head=False), "int8_head": int8_twin(target)}
    text = open(ARGS.text, encoding="utf-8").read()
    report = {"model": ARGS.model, "cpu": cpu_model(), "kernel_path": kernel_path(), "context": ARGS.context,
              "budget": ARGS.budget, "batch": ARGS.batch, "twin_mb": round(twin_bytes(target, head=False) / 2**20, 1),
              "twin_with_head_mb": round(twin_bytes(target) / 2**20, 1),
              **forward_ms(models, ARGS.context, ARGS.budget, ARGS.tokens, ARGS.batch),
              **{f"{name}_{key}": value for name in ("int8", "int8_head") if ARGS.sequences
                 for key, value in acceptance(models["target"], models[name], text, ARGS.sequences).items()}}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
