"""A request decodes when another's long prompt arrives: what each mode gives the first while the second
prefills, and what it costs the second.

The first request (`--decode-tokens` of the text, greedy, `--max-tokens` new) runs alone in a batch until
it has committed its first tokens; then the second (`--prompt-tokens` from `--prompt-start` on) joins the same
batch (coordinator/batch.py: its prompt chunks wait at the target and run with the first's target
forwards). Reported per mode and run: the first request's tokens committed between the second's arrival
and its first token, milliseconds per such token, and the second's time to first token. One JSON line per
run.

    python benchmarks/prefill_interplay.py --text ../shared/data/austen-emma.txt --modes ar triforce auto
"""
from __future__ import annotations

import argparse
import json
import time

from triforce import LLM, SamplingParams
from triforce.request import Request
from triforce.coordinator.batch import SequenceBatch
from triforce.coordinator.batchmates import Batchmates


def timed(request: Request, times: list) -> Request:
    """`request`, noting the time and count of each commit of its tokens."""
    commit = request.on_tokens
    request.on_tokens = lambda new: (times.append((time.perf_counter(), len(new))), commit(new))[1]
    return request


def once(llm: LLM, first: list[int], second: list[int], max_tokens: int) -> dict:
    mates, batch = Batchmates(), SequenceBatch()
    decoded, answered = [], []
    greedy = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    batch.add(timed(Request(llm, first, greedy, None, mates), decoded).run())
    while not decoded:
        batch.step()
    arrived = time.perf_counter()
    newcomer = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    batch.add(timed(Request(llm, second, newcomer, None, mates), answered).run())
    batch.run()
    ttft = answered[0][0] - arrived
    during = sum(n for t, n in decoded if arrived < t <= answered[0][0])
    return {"tokens_during_prefill": during, "ms_per_token_during": round(1e3 * ttft / max(1, during), 1),
            "newcomer_ttft_s": round(ttft, 2)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--text", required=True)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--modes", nargs="+", default=["ar", "triforce", "auto"])
    p.add_argument("--decode-tokens", type=int, default=2048, help="the decoding request's prompt")
    p.add_argument("--prompt-tokens", type=int, default=4096, help="the arriving request's prompt")
    p.add_argument("--prompt-start", type=int, default=20000, help="where in the text it begins")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    for mode in args.modes:
        llm = LLM(args.model, mode=mode, prefix_cache_gb=0)
        text = llm.encode(open(args.text, encoding="utf-8").read())
        first = text[:args.decode_tokens]
        second = text[args.prompt_start:args.prompt_start + args.prompt_tokens]
        for run in range(args.repeats):
            print(json.dumps({"mode": mode, "run": run, "dtype": str(llm.dtype),
                              **once(llm, first, second, args.max_tokens)}), flush=True)


if __name__ == "__main__":
    main()
