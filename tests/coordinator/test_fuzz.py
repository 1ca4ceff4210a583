"""A few cases of benchmarks/exactness_fuzz.py (random configurations of every mode, tree, batch and request
setting, in float32 and bfloat16): greedy requests equal plain decoding alone and in their batch, seeded
samples are the same alone and in the batch. The script runs many more (`--cases 2000`)."""
import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "exactness_fuzz.py"
SEED, CASES, GROUPS = 0, 32, 4


@pytest.fixture(scope="module")
def fuzz(tmp_path_factory):
    spec = importlib.util.spec_from_file_location("exactness_fuzz", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, module.Models(module.write_pairs(tmp_path_factory.mktemp("fuzz")))


@pytest.mark.parametrize("group", range(GROUPS))
def test_random_configurations_are_exact(fuzz, group, tmp_path):
    module, models = fuzz
    seen: dict = {}
    for index in range(group, CASES, GROUPS):
        case = module.draw_case(SEED, index)
        tiers = module.tiers_for(case, models)
        if tiers is None:
            continue  # an int8 twin refused here (no CPU kernels)
        with module.case_environment(case, tmp_path / str(index)):
            assert module.check_case(case, tiers, seen) == [], (index, case["settings"])
    accepted = sum(a for a, _ in seen.values())
    proposed = sum(p for _, p in seen.values())
    assert 0 < accepted < proposed  # the tiers agreed on some proposals and not on others
