"""What a bench run reports: a run's row from its outputs (tokens/s over the batch, its tiers' counts, mode
auto's plans), the median of its repeats, and the speedups and equality with `ar` within its group."""
from __future__ import annotations

import statistics

from ..coordinator.metrics import RequestMetrics, TierStats

# Of each auto plan's why (coordinator/planning.py), what a report keeps (the rest is in `triforce generate --json`)
WHY_KEPT = ("predicted_tokens_per_s", "expected_tokens_per_s", "probe", "acceptance", "draft_upside", "realized",
            "overhead_ms")


def tier_summary(metrics) -> list[dict]:
    keys = ("name", "drafter", "proposed", "accepted", "acceptance_rate", "checks", "mean_accepted_length",
            "proposed_per_check", "accepted_per_depth", "seconds")
    return [{k: t[k] for k in keys} for t in metrics.to_dict()["tiers"]]


def medians(rows: list[dict], sweep_name: str | None) -> list[dict]:
    """One row per run (mode or peer, and sweep value) of its repeats: the repeat of median tokens/s (the
    lower of the two middle ones), with the median tokens/s and prefill, every repeat's tokens/s, and every
    repeat's tokens (`compare` checks them all)."""
    runs: dict[tuple, list[dict]] = {}
    for row in rows:
        runs.setdefault((row["run"], row.get(sweep_name)), []).append(row)
    if all(len(repeats) == 1 for repeats in runs.values()):
        return rows
    out = []
    for repeats in runs.values():
        ranked = sorted(repeats, key=lambda r: r["tokens_per_s"])
        middle = ranked[(len(ranked) - 1) // 2]
        out.append({**middle, "tokens_per_s": statistics.median(r["tokens_per_s"] for r in repeats),
                    "prefill_s": statistics.median(r["prefill_s"] for r in repeats),
                    "tokens_per_s_runs": [round(r["tokens_per_s"], 3) for r in repeats],
                    "token_ids_runs": [r["token_ids"] for r in repeats]})
    return out


def batch_row(outs) -> dict:
    """A run's measurements: one request's, or for a batch all generated tokens over the longest decode
    (the requests decode together) and its tiers' counts summed."""
    metrics = [o.metrics for o in outs]
    generated = sum(m.generated_tokens for m in metrics)
    decode_s = max(m.decode_s for m in metrics)
    pairs: dict[tuple[str, str], list[TierStats]] = {}  # requests of mode auto may have run different tiers
    for m in metrics:
        for t in m.tiers:
            pairs.setdefault((t.drafter, t.name), []).append(t)
    merged = RequestMetrics(tiers=[TierStats.merged(stats) for stats in pairs.values()])
    row = {"tokens_per_s": generated / decode_s if decode_s > 0 else 0.0,
           "prefill_s": max(m.prefill_s for m in metrics), "generated_tokens": generated,
           "retrieval_rebuilds": sum(m.retrieval_rebuilds for m in metrics), "tiers": tier_summary(merged),
           "token_ids": [o.token_ids for o in outs]}
    if any(m.cached_prompt_tokens for m in metrics):  # restored, not prefilled (--prefix-cache-gb)
        row["cached_prompt_tokens"] = sum(m.cached_prompt_tokens for m in metrics)
    if any(m.lookup for m in metrics):  # each request's prompt lookup: candidates, right ones, weight
        row["lookup_stats"] = [m.lookup for m in metrics]
    if any(m.auto for m in metrics):  # each request's plans: when, which tiers and gammas, and the gist of why
        row["auto_plans"] = [[{**{k: d[k] for k in ("at_token", "context", "mode", "gammas", "stop_below")},
                               "why": {k: d["why"][k] for k in WHY_KEPT if k in d.get("why", {})}}
                              for d in m.auto or []] for m in metrics]
        # whether each request's first plan started from earlier requests' acceptance (priors.py) or the defaults
        row["auto_prior"] = [m.auto[0]["why"].get("prior") if m.auto else None for m in metrics]
    return row


def compare(rows: list[dict], tokenizer, key: str | None) -> list[dict]:
    """Adds speedups against the group's ar and transformers runs, equality with ar when greedy, and
    whether the passkey was answered, each over every repeat of a run (equal, found: in all of them; the
    requests equal: the fewest of any); drops the token ids."""
    ar = next((r for r in rows if r["run"] == "ar"), None)
    plain = next((r for r in rows if r["run"] == "transformers"), None)
    greedy = rows[0]["temperature"] == 0 if rows else False
    for row in rows:
        for name, ref in (("ar", ar), ("transformers", plain)):
            if ref is not None and ref is not row and ref["tokens_per_s"] > 0:  # (0: one token, no rate)
                row[f"speedup_vs_{name}"] = round(row["tokens_per_s"] / ref["tokens_per_s"], 3)
        runs = row.get("token_ids_runs", [row["token_ids"]])  # (the median repeat's alone hid one that parted)
        if ar is not None and greedy and row is not ar:
            same = [[mine == theirs for mine, theirs in zip(run, ar["token_ids"])] for run in runs]
            row["equals_ar"] = all(all(run) for run in same)
            if len(same[0]) > 1:  # a batch: how many of its requests
                row["requests_equal_ar"] = min(sum(run) for run in same)
        if key is not None:
            row["passkey_found"] = all(key in tokenizer.decode(run[0][:16]) for run in runs)
    for row in rows:
        row["tokens_per_s"], row["prefill_s"] = round(row["tokens_per_s"], 3), round(row["prefill_s"], 3)
        del row["token_ids"]
        row.pop("token_ids_runs", None)
    return rows
