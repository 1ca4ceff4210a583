"""Tokens/s of each (prompt, temperature, mode) in the A/B runs of run.sh: every file's, and new / old over
the means of each side's seeds (a file's side is the commit its name starts with; the older one is `old`).

    python benchmarks/results/attention_prefetch/table.py [--old COMMIT] FILES...

--old: the short commit of the `old` side (default 92cbc05, this folder's; benchmarks/results/linear_pass/
uses ca1f92d). A sweep's runs are told apart by their setting ("triforce tree1=8")."""
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from seed_means import run_name  # noqa: E402

args = sys.argv[1:]
OLD = "92cbc05"
if args and args[0] == "--old":
    OLD, args = args[1], args[2:]

rows: dict = {}
for name in args:
    side = "old" if Path(name).name.startswith(OLD) else "new"
    bench = json.loads(Path(name).read_text())
    for r in bench["results"]:
        key = (r["prompt_tokens"], r["temperature"], run_name(bench, r))
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
