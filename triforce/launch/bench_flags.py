"""`triforce bench`: triforce's modes and the peers a Python user would pick instead, on the same prompts
in one process; prints JSON (and writes it with --out).

Workloads: `novel` (the first N tokens of the text files: continue a novel) and `passkey` (a five-digit
key planted a tenth of the way into N tokens of that text and asked for at the end). Every run of one
(workload, length, temperature, batch) group decodes the same prompts with the same sampling settings;
speedups divide by the `ar` and `transformers` runs of that group. At temperature 0 each run also
reports whether its tokens equal `ar`'s, and on `passkey` whether the answer holds the key.

With --batch B > 1 a run generates B prompts together: prompt i is N tokens of text file i mod F (of
F files), from token (i // F) * N on, so a batch of novels holds different novels; `tokens_per_s` is then
the batch's: all its generated tokens over the longest decode. Peers run at batch 1 only.

With --repeats R every run of a group runs R times, the group's runs taking turns (so that a machine
that slows down or speeds up for a while touches every run alike); a run reports its median tokens/s
and prefill, every repeat's tokens/s in `tokens_per_s_runs`, and the rest of its median repeat.
"""
from __future__ import annotations

import argparse

from ..config import MODES
from .flags import add_engine_args, add_model_args, add_penalty_args

PEERS = ("transformers", "assisted", "llamacpp")  # what a Python user would run instead (peers.py)
WORKLOADS = ("novel", "passkey")


def add_bench_parser(p: argparse.ArgumentParser) -> None:
    p.description = __doc__
    add_model_args(p)
    add_engine_args(p)
    p.add_argument("--text", nargs="+", required=True, help="text files the prompts are cut from")
    p.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=["novel"],
                   help="novel: prompts cut from --text; passkey: a key planted in it, asked for at the end")
    p.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 7936], help="prompt lengths in tokens")
    p.add_argument("--modes", nargs="+", choices=MODES, default=["ar", "retrieval"], help="modes to run, in turn")
    p.add_argument("--peers", nargs="*", choices=PEERS, default=[],
                   help="run beside ours at batch 1: transformers: plain generate; assisted: transformers with the "
                        "draft as assistant_model; llamacpp: llama-cpp-python on --gguf (skipped when not installed)")
    p.add_argument("--gguf", default=None, help="GGUF file for the llama.cpp peer")
    p.add_argument("--batch", type=int, nargs="+", default=[1], help="batch sizes: prompts generated together")
    p.add_argument("--max-new-tokens", type=int, default=256, help="tokens each run generates")
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.0], help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling (1 = off)")
    p.add_argument("--seed", type=int, default=0, help="the sampled runs' seed")
    add_penalty_args(p)
    p.add_argument("--sweep", action="append", default=None, metavar="SETTING=V1,V2,...",
                   help="repeat every non-ar mode for each value of one engine setting, e.g. budget=256,512,1024")
    p.add_argument("--repeats", type=int, default=1,
                   help="run each group's runs this many times, taking turns, and report medians (default 1)")
    p.add_argument("--prefix-cache-gb", type=float, default=0.0,
                   help="keep this much of the prompts' target KV: a batch's prompts are prefilled once, "
                        "untimed, and every run restores them instead (prefill_s measures the restore; "
                        "decoding is the same). Size it for the largest batch's prompts (a restored "
                        "sequence's decode would otherwise wait on a batchmate's prefill). Default 0: every "
                        "run prefills, as a document's first request would")
    p.add_argument("--out", default=None, help="also write the JSON here")
    p.set_defaults(func=_run)


def _run(args) -> int:
    from .bench import run_bench  # (torch, the kernels and the peers load here)

    return run_bench(args)
