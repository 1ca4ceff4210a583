"""Modes taking turns over the same restored prompts, each turn under cProfile: where a mode's decode time
goes next to another's (e.g. auto, when it plans `ar`, against `ar`). Prints a JSON line per turn: the
batch's decode tokens/s (as the bench computes it) and the functions of most own time (seconds, calls).

    python benchmarks/turns_profile.py --batch 8 --temperature 0.6 --modes ar auto ar auto

The prompts are cut as the bench cuts them from --text files (prompt i: file i mod F, from token
(i // F) * length), prefilled once untimed and restored by every turn (a prefix store), so each turn's
profile holds the restore, the last partial prefill chunk, the other tiers' prefill and the decode.
"""
import argparse
import cProfile
import dataclasses
import json
import pstats

from triforce import LLM, SamplingParams
from triforce.launch.bench import fill_prefix_store
from triforce.launch.bench_plan import batch_prompt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--draft", default=None)
    parser.add_argument("--text", nargs="+", default=[f"../shared/data/austen-{name}.txt" for name in (
        "emma", "mansfieldpark", "northangerabbey", "persuasion", "prideprejudice", "sensesensibility")])
    parser.add_argument("--length", type=int, default=7936)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--modes", nargs="+", default=["ar", "auto", "ar", "auto"])
    parser.add_argument("--top", type=int, default=12, help="functions shown per turn")
    parser.add_argument("--prefix-cache-gb", type=float, default=4.0, help="must hold the batch's prompts' KV")
    args = parser.parse_args()

    llm = LLM(args.model, args.draft, "auto", prefix_cache_gb=args.prefix_cache_gb)
    base = llm.config
    files = [llm.tokenizer(open(path, encoding="utf-8").read())["input_ids"] for path in args.text]
    prompts = [batch_prompt(files, i, args.length) for i in range(args.batch)]
    fill_prefix_store(llm, base, prompts)
    params = SamplingParams(max_tokens=args.max_new_tokens, temperature=args.temperature, seed=0, ignore_eos=True)
    for turn, mode in enumerate(args.modes):
        llm.config = dataclasses.replace(base, mode=mode)
        profile = cProfile.Profile()
        profile.enable()
        outs = llm.generate(prompts, params)
        profile.disable()
        generated = sum(o.metrics.generated_tokens for o in outs)
        stats = pstats.Stats(profile).stats  # (file, line, name) -> (calls, primitive calls, own s, total s, ...)
        top = sorted(stats.items(), key=lambda item: item[1][2], reverse=True)[:args.top]
        print(json.dumps({"turn": turn, "mode": mode,
                          "tokens_per_s": round(generated / max(o.metrics.decode_s for o in outs), 2),
                          "profiled_s": round(sum(s[2] for s in stats.values()), 3),
                          "own_seconds": {f"{name} ({file.rsplit('/', 1)[-1]}:{line})": [round(s[2], 3), s[0]]
                                          for (file, line, name), s in top}}), flush=True)


if __name__ == "__main__":
    main()
