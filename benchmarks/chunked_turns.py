"""A batch's decode with the chunked passes over vocabulary rows on and off (`row_argmax`, `one_draw`:
speculation/sampling.py), in turns in one process.

    python benchmarks/chunked_turns.py [--text ../shared/data/austen-emma.txt] [--batch 8] [--length 7936]
        [--temperature 0] [--mode triforce] [--turns 3]

The prompts (cut as the bench cuts them) are prefilled once and kept in the prefix store, so each turn
mostly decodes; its speed is the bench's (the batch's tokens over its longest request's decode_s).
Setting speculation.sampling.ROW_CHUNK past the vocabulary turns both off (a row of no whole number of
chunks takes torch's argmax and the flat cumulative sum). Prints a JSON line per turn and a summary:
tokens/s of the whole batch, on / off."""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics

import triforce.speculation.sampling as sampling
from triforce import LLM, SamplingParams


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--text", default="../shared/data/austen-emma.txt")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--length", type=int, default=7936)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--mode", default="triforce")
    p.add_argument("--turns", type=int, default=3)
    args = p.parse_args()
    llm = LLM("smollm2", None, "auto", prefix_cache_gb=4)
    ids = llm.tokenizer(open(args.text).read())["input_ids"]
    prompts = [ids[i * args.length:(i + 1) * args.length] for i in range(args.batch)]
    base = llm.config
    llm.config = dataclasses.replace(base, mode="ar")
    llm.generate(prompts, SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))  # into the prefix store
    llm.config = dataclasses.replace(base, mode=args.mode)
    chunk, speeds = sampling.ROW_CHUNK, {"on": [], "off": []}
    for turn in range(args.turns):
        for state in (("on", "off") if turn % 2 == 0 else ("off", "on")):
            sampling.ROW_CHUNK = chunk if state == "on" else 1 << 40
            outs = llm.generate(prompts, SamplingParams(max_tokens=args.max_new_tokens, temperature=args.temperature,
                                                        seed=0, ignore_eos=True))
            # as the bench: the batch's tokens over its longest request's decode (the draft's prefill left out)
            speed = sum(len(o.token_ids) for o in outs) / max(o.metrics.decode_s for o in outs)
            speeds[state].append(speed)
            print(json.dumps({"turn": turn, "chunked": state, "tokens_per_s": round(speed, 1)}), flush=True)
    on, off = statistics.median(speeds["on"]), statistics.median(speeds["off"])
    print(json.dumps({"mode": args.mode, "batch": args.batch, "temperature": args.temperature,
                      "on_tokens_per_s": round(on, 1), "off_tokens_per_s": round(off, 1),
                      "on_over_off": round(on / off, 3)}))


if __name__ == "__main__":
    main()
