"""`triforce batch` on lines of mixed lengths, one checkout against another: how much a long answer holds
back the lines in flight beside it. Writes a JSONL of --lines completions (prompts cut from --text; every
--every-th asks for --long tokens, the rest for --short, all with ignore_eos and greedy), runs `python -m
triforce batch` on it once per --repo (PYTHONPATH=REPO, a fresh output each), and prints JSON: each run's
wall time, less that of a job of one line of one token by the same checkout (the process's start, the
model's load, one short prefill), and the tokens it generated per second of that.

    python benchmarks/batch_job_lengths.py --repo /tmp/before --repo . --text ../shared/data/austen-emma.txt
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def lines_of(text: str, count: int, every: int, long: int, short: int, words: int) -> list[str]:
    parts = text.split()
    out = []
    for i in range(count):
        prompt = " ".join(parts[i * words: (i + 1) * words])
        body = {"prompt": prompt, "max_tokens": long if i % every == 0 else short, "temperature": 0,
                "ignore_eos": True}
        out.append(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions", "body": body}))
    return out


def run(repo: Path, requests: Path, out: Path, extra: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(repo.resolve())}
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "triforce", "batch", "--input", str(requests), "--output", str(out),
                           *extra], env=env, capture_output=True, text=True, cwd=repo)  # (-m imports from the cwd)
    seconds = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"{repo}: exit {done.returncode}\n{done.stderr[-2000:]}")
    results = [json.loads(line) for line in out.read_text().splitlines()]
    tokens = sum(r["response"]["body"]["usage"]["completion_tokens"] for r in results)
    texts = {r["custom_id"]: r["response"]["body"]["choices"][0]["text"] for r in results}
    return {"repo": str(repo), "seconds": round(seconds, 2), "tokens": tokens,
            "tokens_per_s": round(tokens / seconds, 2), "order": [r["custom_id"] for r in results], "texts": texts}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repo", action="append", required=True, help="a checkout to run (repeat: compared in order)")
    p.add_argument("--text", required=True, help="text to cut the prompts from")
    p.add_argument("--lines", type=int, default=12)
    p.add_argument("--every", type=int, default=4, help="every N-th line is a long one")
    p.add_argument("--long", type=int, default=128)
    p.add_argument("--short", type=int, default=8)
    p.add_argument("--words", type=int, default=200, help="words of text per prompt")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--mode", default="ar")
    args, extra = p.parse_known_args()
    text = Path(args.text).read_text()
    requests = lines_of(text, args.lines, args.every, args.long, args.short, args.words)
    flags = ["--batch-size", str(args.batch_size), "--mode", args.mode, *extra]
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        inp, start = Path(tmp) / "requests.jsonl", Path(tmp) / "start.jsonl"
        inp.write_text("\n".join(requests) + "\n")
        start.write_text(lines_of(text, 1, 1, 1, 1, args.words)[0] + "\n")
        for i, repo in enumerate(args.repo):
            started = run(Path(repo), start, Path(tmp) / f"start{i}.jsonl", flags)["seconds"]
            runs.append(run(Path(repo), inp, Path(tmp) / f"out{i}.jsonl", flags))
            runs[-1]["start_seconds"] = started
            runs[-1]["generation_seconds"] = round(runs[-1]["seconds"] - started, 2)
            runs[-1]["tokens_per_generation_s"] = round(runs[-1]["tokens"] / runs[-1]["generation_seconds"], 2)
    same = all(r["texts"] == runs[0]["texts"] for r in runs)
    for r in runs:
        r.pop("texts")
    print(json.dumps({"lines": args.lines, "every": args.every, "long": args.long, "short": args.short,
                      "batch_size": args.batch_size, "mode": args.mode, "extra": extra, "same_texts": same,
                      "runs": runs, "speedup_last_over_first": round(runs[0]["generation_seconds"] /
                                                                    runs[-1]["generation_seconds"], 3)},
                     indent=1))


if __name__ == "__main__":
    main()
