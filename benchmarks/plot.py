"""PNG plots from `triforce bench` JSON files (needs matplotlib: pip install -e .[bench]).

    python benchmarks/plot.py --speedup main.json --temperature temps.json --budget budget.json \
        --chunk chunk.json --out-dir benchmarks/results

Each option is optional; each makes one figure:
  speedup      tokens/s and speedup over ar vs prompt length, per run, per temperature (workload novel)
  batch        the same vs batch size (bench --batch; tokens/s of the whole batch)
  temperature  per-tier acceptance of mode triforce vs temperature
  budget       tokens/s and tier-2 acceptance vs retrieval budget
  chunk        tokens/s and tier-2 acceptance vs retrieval chunk size
  trees        speedup of trees over the chain (size 0) vs tree size, per temperature (tree1 or tree2 sweeps)
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def rows(paths: str | list[str], workload: str = "novel") -> list[dict]:
    paths = [paths] if isinstance(paths, str) else paths
    found = []
    for path in paths:
        try:
            found += [r for r in json.loads(Path(path).read_text())["results"] if r["workload"] == workload]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise SystemExit(f"plot: cannot read {path} as a bench JSON ({type(exc).__name__}: {exc})") from None
    return found


def need(data: list[dict], what: str, paths) -> list[dict]:
    """`data`, or an exit naming what the plot needs where the files hold none of it."""
    if not data:
        raise SystemExit(f"plot: {paths} holds no {what}")
    return data


def tier_acceptance(row: dict, name: str) -> float | None:
    return next((t["acceptance_rate"] for t in row.get("tiers", []) if t["name"] == name), None)


def plot_speedup(path: list[str], out: Path, x: str = "prompt_tokens") -> None:
    """x: prompt_tokens (batch 1 runs) or batch (each batch size's runs)."""
    data = need([r for r in rows(path) if x == "batch" or r.get("batch", 1) == 1], "rows of the novel workload", path)
    temps = sorted({r["temperature"] for r in data})
    fig, axes = plt.subplots(2, len(temps), figsize=(5.5 * len(temps), 8), squeeze=False)
    for col, temp in enumerate(temps):
        series = defaultdict(list)
        for r in data:
            if r["temperature"] == temp:
                series[r["run"]].append((r[x], r["tokens_per_s"], r.get("speedup_vs_ar", 1.0)))
        for run, pts in sorted(series.items()):
            pts.sort()
            axes[0][col].plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=run)
            axes[1][col].plot([p[0] for p in pts], [p[2] for p in pts], marker="o", label=run)
        axes[0][col].set_title(f"temperature {temp}")
        axes[0][col].set_ylabel("tokens/s")
        axes[1][col].set_ylabel("speedup over ar")
        axes[1][col].axhline(1.0, color="grey", lw=0.5)
        for ax in axes[:, col]:
            ax.set_xlabel("prompt tokens" if x == "prompt_tokens" else "batch size (sequences)")
            if x == "prompt_tokens":
                ax.set_xscale("log", base=2)  # contexts double: 2K ... 32K
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / ("speedup_vs_prompt_length.png" if x == "prompt_tokens" else "speedup_vs_batch.png"), dpi=110)


def plot_temperature(path: str, out: Path) -> None:
    data = sorted(need([r for r in rows(path) if r["run"] == "triforce"], "triforce runs", path),
                  key=lambda r: r["temperature"])
    fig, ax = plt.subplots(figsize=(6, 4))
    for tier, label in (("retrieval", "tier 1 (draft) accepted by tier 2 (retrieval)"),
                        ("target", "tier 2 accepted by the target")):
        ax.plot([r["temperature"] for r in data], [tier_acceptance(r, tier) for r in data], marker="o", label=label)
    ax.set_xlabel("temperature")
    ax.set_ylabel("acceptance rate")
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "acceptance_vs_temperature.png", dpi=110)


def plot_sweep(path: str, setting: str, out: Path) -> None:
    data = need([r for r in rows(path) if setting in r], f"runs of a --sweep {setting}=...", path)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax2 = ax.twinx()
    for run in sorted({r["run"] for r in data}):
        pts = sorted((r[setting], r["tokens_per_s"], tier_acceptance(r, "target")) for r in data if r["run"] == run)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{run} tokens/s")
        ax2.plot([p[0] for p in pts], [p[2] for p in pts], marker="x", ls="--", label=f"{run} tier-2 acceptance")
    ar = [r["tokens_per_s"] for r in rows(path) if r["run"] == "ar"]
    if ar:
        ax.axhline(ar[0], color="grey", lw=0.8, label="ar tokens/s")
    ax.set_xscale("log", base=2)
    ax.set_xlabel(setting)
    ax.set_ylabel("tokens/s")
    ax2.set_ylabel("acceptance by the target")
    ax2.set_ylim(0, 1.02)
    fig.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(out / f"{setting}_sweep.png", dpi=110)


def plot_trees(path: str, out: Path) -> None:
    """One line per mode and temperature: tokens/s of each numeric tree size over the chain's (size 0)."""
    data = need([r for r in rows(path) if "tree1" in r or "tree2" in r], "runs of a --sweep tree1= or tree2=", path)
    # the swept one: the setting some run holds at 0, the chain (a mode's fixed --tree1 / --tree2 is not 0)
    setting = "tree1" if any(str(r.get("tree1")) == "0" for r in data) else "tree2"
    fig, ax = plt.subplots(figsize=(6, 4))
    for run, temperature in sorted({(r["run"], r["temperature"]) for r in data}):
        sized = {int(r[setting]): r["tokens_per_s"] for r in data
                 if (r["run"], r["temperature"]) == (run, temperature) and str(r.get(setting, "")).isdigit()}
        if 0 not in sized:  # (no chain to divide by)
            continue
        sizes = sorted(sized)
        ax.plot(sizes, [sized[n] / sized[0] for n in sizes], marker="o", label=f"{run}, temperature {temperature}")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel(f"{setting} (nodes; 0 = the chain)")
    ax.set_ylabel("tokens/s over the chain's")
    ax.set_title(f"{data[0]['prompt_tokens']:,}-token prompt", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / f"{setting}_sweep.png", dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--speedup", nargs="+", help="one or more bench JSON files")
    p.add_argument("--batch", nargs="+", help="bench JSON files with --batch sizes")
    p.add_argument("--temperature")
    p.add_argument("--budget")
    p.add_argument("--chunk")
    p.add_argument("--trees", nargs="+", help="tree-size sweeps (--sweep tree1=... or tree2=...)")
    p.add_argument("--out-dir", default="bench-out")
    args = p.parse_args()
    if not any((args.speedup, args.batch, args.temperature, args.budget, args.chunk, args.trees)):
        p.error("name at least one plot: --speedup, --batch, --temperature, --budget, --chunk or --trees")
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if args.speedup:
        plot_speedup(args.speedup, out)
    if args.batch:
        plot_speedup(args.batch, out, x="batch")
    if args.temperature:
        plot_temperature(args.temperature, out)
    if args.budget:
        plot_sweep(args.budget, "budget", out)
    if args.chunk:
        plot_sweep(args.chunk, "chunk_size", out)
    for path in args.trees or []:
        plot_trees(path, out)


if __name__ == "__main__":
    main()
