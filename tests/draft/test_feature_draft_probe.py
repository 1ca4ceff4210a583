"""benchmarks/feature_draft_probe.py scores depths 2-4 of a chain by writing the chain's own keys into the
slots of a copy of the whole window's, under a mask per start: fed the target's features instead of its
own predictions, every depth must give what the whole-window pass gives at that position, and fed its own
they must differ (the slots really are the chain's)."""
import importlib.util
import sys
from pathlib import Path

import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
PROBE = BENCHMARKS / "feature_draft_probe.py"


def probe():
    if str(BENCHMARKS) not in sys.path:  # (it imports draft_on_policy, beside it, as a script does)
        sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location("feature_draft_probe", PROBE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_chain_depths_read_their_own_slots():
    fd = probe()
    torch.manual_seed(0)
    model = fd.FeatureDraft(64, 4, 2, 96).eval()
    n = 48
    f, e = torch.randn(n, 64), torch.randn(n, 64)
    starts = torch.arange(30, n - fd.DEPTH + 1)
    with torch.no_grad():
        teacher, out = fd.depth_predictions(model, f, e, starts, own=False)
        own, _ = fd.depth_predictions(model, f, e, starts, own=True)
    assert len(teacher) == fd.DEPTH
    for j, pred in enumerate(teacher):
        torch.testing.assert_close(pred, out[starts + j - 1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(own[0], teacher[0])  # depth 1 reads the target's features either way
    assert all((a - b).abs().max() > 1e-3 for a, b in zip(own[1:], teacher[1:]))
