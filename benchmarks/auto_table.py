"""Markdown table of `triforce bench` reports that ran mode auto beside the fixed modes (what the docs
show): per prompt length, temperature and batch, each mode's tokens/s, the best fixed mode, auto against
it and against ar, and the plans auto ran.

    python benchmarks/auto_table.py benchmarks/results/issue12/auto_smollm2.json [more.json ...]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

FIXED = ("ar", "draft", "retrieval", "triforce")


def plans(row: dict) -> str:
    """Auto's plans of the batch's first request, in order, consecutive plans of one mode folded (shown by
    the first's gammas) unless they differ in ending chains early, "+stop" (stop_below; reports before
    2026-12-04 do not say)."""
    out: list[str] = []
    last = None
    for plan in (row.get("auto_plans") or [[]])[0]:
        stops = bool(plan.get("stop_below"))
        if (plan["mode"], stops) != last:
            out.append(plan["mode"] + (f" {','.join(map(str, plan['gammas']))}" if plan["gammas"] else "")
                       + ("+stop" if stops else ""))
            last = (plan["mode"], stops)
    return " -> ".join(out)


def acceptance(row: dict) -> str:
    return " / ".join(f"{t['acceptance_rate']:.2f}" for t in row.get("tiers", []))


def table(paths: list[Path]) -> str:
    lines = ["| report | prompt | T | batch | " + " | ".join(f"`{m}`" for m in FIXED) + " | `auto` | best fixed | "
             "auto / best | auto / ar | auto's plans | auto's acceptance |",
             "|" + "---|" * (4 + len(FIXED) + 1 + 5)]
    for path in paths:
        rows = json.loads(path.read_text())["results"]
        groups: dict[tuple, dict[str, dict]] = {}
        for r in rows:
            groups.setdefault((r.get("workload", "novel"), r["prompt_tokens"], r["temperature"], r.get("batch", 1)),
                              {})[r["run"]] = r  # (a report of two workloads: one group each, not one over both)
        for (workload, length, temperature, batch), runs in groups.items():
            if "auto" not in runs:
                continue
            speed = {m: runs[m]["tokens_per_s"] for m in (*FIXED, "auto") if m in runs}
            best = max((m for m in FIXED if m in speed), key=speed.get, default=None)  # a run of auto alone
            cells = [f"{speed[m]:.1f}" if m in speed else "" for m in (*FIXED, "auto")]
            against = [f"{speed['auto'] / speed[m]:.2f}x" if m in speed else "" for m in (best, "ar")]
            label = path.stem if workload == "novel" else f"{path.stem} ({workload})"
            lines.append(f"| {label} | {length} | {temperature} | {batch} | " + " | ".join(cells) +
                         f" | {best or ''} | {against[0]} | {against[1]} | {plans(runs['auto'])} | "
                         f"{acceptance(runs['auto'])} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table([Path(p) for p in sys.argv[1:]]))
