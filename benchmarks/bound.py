"""The most any hierarchy can gain over a memory-bound `ar` when every tier-2 step still reads all the
weights: ar reads weights + the whole KV cache per token; a perfect hierarchy (every proposal accepted,
free drafts, free target checks) still reads weights + the retrieval budget's KV per token.

    python benchmarks/bound.py [--model smollm2] [--prompt-tokens 7936] [--budget 1024]

Prints JSON: bytes per token of each, and the bound (their ratio; the bandwidth cancels)."""
from __future__ import annotations

import argparse
import json

from triforce.models.config import ModelConfig
from triforce.models.hub import resolve_model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--prompt-tokens", type=int, default=7936)
    p.add_argument("--budget", type=int, default=1024)
    p.add_argument("--bytes-per-value", type=int, default=2, help="2 for bfloat16")
    args = p.parse_args()
    cfg = ModelConfig.from_folder(resolve_model(args.model))
    d, h, i, v, layers = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size, cfg.vocab_size, cfg.num_layers
    per_layer = d * (cfg.num_heads + 2 * cfg.num_kv_heads) * h + cfg.num_heads * h * d + 3 * d * i
    weights = (layers * per_layer + v * d * (1 if cfg.tie_word_embeddings else 2)) * args.bytes_per_value
    kv_per_token = 2 * layers * cfg.num_kv_heads * h * args.bytes_per_value
    full, partial = weights + kv_per_token * args.prompt_tokens, weights + kv_per_token * args.budget
    print(json.dumps({"weights_mb": round(weights / 1e6, 1), "kv_mb": round(kv_per_token * args.prompt_tokens / 1e6, 1),
                      "retrieval_kv_mb": round(kv_per_token * args.budget / 1e6, 1),
                      "bound_speedup_over_ar": round(full / partial, 3)}))


if __name__ == "__main__":
    main()
