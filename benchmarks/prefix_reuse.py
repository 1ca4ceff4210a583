"""Time to first token with and without prefix reuse: several short questions about one long document.

The first question prefills the whole document (cold); the next ones restore its KV from the prefix store
(warm). Every question also runs on an LLM without a store, and the outputs must match (greedy). Prints
JSON: per question, time to first token (the call to the first streamed text) cold and warm, prefill
seconds, and the prompt tokens restored.

With --together the questions arrive at once instead, as one `generate` call (one batch): without a store
every one of them prefills the document; with one, the first prefills each block and the others restore
it as soon as it is stored. Prints the call's seconds, each question's prefill seconds and restored
tokens, both ways.

    python benchmarks/prefix_reuse.py --text ../shared/data/austen-emma.txt --tokens 7936 [--mode triforce] [--together]
"""
from __future__ import annotations

import argparse
import json
import time

from triforce import LLM, SamplingParams

QUESTIONS = ("\n\nQuestion: Who is the heroine of this story? Answer:",
             "\n\nQuestion: Where does the story take place? Answer:",
             "\n\nQuestion: Summarise the last chapter in one sentence. Answer:")


def first_token(llm: LLM, prompt: list[int], params: SamplingParams):
    seen: list[float] = []
    start = time.perf_counter()
    out = llm.generate(prompt, params, stream=lambda text: seen.append(time.perf_counter()) if not seen else None)[0]
    return (seen[0] if seen else time.perf_counter()) - start, out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--text", required=True)
    p.add_argument("--tokens", type=int, default=7936, help="document tokens")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--mode", default="triforce")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--together", action="store_true", help="the questions as one batch (see above)")
    args = p.parse_args()
    warm = LLM(args.model, mode=args.mode, dtype=args.dtype, prefix_cache_gb=2.0)
    cold = LLM(args.model, mode=args.mode, dtype=args.dtype, prefix_cache_gb=0)
    document = warm.encode(open(args.text, encoding="utf-8").read())[: args.tokens]
    params = SamplingParams(max_tokens=args.max_new_tokens, temperature=0, ignore_eos=True)
    if args.together:
        return together(args, warm, cold, len(document), [document + warm.encode(q) for q in QUESTIONS], params)
    rows = []
    for question in QUESTIONS:
        prompt = document + warm.encode(question)
        ttft_warm, out_warm = first_token(warm, prompt, params)
        ttft_cold, out_cold = first_token(cold, prompt, params)
        rows.append({"question": question.strip(), "prompt_tokens": len(prompt),
                     "ttft_cold_s": round(ttft_cold, 3), "ttft_warm_s": round(ttft_warm, 3),
                     "prefill_cold_s": round(out_cold.metrics.prefill_s, 3),
                     "prefill_warm_s": round(out_warm.metrics.prefill_s, 3),
                     "cached_prompt_tokens": out_warm.metrics.cached_prompt_tokens,
                     "same_output": out_warm.token_ids == out_cold.token_ids})
        print(json.dumps(rows[-1]), flush=True)
    later = rows[1:]
    print(json.dumps({"model": args.model, "mode": args.mode, "document_tokens": len(document),
                      "ttft_cold_s": sum(r["ttft_cold_s"] for r in later) / len(later),
                      "ttft_warm_s": sum(r["ttft_warm_s"] for r in later) / len(later),
                      "all_same_output": all(r["same_output"] for r in rows), "questions": rows}))


def together(args, warm: LLM, cold: LLM, document_tokens: int, prompts: list[list[int]],
             params: SamplingParams) -> None:
    report = {"model": args.model, "mode": args.mode, "document_tokens": document_tokens, "questions": len(prompts)}
    outputs = {}
    for name, llm in (("cold", cold), ("warm", warm)):
        start = time.perf_counter()
        outputs[name] = llm.generate(prompts, params)
        report[f"{name}_s"] = round(time.perf_counter() - start, 3)
        report[f"{name}_prefill_s"] = [round(o.metrics.prefill_s, 3) for o in outputs[name]]
        report[f"{name}_cached_prompt_tokens"] = [o.metrics.cached_prompt_tokens for o in outputs[name]]
    report["same_output"] = [a.token_ids == b.token_ids for a, b in zip(outputs["cold"], outputs["warm"])]
    print(json.dumps(report))


if __name__ == "__main__":
    main()
