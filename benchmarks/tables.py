"""Markdown tables of a benchmarks/run.sh results folder (what docs/speed.md shows).

    python benchmarks/tables.py benchmarks/results/issue3
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


# Runs of `triforce bench` over the novel workload: the main run of benchmarks/run.sh, and later
# re-runs of it named in docs/speed.md (each rendered when present).
SPEED_FILES = ("speed.json", "default_budget2048_8k.json", "speed_with_llamacpp.json", "speed_fused.json")


def load(folder: Path, name: str) -> list[dict]:
    path = folder / name
    return json.loads(path.read_text())["results"] if path.is_file() else []


def acceptance(row: dict, tier: str) -> str:
    rate = next((t["acceptance_rate"] for t in row.get("tiers", []) if t["name"] == tier), None)
    return "" if rate is None else f"{rate:.2f}"


def speed_table(rows: list[dict]) -> str:
    runs = [r for r in ("ar", "draft", "retrieval", "triforce", "transformers", "assisted", "llamacpp")
            if any(x["run"] == r for x in rows)]
    peers = [r for r in ("ar", "transformers", "assisted", "llamacpp") if r in runs]
    out = ["| prompt tokens | " + " | ".join(f"`{r}` tok/s" for r in runs) + " | "
           + " | ".join(f"triforce / {r}" for r in peers) + " | tier-1 acc. | tier-2 acc. |",
           "|---" * (len(runs) + len(peers) + 3) + "|"]
    # one row per prompt (its length, batch and workload: a batch's rows overwrote batch 1's)
    for key in sorted({group_key(r) for r in rows}, key=str):
        group = {r["run"]: r for r in rows if group_key(r) == key}
        tri = group.get("triforce")  # (the bench's default modes run none: no ratios then)
        cells = [f"{group[r]['tokens_per_s']:.1f}" if r in group else "" for r in runs]
        ratios = [f"{tri['tokens_per_s'] / group[r]['tokens_per_s']:.2f}x" if r in group and tri else "" for r in peers]
        length, batch, workload = key
        label = f"{length:,}" + (f" x {batch}" if batch != 1 else "") + (f" ({workload})" if workload != "novel" else "")
        out.append(f"| {label} | " + " | ".join(cells + ratios) + f" | {acceptance(tri or {}, 'retrieval')} | "
                   f"{acceptance(tri or {}, 'target')} |")
    return "\n".join(out)


def group_key(row: dict) -> tuple:
    """The prompt a row ran: its length, batch and workload (older reports name neither of the last two)."""
    return row["prompt_tokens"], row.get("batch", 1), row.get("workload", "novel")


def sweep_table(rows: list[dict], setting: str) -> str:
    ar = next(r for r in rows if r["run"] == "ar")
    tri = sorted((r for r in rows if r["run"] == "triforce"), key=lambda r: r[setting])
    out = [f"| {setting} | " + " | ".join(str(r[setting]) for r in tri) + " |", "|---" * (len(tri) + 1) + "|",
           "| triforce / ar | " + " | ".join(f"{r['tokens_per_s'] / ar['tokens_per_s']:.2f}x" for r in tri) + " |",
           "| tier-1 acceptance | " + " | ".join(acceptance(r, "retrieval") for r in tri) + " |",
           "| tier-2 acceptance | " + " | ".join(acceptance(r, "target") for r in tri) + " |"]
    return "\n".join(out) + f"\n\n(`ar`: {ar['tokens_per_s']:.1f} tokens/s)"


def tree_table(rows: list[dict], setting: str, mode: str, checker: str) -> str:
    """A tree-size sweep at one temperature: speed against `ar` and against the chain (size 0), and the
    mean accepted length and proposals per check at the tier that checks the trees."""
    ar = next(r for r in rows if r["run"] == "ar")
    runs = sorted((r for r in rows if r["run"] == mode), key=lambda r: str(r[setting]).zfill(4))  # "auto" last
    chain = next(r for r in runs if str(r[setting]) == "0")
    stats = [next(t for t in r["tiers"] if t["name"] == checker) for r in runs]
    out = [f"| {setting} | " + " | ".join(str(r[setting]) for r in runs) + " |", "|---" * (len(runs) + 1) + "|",
           "| tokens/s | " + " | ".join(f"{r['tokens_per_s']:.1f}" for r in runs) + " |",
           f"| {mode} / ar | " + " | ".join(f"{r['tokens_per_s'] / ar['tokens_per_s']:.2f}x" for r in runs) + " |",
           "| tree / chain | " + " | ".join(f"{r['tokens_per_s'] / chain['tokens_per_s']:.2f}x" for r in runs) + " |",
           f"| {checker}: accepted length per check | " + " | ".join(f"{t['mean_accepted_length']:.2f}" for t in stats)
           + " |",
           f"| {checker}: proposals per check | " + " | ".join(f"{t['proposed_per_check']:.1f}" for t in stats) + " |"]
    return "\n".join(out) + f"\n\n(`ar`: {ar['tokens_per_s']:.1f} tokens/s)"


def bench_reports(folder: Path) -> list[tuple[Path, dict]]:
    """The single `triforce bench` runs of a folder (not sweeps, not other programs' JSON)."""
    reports = [(p, json.loads(p.read_text())) for p in sorted(folder.glob("*.json"))
               if not p.name.startswith(("sweep_", "trees_"))]
    return [(p, r) for p, r in reports if isinstance(r, dict) and isinstance(r.get("results"), list) and all(
        isinstance(x, dict) and {"run", "temperature", "prompt_tokens"} <= x.keys() for x in r["results"])]


def isa_table(folder: Path) -> str:
    """One row per `triforce bench` JSON that records its CPU level (benchmarks/isa_levels.sh and the runs
    of the landed code before it): 8K greedy, ar and triforce, transformers where it ran."""
    out = ["| run | dtype | kernels | torch ISA | `ar` tok/s | `triforce` tok/s | triforce / ar | `ar` prefill s | "
           "`transformers` tok/s | `transformers` prefill s | tier-1 acc. | tier-2 acc. | triforce = ar |", "|---" * 13 + "|"]
    for path, report in bench_reports(folder):
        cpu = report.get("cpu") or {"kernel_path": "torch (landed code)", "torch_cpu_capability": ""}
        greedy = [r for r in report["results"] if r["temperature"] == 0]
        longest = max((r["prompt_tokens"] for r in greedy), default=None)
        rows: dict[str, list[dict]] = {}
        for r in greedy:
            if r["prompt_tokens"] == longest:
                rows.setdefault(r["run"], []).append(r)
        if not {"ar", "triforce"} <= rows.keys() or any(len(v) > 1 for v in rows.values()):
            continue  # no greedy ar and triforce, or a sweep's several rows per run: not this table's
        ar, tri, hf = rows["ar"][0], rows["triforce"][0], rows.get("transformers", [None])[0]
        peer = [f"{hf['tokens_per_s']:.1f}", f"{hf['prefill_s']:.1f}"] if hf else ["", ""]
        cells = [path.stem, report["dtype"], cpu["kernel_path"], cpu["torch_cpu_capability"], f"{ar['tokens_per_s']:.1f}",
                 f"{tri['tokens_per_s']:.1f}", f"{tri['tokens_per_s'] / ar['tokens_per_s']:.2f}x", f"{ar['prefill_s']:.1f}",
                 *peer, acceptance(tri, "retrieval"), acceptance(tri, "target"), str(tri.get("equals_ar", ""))]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main() -> None:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "bench-out")
    if any("cpu" in report for _, report in bench_reports(folder)):
        print(f"### instruction-set levels (8K, greedy)\n\n{isa_table(folder)}\n")
    for name in SPEED_FILES:
        speed = load(folder, name)
        for temperature in sorted({r["temperature"] for r in speed}):
            rows = [r for r in speed if r["temperature"] == temperature]
            print(f"### {name}: temperature {temperature}\n\n{speed_table(rows)}\n")
    assisted = load(folder, "assisted.json")
    if assisted:
        print("### assisted generation (2K, greedy)\n\n" + ", ".join(
            f"`{r['run']}` {r['tokens_per_s']:.1f} tok/s" for r in assisted) + "\n")
    passkey = load(folder, "passkey.json")
    if passkey:
        print("### passkey\n\n| temperature | run | tok/s | vs ar | tier-1 acc. | tier-2 acc. | answer holds the key |\n"
              "|---|---|---|---|---|---|---|")
        for r in passkey:
            print(f"| {r['temperature']} | {r['run']} | {r['tokens_per_s']:.1f} | {r.get('speedup_vs_ar', 1):.2f}x | "
                  f"{acceptance(r, 'retrieval') or acceptance(r, 'target') if r['run'] != 'ar' else ''} | "
                  f"{acceptance(r, 'target') if r['run'] == 'triforce' else ''} | {r['passkey_found']} |")
        print()
    temps = [r for r in load(folder, "temperature.json") if r["run"] == "triforce"]
    if temps:
        print("### acceptance vs temperature (triforce, 8K)\n\n| temperature | " +
              " | ".join(str(r["temperature"]) for r in temps) + " |\n" + "|---" * (len(temps) + 1) + "|\n"
              "| tier-1 (draft by retrieval) | " + " | ".join(acceptance(r, "retrieval") for r in temps) + " |\n"
              "| tier-2 (retrieval by target) | " + " | ".join(acceptance(r, "target") for r in temps) + " |\n"
              "| triforce / ar | " + " | ".join(f"{r['speedup_vs_ar']:.2f}x" for r in temps) + " |\n")
    for name, setting, mode, checker in (("trees_triforce.json", "tree1", "triforce", "retrieval"),
                                         ("trees_retrieval.json", "tree2", "retrieval", "target")):
        rows = load(folder, name)
        for temperature in sorted({r["temperature"] for r in rows}):
            at = [r for r in rows if r["temperature"] == temperature]
            print(f"### {name}: {setting} in `{mode}` mode, temperature {temperature}\n\n"
                  f"{tree_table(at, setting, mode, checker)}\n")
    for setting in ("budget", "chunk_size", "gamma1", "gamma2", "window"):
        rows = load(folder, f"sweep_{setting}.json")
        for temperature in sorted({r["temperature"] for r in rows}):  # (each against its own ar)
            at = [r for r in rows if r["temperature"] == temperature]
            print(f"### sweep: {setting} (8K, temperature {temperature})\n\n{sweep_table(at, setting)}\n")
    pipeline = [folder / f"pipeline_workers{w}.json" for w in (0, 1)]
    if all(p.is_file() for p in pipeline):
        single, dist = (json.loads(p.read_text().strip().splitlines()[-1])["metrics"] for p in pipeline)
        print(f"### pipeline on one machine (8K prompt, greedy)\n\none process: {single['tokens_per_s']:.1f} tok/s; "
              f"--workers 1: {dist['tokens_per_s']:.1f} tok/s ({dist['tokens_per_s'] / single['tokens_per_s']:.2f}x), "
              f"{dist['control_bytes_per_token']:,} control-plane bytes and "
              f"{dist['control_messages'] / max(1, dist['generated_tokens']):.1f} messages per generated token, "
              f"{dist['worker_wait_s']:.1f} s waiting on the workers\n")


if __name__ == "__main__":
    main()
