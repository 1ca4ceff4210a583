"""What taking forced tokens without a forward saves: where a structured output's constraint allows one
token (a literal's next, end-of-sequence once the text is complete), the bottom tier takes it without a
forward (Guide.forced). Runs one chat request on a long document under a constraint, with that on and
off (off: Guide.forced patched to find none), the two taking turns, per mode.

    python benchmarks/forced_tokens.py --text ../shared/data/austen-emma.txt [--length 4096]
        [--modes ar triforce] [--constraint form|schema] [--max-new-tokens 128] [--repeats 2] [--out F]

`form`: a regular expression of labelled lines (most of its tokens are the labels' literals); `schema`:
benchmarks/structured_outputs.py's JSON schema. Prints JSON: per mode and setting each turn's tokens/s,
tokens and forced tokens, and the medians; the outputs of the two settings are compared (greedy: equal)."""
from __future__ import annotations

import argparse
import json
import statistics

import torch

from structured_outputs import QUESTION, SCHEMA, document_chat, report
from triforce import LLM, SamplingParams
from triforce.sampling_params import StructuredOutputs
from triforce.kernels.cpu import cpu_isa, cpu_model
from triforce.speculation import guided

FORM = (r"Heroine: [A-Z][a-z]+ [A-Z][a-z]+\n Her home: [A-Z][a-z]+\n Her friend: [A-Z][a-z]+ [A-Z][a-z]+\n"
        r" Her age: [0-9]{2}\n Her father: Mr\. [A-Z][a-z]+\n The place of the story: [A-Z][a-z]+\n")
FORM_QUESTION = "Fill in the heroine's name, home, friend, age, father and the place of the story."


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--text", required=True)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--length", type=int, default=4096, help="prompt tokens in all (the document is cut to fit)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--modes", nargs="+", default=["ar", "triforce"])
    p.add_argument("--constraint", choices=["form", "schema"], default="form")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out")
    args = p.parse_args()
    spec, question = ((StructuredOutputs(regex=FORM), FORM_QUESTION) if args.constraint == "form"
                      else (StructuredOutputs(json=SCHEMA), QUESTION))
    real_forced, counted = guided.Guide.forced, {"n": 0}

    def counting(self, history):
        token = real_forced(self, history)
        counted["n"] += token is not None
        return token

    settings = {"forced": counting, "off": lambda self, history: None}
    results = []
    for mode in args.modes:
        llm = LLM(args.model, mode=mode)
        ids = document_chat(llm, args.text, args.length, question)
        runs, texts = {name: [] for name in settings}, {}
        for r in range(args.repeats):
            for name, forced in settings.items():
                guided.Guide.forced = forced
                counted["n"] = 0
                out = llm.generate(ids, SamplingParams(max_tokens=args.max_new_tokens, temperature=args.temperature,
                                                       seed=r, structured_outputs=spec))[0]
                runs[name].append({"tokens_per_s": round(out.metrics.tokens_per_s, 2), "tokens": len(out.token_ids),
                                   "forced_tokens": counted["n"], "finish_reason": out.finish_reason})
                texts.setdefault(name, out.text)
                print(json.dumps({"mode": mode, "setting": name, **runs[name][-1]}), flush=True)
        guided.Guide.forced = real_forced
        results.append({"mode": mode, "runs": runs, "equal_text": texts["forced"] == texts["off"],
                        "text": texts["forced"],
                        "median_tokens_per_s": {k: statistics.median(x["tokens_per_s"] for x in v)
                                                for k, v in runs.items()}})
    out = {"model": args.model, "prompt_tokens": len(ids), "constraint": args.constraint,
           "temperature": args.temperature, "threads": torch.get_num_threads(), "cpu": cpu_model(), "isa": cpu_isa(),
           "results": results}
    report(out, args.out)


if __name__ == "__main__":
    main()
