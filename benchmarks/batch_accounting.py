"""What a batch's decode spends beside its model calls, against what mode auto's model prices, from a
`benchmarks/batch_timeline.py` output: per mode, the seconds outside the calls plus in verification, the
model's overhead charged per sequence (every member's forwards at the overheads given, as measured alone)
and per call (1/B of that per sequence, as before 2026-12-06); and per tier the laggards' cost: its calls'
seconds against what the same sequence-forwards would take packed into full calls of the batch.

    python benchmarks/batch_accounting.py benchmarks/results/issue12/amx7/timeline_b8_emma_t06.json \
        --overheads benchmarks/results/issue12/amx7/alone_overheads_t06.json --batch 8
"""
import argparse
import json
import re

PREFILL_ROWS = 16  # batch_timeline.py's: a call of more tokens is a prompt chunk or catch-up
ROLES = {"ar": {"target": "bottom"}, "draft": {"draft": "bottom", "target": "check"},
         "retrieval": {"retrieval": "bottom", "target": "check"},
         "triforce": {"draft": "bottom", "retrieval": "check", "target": "check"}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("timeline")
    parser.add_argument("--overheads", required=True, help="JSON with an 'overhead' map, mode:tier/role -> s")
    parser.add_argument("--batch", type=int, required=True)
    args = parser.parse_args()
    overhead = json.load(open(args.overheads))["overhead"]
    for line in open(args.timeline):
        (mode, run), = json.loads(line).items()
        forwards, calls, seconds, verify, full = {}, {}, {}, 0.0, {}
        for key, c in run["calls"].items():
            if key.startswith("verify"):
                verify += c["s"]
                continue
            tier, together, rows = re.match(r"forward (\w+) x(\d+) n(\d+)", key).groups()
            if int(rows) > PREFILL_ROWS:
                continue
            forwards[tier] = forwards.get(tier, 0) + int(together) * c["n"]
            calls[tier] = calls.get(tier, 0) + c["n"]
            seconds[tier] = seconds.get(tier, 0.0) + c["s"]
            if int(together) == args.batch:
                full.setdefault(tier, []).append((c["n"], c["s"]))
        per = {t: overhead[f"{mode}:{t}/{ROLES[mode][t]}"] for t in forwards}
        packed = {t: sum(s for _, s in full[t]) / sum(n for n, _ in full[t]) * forwards[t] / args.batch
                  for t in forwards if t in full}
        print(json.dumps({
            "mode": mode, "decode_s": run["decode_s"],
            "outside_and_verify_s": round(run["outside_calls_s"] + verify, 2),
            "priced_per_sequence_s": round(sum(forwards[t] * per[t] for t in forwards), 2),
            "priced_per_call_s": round(sum(forwards[t] * per[t] for t in forwards) / args.batch, 2),
            "sequence_forwards": forwards, "calls": calls,
            "laggards_s": {t: round(seconds[t] - packed[t], 2) for t in packed}}))


if __name__ == "__main__":
    main()
