"""Ceilings from bytes read per token, for a memory-bound decoder (the bandwidth cancels in the ratios).

    python benchmarks/bound.py [--model smollm2] [--draft smollm2-draft] [--prompt-tokens 7936]
                               [--budget 2048] [--gamma1 2] [--gamma2 6] [--gbps 17]

- `ar` reads all weights and the whole KV cache per token: its ceiling is gbps / those bytes.
- A perfect hierarchy (every proposal accepted) makes gamma2 + 1 tokens per target check, and tier 2
  makes its gamma2 tokens in ceil(gamma2 / (gamma1 + 1)) checks of gamma1 draft tokens each, each check
  reading the weights and the retrieval budget's KV once; every draft step reads the draft's weights and
  its window. So a check of several tokens costs one read of the weights: the bound assumes the kernels
  keep a check of 7 tokens as cheap as a one-token step (the AMX kernels do, the vector ones did not).
- `one_token_per_weight_read`: the bound if every tier-2 step yielded one token (what the docs used
  to call the ceiling, 1.54x at 8K: wrong, since a tier-2 check accepts several draft tokens).

Prints JSON."""
from __future__ import annotations

import argparse
import json
import math

from triforce.llm_models import DEFAULT_DRAFTS
from triforce.models.config import ModelConfig
from triforce.models.hub import resolve_model


def weight_bytes(cfg: ModelConfig, bytes_per_value: int) -> int:
    d, h, i = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    per_layer = d * (cfg.num_heads + 2 * cfg.num_kv_heads) * h + cfg.num_heads * h * d + 3 * d * i
    return (cfg.num_layers * per_layer + cfg.vocab_size * d * (1 if cfg.tie_word_embeddings else 2)) * bytes_per_value


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--draft", default=None, help="default: the draft shipped for --model")
    p.add_argument("--prompt-tokens", type=int, default=7936)
    p.add_argument("--budget", type=int, default=2048)
    p.add_argument("--draft-window", type=int, default=16 + 256, help="sinks + window")
    p.add_argument("--gamma1", type=int, default=4)  # the engine's defaults (config.py)
    p.add_argument("--gamma2", type=int, default=6)
    p.add_argument("--gbps", type=float, default=17.0, help="read rate for the tokens/s ceiling "
                   "(benchmarks/linear_bandwidth.py measures 16-19 here)")
    p.add_argument("--bytes-per-value", type=int, default=2, help="2 for bfloat16")
    args = p.parse_args()
    b = args.bytes_per_value
    cfg = ModelConfig.from_folder(resolve_model(args.model))
    draft_path = args.draft or DEFAULT_DRAFTS.get(args.model)
    dcfg = ModelConfig.from_folder(resolve_model(draft_path)) if draft_path else None
    weights, kv = weight_bytes(cfg, b), cfg.kv_bytes_per_token(b)
    ar = weights + kv * args.prompt_tokens
    tier2 = weights + kv * args.budget
    draft_step = 0 if dcfg is None else weight_bytes(dcfg, b) + dcfg.kv_bytes_per_token(b) * args.draft_window
    checks = math.ceil(args.gamma2 / (args.gamma1 + 1))
    per_round = ar + checks * (tier2 + args.gamma1 * draft_step)
    print(json.dumps({
        "weights_mb": round(weights / 1e6, 1), "kv_mb": round(kv * args.prompt_tokens / 1e6, 1),
        "retrieval_kv_mb": round(kv * args.budget / 1e6, 1), "draft_step_mb": round(draft_step / 1e6, 1),
        "ar_ceiling_tokens_per_s": round(args.gbps * 1e9 / ar, 1),
        "perfect_hierarchy_mb_per_token": round(per_round / (args.gamma2 + 1) / 1e6, 1),
        "bound_speedup_over_ar": round(ar * (args.gamma2 + 1) / per_round, 2),
        "one_token_per_weight_read": round(ar / tier2, 2)}))


if __name__ == "__main__":
    main()
