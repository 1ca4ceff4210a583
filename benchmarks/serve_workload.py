"""Issue 13's server benchmark: a closed-loop load on `triforce serve`, streaming, measured at the client.

Two workloads, each run once per setting on a fresh server (in this process, uvicorn on a free port,
the app of `triforce serve`), C client threads taking requests from one shared list:

- `mixed`: N requests whose prompts are 2K-8K tokens (evenly spread) cut from the given novels, each
  from its own place; per `--modes` (the default `auto` against `ar`).
- `document`: Q short questions, each after the same 8K-token document (the first novel's opening);
  prefix reuse off (`--prefix-cache-gb 0`) against on (the default 1 GB), in `--document-mode`.

For each run: requests/s, time to first token (the first streamed text; it includes the queue wait and
the prefill) and time per output token after it ((end - first token) / (tokens - 1), per request), p50
and p99 over the requests; for `document`, the cached prompt tokens the responses' usage reports.
Greedy, `--max-tokens` each. Prints one JSON line per run, then the summary (also to --out).

    python benchmarks/serve_workload.py --text ../shared/data/austen-*.txt --out RESULT.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import httpx
from serve_load import report, run_clients, start_server

from triforce import LLM
from triforce.serve.app import create_app

QUESTIONS = ["Who is the heroine of this story?", "Where does the story take place?",
             "Which character is the most sensible, and why?", "What does the heroine want most?",
             "Name two of the families in the story.", "How does the narrator describe the heroine's father?",
             "What happens at the first gathering described?", "Summarise the opening in one sentence."]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def ask(http: httpx.Client, url: str, prompt: list[int], max_tokens: int) -> dict:
    """One streamed completion; the client-side times and the usage."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    start, first, usage = time.perf_counter(), None, None
    with http.stream("POST", f"{url}/v1/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            if "error" in chunk:
                raise RuntimeError(chunk["error"]["message"])
            if first is None and chunk["choices"] and chunk["choices"][0]["text"]:
                first = time.perf_counter()
            usage = chunk.get("usage") or usage
    end = time.perf_counter()
    tokens = usage["completion_tokens"]
    return {"ttft_s": (first or end) - start, "tpot_s": (end - (first or end)) / max(1, tokens - 1),
            "completion_tokens": tokens, "prompt_tokens": usage["prompt_tokens"],
            "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"]}


def run(llm: LLM, prompts: list[list[int]], clients: int, max_tokens: int) -> dict:
    server, url = start_server(create_app(llm, "m"))
    try:
        with httpx.Client(timeout=3600) as http:
            ask(http, url, prompts[0][-256:], 8)  # first-use costs (mode auto's calibration) out of the way
        todo, done, lock = list(enumerate(prompts)), [None] * len(prompts), threading.Lock()

        def client():
            with httpx.Client(timeout=3600) as http:
                while True:
                    with lock:
                        if not todo:
                            return
                        i, prompt = todo.pop(0)
                    done[i] = ask(http, url, prompt, max_tokens)

        wall = run_clients([threading.Thread(target=client) for _ in range(clients)])
    finally:
        server.should_exit = True
    if any(d is None for d in done):
        raise SystemExit(f"{sum(d is None for d in done)} requests failed (see above)")
    ttft, tpot = [d["ttft_s"] for d in done], [d["tpot_s"] for d in done]
    return {"requests": len(done), "clients": clients, "wall_s": round(wall, 2),
            "requests_per_s": round(len(done) / wall, 4),
            "generated_tokens_per_s": round(sum(d["completion_tokens"] for d in done) / wall, 2),
            "ttft_p50_s": round(statistics.median(ttft), 3), "ttft_p99_s": round(percentile(ttft, 99), 3),
            "tpot_p50_ms": round(1000 * statistics.median(tpot), 2), "tpot_p99_ms": round(1000 * percentile(tpot, 99), 2),
            "prompt_tokens": sum(d["prompt_tokens"] for d in done),
            "cached_tokens": [d["cached_tokens"] for d in done]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--text", nargs="+", required=True, help="novels to cut prompts from (the first: the document)")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--workloads", nargs="+", default=["mixed", "document"], choices=["mixed", "document"])
    p.add_argument("--modes", nargs="+", default=["auto", "ar"], help="modes of the mixed workload")
    p.add_argument("--document-mode", default="auto")
    p.add_argument("--requests", type=int, default=32, help="requests of the mixed workload")
    p.add_argument("--min-tokens", type=int, default=2048)
    p.add_argument("--max-prompt-tokens", type=int, default=8000)
    p.add_argument("--document-tokens", type=int, default=7936)
    p.add_argument("--questions", type=int, default=8)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--out", default=None, help="also write the summary JSON here")
    args = p.parse_args()
    runs = []

    def record(row):
        runs.append(row)
        print(json.dumps(row), flush=True)

    if "mixed" in args.workloads:
        for mode in args.modes:
            llm = LLM(args.model, mode=mode, dtype=args.dtype, prefix_cache_gb=0)
            texts = [llm.encode(open(f, encoding="utf-8").read()) for f in args.text]
            step = (args.max_prompt_tokens - args.min_tokens) / max(1, args.requests - 1)
            prompts = []
            for i in range(args.requests):
                tokens = texts[i % len(texts)]
                length = round(args.min_tokens + i * step)
                start = (i // len(texts) * 7919) % max(1, len(tokens) - length)  # its own place in the novel
                prompts.append(tokens[start:start + length])
            record({"workload": "mixed", "mode": mode, "dtype": str(llm.dtype),
                    **run(llm, prompts, args.clients, args.max_tokens)})
    if "document" in args.workloads:
        for gb in (0, 1):
            llm = LLM(args.model, mode=args.document_mode, dtype=args.dtype, prefix_cache_gb=gb)
            document = llm.encode(open(args.text[0], encoding="utf-8").read())[:args.document_tokens]
            questions = (QUESTIONS * args.questions)[:args.questions]
            prompts = [document + llm.tokenizer(f"\n\nQuestion: {q}\nAnswer:", add_special_tokens=False).input_ids
                       for q in questions]
            record({"workload": "document", "mode": args.document_mode, "prefix_cache_gb": gb, "dtype": str(llm.dtype),
                    **run(llm, prompts, args.clients, args.max_tokens)})
    report({"model": args.model, "texts": args.text, "max_tokens": args.max_tokens, "runs": runs}, args.out)


if __name__ == "__main__":
    main()
