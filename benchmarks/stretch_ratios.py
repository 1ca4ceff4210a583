"""How each mode's stretches ran against the speed model, from what `benchmarks/auto_why.py --stretches`
printed: per mode, the stretches' count and the mean, median, range and standard deviation of (tokens/s
reached) / (the model's tokens/s at the stretch's own acceptance). Prints JSON, one line per file and mode.

    python benchmarks/stretch_ratios.py WHY_OUTPUT.txt [...]
"""
from __future__ import annotations

import json
import re
import statistics
import sys

STRETCH = re.compile(r"\s+stretch (\S+) \[.*?\]: ([\d.]+) tokens/s; the model ([\d.]+) at")


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if len(sys.argv) > 1 else 2)
    for path in sys.argv[1:]:
        ratios: dict[str, list[float]] = {}
        for line in open(path):
            if (found := STRETCH.match(line)) and float(found[3]) > 0:
                ratios.setdefault(found[1], []).append(float(found[2]) / float(found[3]))
        for mode, r in ratios.items():
            print(json.dumps({"file": path, "mode": mode, "stretches": len(r), "mean": round(statistics.mean(r), 3),
                              "median": round(statistics.median(r), 3), "range": [round(min(r), 2), round(max(r), 2)],
                              "sd": round(statistics.pstdev(r), 3)}))


if __name__ == "__main__":
    main()
