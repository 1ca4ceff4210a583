"""Tokens/s of each (prompt, temperature, mode) in the A/B runs of run.sh: every file's, and new / old over
the means of each side's seeds (a file's side is the commit its name starts with; the older one is `old`).

    python benchmarks/results/attention_prefetch/table.py FILES..."""
import json
import statistics
import sys
from pathlib import Path

OLD = "92cbc05"

rows: dict = {}
for name in sys.argv[1:]:
    side = "old" if Path(name).name.startswith(OLD) else "new"
    for r in json.loads(Path(name).read_text())["results"]:
        key = (r["prompt_tokens"], r["temperature"], r["run"])
        rows.setdefault(key, {"old": [], "new": [], "equal": []})[side].append(r["tokens_per_s"])
        rows[key]["equal"].append(r.get("equals_ar"))
print("| prompt | T | mode | old tokens/s | new tokens/s | new / old | equals `ar` |")
print("|---|---|---|---|---|---|---|")
for (n, t, mode), v in sorted(rows.items()):
    if not v["old"] or not v["new"]:
        continue  # a side still running
    old, new = statistics.mean(v["old"]), statistics.mean(v["new"])
    runs = lambda xs: ", ".join(f"{x:.1f}" for x in xs)
    equal = "" if mode == "ar" or t > 0 else str(all(v["equal"]))
    print(f"| {n} | {t} | `{mode}` | {runs(v['old'])} | {runs(v['new'])} | {new / old:.2f}x | {equal} |")
