"""Per mode: tokens/s over all seeds (tokens over summed time) and the bottom tier's acceptance (mean over
seeds) of each labelled set of runs in this folder (run.sh), with the lookup on; then the greedy runs."""
import json
import statistics
from pathlib import Path

HERE = Path(__file__).parent


def lookup_on(path):
    return [r for r in json.loads(path.read_text())["results"] if r.get("lookup", 3) == 3]


labels = sorted({p.stem.split("_s")[0][len("sampled_"):] for p in HERE.glob("sampled_*_s*.json")})
for label in labels:
    runs = [lookup_on(p) for p in sorted(HERE.glob(f"sampled_{label}_s*.json"))]
    for i, mode in enumerate(("retrieval", "triforce", "draft")):
        rows = [r[i] for r in runs]
        speed = sum(r["generated_tokens"] for r in rows) / sum(r["generated_tokens"] / r["tokens_per_s"] for r in rows)
        acc = statistics.mean(r["tiers"][0]["acceptance_rate"] for r in rows)
        print(f"T=0.6 {label:16s} {mode:9s} {speed:6.1f} tok/s  bottom-tier acceptance {acc:.3f} ({len(rows)} seeds)")
for path in sorted(HERE.glob("greedy_*.json")):
    for r, mode in zip(lookup_on(path), ("retrieval", "triforce", "draft") * 2):
        tiers = ", ".join(f"{t['drafter']}->{t['name']} {t['acceptance_rate']:.3f} ({t['mean_accepted_length']:.2f}/check)"
                          for t in r["tiers"])
        print(f"T=0   {path.stem:16s} {r['prompt_tokens']:5d} {mode:9s} {r['tokens_per_s']:6.1f} tok/s  {tiers}")
