"""`triforce bench`: several modes on the same prompt in one process; prints JSON.

For each prompt length, the prompt is the first N tokens of the given text files. Every mode decodes the
same prompt with the same sampling settings; `speedup_vs_ar` divides by the `ar` run at the same length
from this same process. At temperature 0 each run also reports whether its tokens equal `ar`'s.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from ..config import MODES, EngineConfig, SamplingParams
from ..errors import UserError


def add_bench_parser(sub) -> None:
    from .cli import add_engine_args, add_model_args

    p = sub.add_parser("bench", help="compare modes on one prompt; prints JSON",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    add_engine_args(p)
    p.add_argument("--text", nargs="+", required=True, help="text files the prompts are cut from")
    p.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 7936], help="prompt lengths in tokens")
    p.add_argument("--modes", nargs="+", choices=MODES, default=["ar", "retrieval"])
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sweep", default=None, metavar="SETTING=V1,V2,...",
                   help="repeat every non-ar mode for each value of one engine setting, e.g. budget=256,512,1024")
    p.add_argument("--out", default=None, help="also write the JSON here")
    p.set_defaults(func=run_bench)


def _parse_sweep(spec: str | None) -> tuple[str | None, list]:
    if spec is None:
        return None, [None]
    name, _, values = spec.partition("=")
    field_types = {f.name: f.type for f in dataclasses.fields(EngineConfig)}
    if name not in field_types or not values:
        raise UserError(f"--sweep needs SETTING=V1,V2 with SETTING an engine setting (got {spec!r})")
    cast = {"int": int, "float": float}.get(str(field_types[name]), str)
    return name, [cast(v) for v in values.split(",")]


def run_bench(args) -> int:
    from ..api import LLM
    from .cli import engine_settings

    sweep_name, sweep_values = _parse_sweep(args.sweep)
    text = "\n".join(Path(f).read_text(encoding="utf-8") for f in args.text)
    needs_draft = any(m in ("draft", "triforce") for m in args.modes)
    llm = LLM(args.model, args.draft if needs_draft else None, "triforce" if needs_draft else "ar", args.dtype,
              args.device, **engine_settings(args))
    ids = llm.tokenizer(text).input_ids
    base = llm.config
    results = []
    params = SamplingParams(max_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                            seed=args.seed, ignore_eos=True)
    llm.config = dataclasses.replace(base, mode="ar")
    llm.generate([ids[:64]], dataclasses.replace(params, max_tokens=8))  # warm up kernels and allocator
    for length in args.lengths:
        if length + args.max_new_tokens > llm.target.config.max_positions or length > len(ids):
            raise UserError(f"prompt length {length} + {args.max_new_tokens} does not fit the model or the text")
        prompt = ids[:length]
        reference = None
        for mode in args.modes:
            for value in (sweep_values if mode != "ar" else [None]):
                overrides = {sweep_name: value} if value is not None else {}
                llm.config = dataclasses.replace(base, mode=mode, **overrides)
                out = llm.generate([prompt], params)[0]
                row = {"prompt_tokens": length, "mode": mode, **overrides,
                       "tokens_per_s": round(out.metrics.tokens_per_s, 3),
                       "prefill_s": round(out.metrics.prefill_s, 3),
                       "generated_tokens": out.metrics.generated_tokens,
                       "retrieval_rebuilds": out.metrics.retrieval_rebuilds,
                       "tiers": [{k: t[k] for k in ("name", "drafter", "proposed", "accepted", "acceptance_rate",
                                                    "seconds")} for t in out.metrics.to_dict()["tiers"]]}
                if mode == "ar":
                    reference = out
                elif reference is not None:
                    row["speedup_vs_ar"] = round(out.metrics.tokens_per_s / reference.metrics.tokens_per_s, 3)
                    if params.greedy:
                        row["equals_ar"] = out.token_ids == reference.token_ids
                results.append(row)
                print(json.dumps(row), file=sys.stderr)
    report = {"model": str(args.model), "dtype": args.dtype, "device": str(llm.device),
              "max_new_tokens": args.max_new_tokens, "temperature": args.temperature,
              "engine": dataclasses.asdict(base), "results": results}
    text_out = json.dumps(report, indent=1)
    print(text_out)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text_out)
    return 0
