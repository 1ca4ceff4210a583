"""Held-out evaluation per genre of one or more drafts against SmolLM2, on the sequences train-draft
evaluates (its work folder's cached installed code and answers; the --heldout files): top-1 agreement
and expected acceptance at temperature 0.6. Prints JSON, one line per draft. --continuations adds the
genre of the target's continuations of passages of the held-out prose (train-draft --continuations').

    python benchmarks/draft_genres.py DRAFT_DIR... [--heldout FILE...] [--work-dir DIR] [--continuations]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from triforce import LLM
from triforce.draft import sources
from triforce.draft.evaluate import evaluate_genres
from triforce.draft.generated import GenerationSettings
from triforce.launch.train_draft import _target_key
from triforce.models.folders import triforce_home
from triforce.models.loader import load_model


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("drafts", nargs="+")
    p.add_argument("--heldout", nargs="*",
                   default=["../shared/data/austen-emma.txt", "benchmarks/texts/kjv-genesis.txt"])
    p.add_argument("--work-dir", default=str(triforce_home() / "train-draft" / "smollm2"))
    p.add_argument("--sequences", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--continuations", action="store_true")
    p.add_argument("--passage-tokens", type=int, default=256)
    args = p.parse_args()
    llm = LLM("smollm2", mode="ar", dtype="bfloat16", device="cpu", prefix_cache_gb=0)
    prose = {Path(f).stem: sources.prose(llm.tokenizer, [Path(f).read_text(encoding="utf-8")], args.seq_len,
                                         args.sequences * args.seq_len) for f in args.heldout}
    genres = sources.heldout_genres(llm, Path(args.work_dir), prose, args.sequences, args.seq_len, True,
                                    GenerationSettings(), _target_key(llm.model_path, llm.tokenizer),
                                    GenerationSettings() if args.continuations else None, args.passage_tokens)
    for d in args.drafts:
        draft = load_model(d, "bfloat16")
        print(json.dumps({"draft": d, "genres": evaluate_genres(draft, llm.target, genres)}), flush=True)


if __name__ == "__main__":
    main()
