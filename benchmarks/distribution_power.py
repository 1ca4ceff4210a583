"""The distribution fuzzer's power: its test of some cases with a fault injected into the target's draws.

    python benchmarks/distribution_power.py CASES FAULTS SEED RUNS     e.g.  6,8,12 none,residual,argmax,square 0 400

Faults: `residual` (a rejected chain's token drawn from the target's row, not the residual), `argmax` (the
recovered and bonus tokens taken greedily), `square` (drawn from the squared distribution), `none`.
Prints per case and fault its p-values (benchmarks/distribution_fuzz.p_values) and accepted of proposed."""
import inspect
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import distribution_fuzz as d  # noqa: E402
import triforce.coordinator.batch as batch  # noqa: E402
import triforce.speculation.verify as verify  # noqa: E402


def faulty_chains():
    """verify_chains drawing a rejected chain's token from the target's row in place of the residual."""
    source = inspect.getsource(verify.verify_chains).replace(
        "next_probs = torch.where(use_residual, residual, target_rows)", "next_probs = target_rows")
    assert "next_probs = target_rows" in source
    names = dict(vars(verify))
    exec(source, names)
    return names["verify_chains"]


def main() -> None:
    cases, faults, seed, runs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    torch.set_grad_enabled(False)
    real_sample, real_chains, wrong_chains = verify.sample, batch.verify_chains, faulty_chains()
    samplers = {"none": real_sample, "residual": real_sample, "square": lambda p, *a: real_sample(p * p, *a),
                "argmax": lambda p, g, greedy, proposal=False: real_sample(p, g, True, proposal)}
    tmp = Path(tempfile.mkdtemp())
    models = d.fuzz.Models(d.write_small_pairs(tmp))
    for index in map(int, cases.split(",")):
        case = d.draw_case(seed, index)
        tiers = d.fuzz.tiers_for(case, models)
        for fault in faults.split(","):
            verify.sample = samplers[fault]
            batch.verify_chains = wrong_chains if fault == "residual" else real_chains
            seen = {}
            with d.fuzz.case_environment(tmp / f"c{index}{fault}", d.fuzz.replanning(case)):
                p = d.p_values(case, tiers, runs, 0, seen)
            print(index, case["dtype"], case["settings"]["mode"], fault, ["%.2g" % x for x in p], seen, flush=True)


if __name__ == "__main__":
    main()
