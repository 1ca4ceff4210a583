"""Structured outputs on a long document: a chat request that puts most of a novel before a question
whose answer must follow a JSON schema, in each mode, with and without the schema, the settings taking
turns. Each mode prefills the document once (its prefix store keeps it; `prefill_s` of the runs is then
the restore), so the runs measure decoding.

    python benchmarks/structured_outputs.py --text ../shared/data/austen-emma.txt [--length 7936]
        [--max-new-tokens 256] [--modes ar triforce auto] [--temperatures 0 0.6] [--repeats 2] [--out F]

Prints JSON (and writes it to --out): per mode, temperature and setting, each turn's tokens/s, tokens,
finish reason, per-tier acceptance and the seconds the constraint's masks took (Guide.apply, timed),
with medians; and whether each constrained answer that ended parses and fits the schema."""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from triforce import LLM, SamplingParams
from triforce.sampling_params import StructuredOutputs
from triforce.kernels.cpu import cpu_isa, cpu_model
from triforce.speculation import guided

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["characters", "places", "summary"],
          "properties": {
              "characters": {"type": "array", "items": {"type": "object", "additionalProperties": False,
                                                        "required": ["name", "role"],
                                                        "properties": {"name": {"type": "string"},
                                                                       "role": {"type": "string"}}}},
              "places": {"type": "array", "items": {"type": "string"}},
              "summary": {"type": "string"}}}
QUESTION = ("List the characters of the story above with their roles, the places it names, and a one-sentence "
            "summary, as JSON with the keys characters (name, role), places and summary.")


def fits(text: str) -> bool:
    """The text parses and has the schema's keys and shapes (the schema's own checks, written out)."""
    try:
        answer = json.loads(text)
    except ValueError:
        return False
    return (set(answer) == {"characters", "places", "summary"} and isinstance(answer["summary"], str)
            and all(isinstance(p, str) for p in answer["places"])
            and all(set(c) == {"name", "role"} for c in answer["characters"]))


def document_chat(llm: LLM, path: str, length: int, question: str) -> list[int]:
    """A chat request of about `length` tokens: the start of the text at `path`, then `question`; prefilled
    once here, so that the prefix store restores it for the runs."""
    frame = len(llm.encode(llm.tokenizer.apply_chat_template(
        [{"role": "user", "content": "\n\n" + question}], add_generation_prompt=True, tokenize=False)))
    document = llm.encode(Path(path).read_text(encoding="utf-8"))[:length - frame - 16]
    turn = [{"role": "user", "content": llm.tokenizer.decode(document) + "\n\n" + question}]
    ids = llm.encode(llm.tokenizer.apply_chat_template(turn, add_generation_prompt=True, tokenize=False))
    llm.generate(ids, SamplingParams(max_tokens=1))
    return ids


def report(out: dict, path: str | None) -> None:
    """Prints the results' JSON, and writes it to `path` if given."""
    text = json.dumps(out, indent=1)
    if path:
        Path(path).write_text(text)
    print(text)


def timed_masks() -> dict:
    """Wraps Guide.apply so that clock["s"] sums its seconds."""
    clock = {"s": 0.0}
    apply = guided.Guide.apply

    def timed(self, logits, histories):
        start = time.perf_counter()
        try:
            return apply(self, logits, histories)
        finally:
            clock["s"] += time.perf_counter() - start

    guided.Guide.apply = timed
    return clock


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--text", required=True)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--length", type=int, default=7936, help="prompt tokens in all (the document is cut to fit)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--modes", nargs="+", default=["ar", "triforce", "auto"])
    p.add_argument("--temperatures", nargs="+", type=float, default=[0.0, 0.6])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out")
    args = p.parse_args()
    clock = timed_masks()
    results, answers = [], []
    for mode in args.modes:
        llm = LLM(args.model, mode=mode)
        ids = document_chat(llm, args.text, args.length, QUESTION)
        for temperature in args.temperatures:
            runs = {"free": [], "schema": []}
            for r in range(args.repeats):
                for name in runs:
                    spec = StructuredOutputs(json=SCHEMA) if name == "schema" else None
                    params = SamplingParams(max_tokens=args.max_new_tokens, temperature=temperature, seed=r,
                                            structured_outputs=spec)
                    clock["s"] = 0.0
                    out = llm.generate(ids, params)[0]
                    m = out.metrics
                    runs[name].append({"tokens_per_s": round(m.tokens_per_s, 2), "tokens": m.generated_tokens,
                                       "finish_reason": out.finish_reason, "mask_s": round(clock["s"], 3),
                                       "decode_s": round(m.decode_s, 2), "prefill_s": round(m.prefill_s, 2),
                                       "acceptance": {t.name: round(t.acceptance_rate, 3) for t in m.tiers},
                                       "plans": [d["mode"] for d in m.auto or []]})
                    if spec is not None:
                        answers.append({"mode": mode, "temperature": temperature, "seed": r, "text": out.text,
                                        "ended": out.finish_reason == "stop", "fits": fits(out.text)})
                    print(json.dumps({"mode": mode, "temperature": temperature, "setting": name, **runs[name][-1]}),
                          flush=True)
            results.append({"mode": mode, "temperature": temperature, "runs": runs,
                            "median_tokens_per_s": {k: statistics.median(x["tokens_per_s"] for x in v)
                                                    for k, v in runs.items()}})
    out = {"model": args.model, "prompt_tokens": len(ids), "max_new_tokens": args.max_new_tokens,
           "threads": torch.get_num_threads(), "cpu": cpu_model(), "isa": cpu_isa(), "schema": SCHEMA,
           "results": results, "answers": answers}
    report(out, args.out)


if __name__ == "__main__":
    main()
