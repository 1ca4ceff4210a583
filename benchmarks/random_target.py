"""A random-weight model of a real model's shape, with that model's tokenizer.

    python benchmarks/random_target.py --like FOLDER --out FOLDER [--seed 0]

Where the real weights cannot go (a GPU machine with no network and a 64 MiB upload, say), every forward,
cache, kernel and message still runs at the real sizes on it: `triforce bench --model OUT` times the
tiers and checks greedy output against `ar`. Its acceptance means nothing (the weights are noise), so
report its forward costs and its exactness, never its speedups, as the real model's. FOLDER needs the
real model's config.json and tokenizer files, not its weights."""
from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--like", type=Path, required=True, help="folder with the real model's config and tokenizer")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(args.like)
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_config(config)  # float32
    model.save_pretrained(args.out)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
        if (args.like / name).is_file():
            shutil.copy(args.like / name, args.out / name)
    print(f"random {config.model_type} of {sum(t.numel() for t in model.parameters()) / 1e6:.0f}M parameters "
          f"in {args.out}")


if __name__ == "__main__":
    main()
