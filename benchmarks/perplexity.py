"""Perplexity of a model over a long text, with and without `--rope-scaling`: does the stretched RoPE keep
a model sensible past its native positions?

    python benchmarks/perplexity.py [--model smollm2] [--tokens 16000 32000] [--rope-scaling none yarn:4]
                                    [--text ../shared/data/austen-emma.txt] [--dtype bfloat16]

Each run feeds the text's first N tokens through the model in chunks over one full KV cache (the prefill
path of plain decoding) and takes the mean negative log-likelihood of every next token: perplexity over
all N, and over the tokens past the model's native positions alone (the part scaling is for). Prints a
JSON line per (tokens, scaling) and progress on stderr."""
from __future__ import annotations

import argparse
import json
import math
import sys
import time

import torch

from triforce.cache.full import FullKVCache
from triforce.models.hub import resolve_model
from triforce.models.loader import load_model
from triforce.step import Step

CHUNK = 512


def negative_log_likelihoods(model, ids: torch.Tensor, label: str) -> torch.Tensor:
    """[len(ids) - 1] float64: -log p(ids[i + 1] | ids[:i + 1]) under `model`."""
    cache = FullKVCache(model.config, len(ids), model.dtype, "cpu")
    out = []
    start = time.perf_counter()
    with torch.inference_mode():
        for begin in range(0, len(ids) - 1, CHUNK):
            piece = ids[begin:begin + CHUNK]
            logits = model(Step.chain(piece, begin), cache, logits_for="all").double()
            following = ids[begin + 1:begin + 1 + len(piece)]
            logits = logits[:len(following)]
            out.append(torch.logsumexp(logits, -1) - logits.gather(-1, following[:, None]).squeeze(-1))
            print(f"\r{label}: {begin + len(piece)}/{len(ids)} tokens, {time.perf_counter() - start:.0f} s",
                  end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return torch.cat(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--tokens", type=int, nargs="+", default=[16000, 32000])
    p.add_argument("--rope-scaling", nargs="+", default=["none", "yarn:4"], help="'none' or KIND:FACTOR each")
    p.add_argument("--text", default="../shared/data/austen-emma.txt")
    p.add_argument("--dtype", default="bfloat16")
    args = p.parse_args()
    folder = resolve_model(args.model)
    from transformers import AutoTokenizer

    text = open(args.text, encoding="utf-8").read()
    ids = torch.tensor(AutoTokenizer.from_pretrained(folder)(text).input_ids)
    for scaling in args.rope_scaling:
        model = load_model(folder, args.dtype, rope_scaling=None if scaling == "none" else scaling)
        native = (model.config.rope_scaling or {}).get("original_max_position_embeddings",
                                                       model.config.max_position_embeddings)
        for n in args.tokens:
            if n > len(ids):
                raise SystemExit(f"the text has {len(ids)} tokens, fewer than {n}")
            model.rope.reach(n)  # unscaled, past the native positions: what the model does there
            nll = negative_log_likelihoods(model, ids[:n], f"{scaling} {n}")
            past = nll[native - 1:]  # predictions of tokens at positions >= native
            print(json.dumps({"model": args.model, "text": args.text, "dtype": args.dtype, "rope_scaling": scaling,
                              "tokens": n, "native_positions": native,
                              "perplexity": round(math.exp(float(nll.mean())), 2),
                              "perplexity_past_native": round(math.exp(float(past.mean())), 2) if len(past) else None,
                              "perplexity_first_native": round(math.exp(float(nll[:native - 1].mean())), 2)}),
                  flush=True)


if __name__ == "__main__":
    main()
