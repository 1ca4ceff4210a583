"""What verifying a batch's chain checks costs: B sequences, each a chain of g proposals with the checker's
g + 1 rows of logits over a vocabulary of V, verified one sequence at a time (each its own probabilities
and verify_chain, as before batch.check_together) against all at once (check_together: one probabilities
call per sampling setting, one flattened verify_chains).

    python benchmarks/verify_batch.py [--batch 1 2 4 8] [--gamma 6] [--vocab 49152]

Median of 21 runs per point, the two ways alternating, at temperature 0 and at 0.6 with top-p 0.9.
Prints JSON: ms per batch by (temperature, batch) and way."""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from triforce.sampling_params import SamplingParams
from triforce.coordinator.batch import check_together
from triforce.coordinator.runs import Check
from triforce.speculation.sampling import probabilities
from triforce.speculation.verify import verify_chain


def one_at_a_time(checks: list[Check]) -> list:
    out = []
    for c in checks:
        p = c.params
        target = probabilities(c.logits, p.temperature, p.top_k, p.top_p)
        out.append((verify_chain(c.draft_tokens, c.draft_probs, target, c.generator, p.greedy), target))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--gamma", type=int, default=6)
    p.add_argument("--vocab", type=int, default=49152)
    args = p.parse_args()
    g, vocab = args.gamma, args.vocab
    rows = []
    for temperature, top_p in ((0.0, 1.0), (0.6, 0.9)):
        params = SamplingParams(temperature=temperature, top_p=top_p)
        for batch in args.batch:
            gen = torch.Generator().manual_seed(batch)
            checks = []
            for _ in range(batch):
                draft = probabilities(torch.randn(g, vocab, generator=gen), temperature, 0, top_p)
                tokens = draft.argmax(-1).tolist()
                checks.append(Check(tokens, draft, torch.randn(g + 1, vocab, generator=gen), params,
                                    torch.Generator().manual_seed(1)))
            times = {"one_at_a_time": [], "together": []}
            for _ in range(21):
                for name, way in (("one_at_a_time", one_at_a_time), ("together", check_together)):
                    start = time.perf_counter()
                    way(checks)
                    times[name].append(1e3 * (time.perf_counter() - start))
            rows.append({"temperature": temperature, "top_p": top_p, "batch": batch, "gamma": g, "vocab": vocab,
                         **{f"{k}_ms": round(statistics.median(v), 3) for k, v in times.items()}})
    print(json.dumps({"threads": torch.get_num_threads(), "results": rows}, indent=1))


if __name__ == "__main__":
    main()
