"""Per run of `triforce bench --out` files: tokens/s against `ar` of the same file and temperature, and each
tier's acceptance, as the bench's rate and per token in brackets (`per_token` of batch_ceiling.py: the
chance the checker takes a proposal given it took the ones before). How drafts compared in
docs/draft.md (*mix5, the draft that ships*).

    python benchmarks/bench_acceptance.py benchmarks/results/issue12/amx16/ship/b8_*.json
"""
from __future__ import annotations

import json
import sys

from batch_ceiling import per_token


def rows(path: str) -> list[str]:
    bench = json.load(open(path))
    if "results" not in bench or "engine" not in bench:
        sys.exit(f"{path}: not a `triforce bench --out` file")
    gamma = {"retrieval": bench["engine"]["gamma2"]}  # tier 2's rounds held gamma2; the draft's chains gamma1
    out = []
    for t in sorted({r["temperature"] for r in bench["results"]}):
        runs = {r["run"]: r for r in bench["results"] if r["temperature"] == t}
        ar = runs["ar"]["tokens_per_s"]
        cells = [f"{path.split('/')[-1]} T={t} ar {ar:.1f} tok/s"]
        for name, run in runs.items():
            if name == "ar":
                continue
            tiers = " ".join(
                f"{x['drafter']}->{x['name']} {x['acceptance_rate']:.3f} ({per_token(x['checks'], x['accepted_per_depth'], gamma.get(x['drafter'], bench['engine']['gamma1'])):.3f})"
                for x in run["tiers"])
            cells.append(f"{name} {run['tokens_per_s'] / ar:.2f}x {tiers}")
        out.append(" | ".join(cells))
    return out


if __name__ == "__main__":
    for f in sys.argv[1:]:
        print("\n".join(rows(f)))
