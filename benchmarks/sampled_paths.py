"""What the benchmarks that sample many paths of SmolLM2 from one prompt share (chain_through_trees.py,
sampling_drift.py): their arguments, and the prompt. Run them from the repository root."""
from __future__ import annotations

import argparse
from pathlib import Path


def path_parser(description: str, seeds: str) -> argparse.ArgumentParser:
    """The arguments of a run of seeded sample paths: the prompt text and its length, the new tokens of
    each path, the temperature and the seeds (default `seeds`)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--text", default="../shared/data/austen-emma.txt", help="run from the repository root")
    p.add_argument("--length", type=int, default=7936, help="prompt tokens")
    p.add_argument("--new", type=int, default=256, help="new tokens per path")
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--seeds", default=seeds, help="comma-separated, one path each")
    return p


def prompt_ids(tokenizer, args) -> list[int]:
    """The first `--length` tokens of `--text`."""
    return tokenizer.encode(Path(args.text).read_text())[: args.length]


def seeds(args) -> list[int]:
    return [int(s) for s in args.seeds.split(",")]
