"""Throughput of `triforce serve` under load: C clients at once, each sending R completions one after another.

The server runs in this process (uvicorn on a free local port, the app of `triforce serve`); clients are
threads speaking HTTP to it, each with prompts cut from a different place in the text (so no two share a
prefix block), greedy, `max_tokens` each. For each concurrency: the wall time, the generated tokens per
second of the whole server, and the requests' latency (mean, p50, max). A failed request stops it. With
C = 1 the requests run alone; with more, the scheduler batches them (coordinator/batch.py). Prints one
JSON line per concurrency, then a summary.

    python benchmarks/serve_load.py --text ../shared/data/austen-emma.txt --concurrency 1 2 4 [--mode auto]
"""
from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import httpx
import uvicorn

from triforce import LLM
from triforce.launch.with_workers import free_port
from triforce.serve.app import create_app


def start_server(app) -> tuple[uvicorn.Server, str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if httpx.get(f"{url}/health").status_code == 200:
                return server, url
        except httpx.TransportError:
            time.sleep(0.1)
    raise RuntimeError("the server did not start")


def client(url: str, prompts: list[list[int]], max_tokens: int, out: list[dict]) -> None:
    with httpx.Client(timeout=3600) as http:
        for prompt in prompts:
            start = time.perf_counter()
            r = http.post(f"{url}/v1/completions", json={"model": "m", "prompt": prompt, "max_tokens": max_tokens,
                                                         "temperature": 0, "ignore_eos": True})
            r.raise_for_status()
            out.append({"latency_s": time.perf_counter() - start,
                        "completion_tokens": r.json()["usage"]["completion_tokens"]})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--text", required=True)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--mode", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--prompt-tokens", type=int, default=1024)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--requests-per-client", type=int, default=2)
    p.add_argument("--out", default=None, help="also write the summary JSON here")
    args = p.parse_args()
    llm = LLM(args.model, mode=args.mode, dtype=args.dtype, prefix_cache_gb=0)
    tokens = llm.encode(open(args.text, encoding="utf-8").read())
    server, url = start_server(create_app(llm, "m"))
    runs, offset = [], 0
    try:
        for c in args.concurrency:
            # warm-up, untimed, at this many clients: first-use costs (auto's calibration measures each batch
            # size's costs as it first runs one: in the timed requests before)
            run_clients([threading.Thread(target=client, args=(url, [tokens[-args.prompt_tokens:]], args.max_tokens, []))
                         for _ in range(c)])
            per_client = []
            for _ in range(c):
                prompts = []
                for _ in range(args.requests_per_client):
                    prompts.append(tokens[offset:offset + args.prompt_tokens])
                    offset = (offset + args.prompt_tokens) % max(1, len(tokens) - args.prompt_tokens)
                per_client.append(prompts)
            results: list[list[dict]] = [[] for _ in range(c)]
            wall = run_clients([threading.Thread(target=client, args=(url, prompts, args.max_tokens, results[i]))
                                for i, prompts in enumerate(per_client)])
            done = [r for rs in results for r in rs]
            if len(done) != c * args.requests_per_client:
                raise SystemExit(f"{c * args.requests_per_client - len(done)} requests failed (see above)")
            latencies = [r["latency_s"] for r in done]
            row = {"concurrency": c, "requests": len(done), "wall_s": round(wall, 2),
                   "generated_tokens": sum(r["completion_tokens"] for r in done),
                   "tokens_per_s": round(sum(r["completion_tokens"] for r in done) / wall, 2),
                   "requests_per_min": round(60 * len(done) / wall, 2),
                   "latency_mean_s": round(statistics.mean(latencies), 2),
                   "latency_p50_s": round(statistics.median(latencies), 2), "latency_max_s": round(max(latencies), 2)}
            runs.append(row)
            print(json.dumps(row), flush=True)
    finally:
        server.should_exit = True
    base = runs[0]["tokens_per_s"]
    summary = {"model": args.model, "mode": args.mode, "dtype": llm.dtype, "prompt_tokens": args.prompt_tokens,
               "max_tokens": args.max_tokens, "requests_per_client": args.requests_per_client,
               "throughput_vs_first": [round(r["tokens_per_s"] / base, 2) for r in runs], "runs": runs}
    report(summary, args.out)


def run_clients(threads: list[threading.Thread]) -> float:
    """Starts the client threads together and waits for all; -> the wall seconds."""
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - start


def report(summary: dict, out: str | None) -> None:
    """Prints the summary line, and writes it to `out` too where given."""
    print(json.dumps(summary))
    if out:
        with open(out, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
