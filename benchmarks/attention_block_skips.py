"""Whether a decode attention kernel could skip key blocks: SmolLM2's real queries of a check after a long
prompt, scored against its real keys, counted in the AMX kernel's shape (ranges of 512 keys, blocks of 32, a
group holding a KV head's query rows), for blocks where every row's scores lie more than T (natural log) below
its running maximum within the range, so that their exponentials are below e^-T and the block adds nothing a
flush-to-zero at that threshold would keep (its scores, the QK tiles, are still needed to know it).

    python benchmarks/attention_block_skips.py [--text ../shared/data/austen-emma.txt] [--context 7936]
        [--new 11] [--thresholds 10 17.3]

Prints JSON: per threshold the blocks that could be skipped of all (layers x KV heads x blocks)."""
import argparse
import json
import math

import torch

import triforce.models.llama as llama
from triforce.cache.full import FullKVCache
from triforce.models.hub import resolve_model
from triforce.models.loader import load_model
from triforce.models.tokenizer import load_tokenizer
from triforce.step import Step

RANGE, BLOCK = 512, 32  # keys per range and per block of the AMX attention (kernels/csrc/attention_amx.cpp)


def skippable(scores: torch.Tensor, threshold: float) -> tuple[int, int]:
    """(blocks skippable, blocks) over the keys of scores [rows, keys] (the new tokens' own keys left out)."""
    skip = total = 0
    for r0 in range(0, scores.shape[1], RANGE):
        running = torch.full((scores.shape[0],), -math.inf)
        for b0 in range(r0, min(r0 + RANGE, scores.shape[1]), BLOCK):
            block = scores[:, b0:b0 + BLOCK].max(1).values
            running = torch.maximum(running, block)
            skip += bool((block < running - threshold).all())
            total += 1
    return skip, total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--text", default="../shared/data/austen-emma.txt")
    p.add_argument("--context", type=int, default=7936)
    p.add_argument("--new", type=int, default=11, help="tokens of the check (its query rows)")
    p.add_argument("--thresholds", type=float, nargs="+", default=[10.0, 17.3])
    args = p.parse_args()
    path = resolve_model("smollm2")
    model = load_model(path, "bfloat16", torch.device("cpu"))
    ids = load_tokenizer(path, model.config.vocab_size)(open(args.text).read())["input_ids"][:args.context + args.new]
    cache = FullKVCache(model.config, args.context + args.new, model.dtype, "cpu")
    for start in range(0, args.context, 512):
        model(Step.chain(torch.tensor(ids[start:min(start + 512, args.context)]), start), cache, "none")
    captured = []
    attention = llama.attention

    def capture(q, keys, values, scale, mask):  # the layer loop's attention, per layer
        captured.append((q.float(), keys.float(), scale))
        return attention(q, keys, values, scale, mask)

    llama.attention, model.fused_layers = capture, None
    model(Step.chain(torch.tensor(ids[args.context:args.context + args.new]), args.context), cache, "last")
    counts = {t: [0, 0] for t in args.thresholds}
    for q, keys, scale in captured:  # q [hq, n, d], keys [hkv, S, d]
        group = q.shape[0] // keys.shape[0]
        for h in range(keys.shape[0]):
            rows = q[h * group:(h + 1) * group].reshape(-1, q.shape[-1])
            scores = (rows @ keys[h, :args.context].T) * scale
            for t in args.thresholds:
                s, n = skippable(scores, t)
                counts[t][0] += s
                counts[t][1] += n
    print(json.dumps({"context": args.context, "new": args.new,
                      "skippable": {str(t): {"blocks": s, "of": n, "share": round(s / n, 4)} for t, (s, n) in counts.items()}}))


if __name__ == "__main__":
    main()
