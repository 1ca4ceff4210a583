"""What a soak (benchmarks/results/soak/soak.sh) saw, as JSON: answers by status, the greedy probe's
distinct texts, the median and worst latency of answered requests per stretch, the server's VmRSS (GB)
at each sample with the prefix store's bytes at that scrape (`triforce:prefix_cache_bytes`, where the
server reported it), and per stretch the least and most VmRSS beyond the store's bytes.

    python benchmarks/soak_summary.py soak-out/NAME [--stretch-s 600]

Reads NAME/requests.jsonl and NAME/monitor.jsonl (benchmarks/soak_load.py writes them)."""
import argparse
import collections
import json
import statistics
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", type=Path)
    p.add_argument("--stretch-s", type=float, default=600.0)
    args = p.parse_args()
    requests = [json.loads(line) for line in open(args.folder / "requests.jsonl")]
    monitor = [json.loads(line) for line in open(args.folder / "monitor.jsonl")]
    probes = [r for r in requests if r["kind"] == "probe"]
    stretches = collections.defaultdict(list)
    for r in requests:
        if r["status"] == 200 and r["kind"] != "probe":
            stretches[int(r["t"] // args.stretch_s)].append(r["lat"])
    print(json.dumps({
        "requests": len(requests), "by_status": dict(collections.Counter(str(r["status"]) for r in requests)),
        "probes": len(probes), "probe_texts": len({r.get("text") for r in probes if r["status"] == 200}),
        "probe_failures": [{k: r.get(k) for k in ("t", "status", "err", "lat")} for r in probes if r["status"] != 200],
        "latency_s": {f"{int(k * args.stretch_s)}-{int((k + 1) * args.stretch_s)}s":
                      {"answered": len(v), "median": round(statistics.median(v), 2), "max": round(max(v), 1)}
                      for k, v in sorted(stretches.items())},
        "rss_gb": [[round(m["t"]), round(rss_bytes(m) / 1e9, 2)]
                   + ([round(store(m) / 1e9, 2)] if store(m) is not None else []) for m in monitor],
        "rss_beyond_store_gb": {f"{int(k * args.stretch_s)}-{int((k + 1) * args.stretch_s)}s":
                                {"min": round(min(v), 2), "max": round(max(v), 2)}
                                for k, v in sorted(beyond(monitor, args.stretch_s).items())}}, indent=1))


def rss_bytes(sample: dict) -> int:
    """A monitor sample's VmRSS in bytes (/proc gives kB: KiB, 1,024 bytes; read as 1,000 before, which
    showed it 2.4% low)."""
    return sample["rss_kb"] * 1024


def store(sample: dict) -> float | None:
    """The prefix store's bytes at a monitor sample's scrape (None: the server did not report them)."""
    return next((v for k, v in sample.get("metrics", {}).items() if k.startswith("triforce:prefix_cache_bytes")), None)


def beyond(monitor: list[dict], stretch_s: float) -> dict[int, list[float]]:
    """Per stretch, each sample's VmRSS less the store's bytes (GB), where the store was reported."""
    out = collections.defaultdict(list)
    for m in monitor:
        if store(m) is not None:
            out[int(m["t"] // stretch_s)].append((rss_bytes(m) - store(m)) / 1e9)
    return out


if __name__ == "__main__":
    main()
