"""What a proposing tier runs where the config leaves it open (coordinator/proposer_weights.py): its model's
own weights or the int8 twin, by what a forward of each takes on this machine."""
import json

import pytest

from triforce import LLM, SamplingParams
from triforce.coordinator import proposer_weights
from triforce.coordinator.proposer_weights import MARGIN, WeightTimes, choose_weights, forward_seconds
from triforce.models import quantized
from triforce.models.loader import load_model
from triforce.models.quantized import twin_bytes


@pytest.fixture
def model(tiny_dir):
    return load_model(tiny_dir("int8-llama2", arch="llama2", seed=3, hidden_size=64, scale=10))


def timed(monkeypatch, ratio):
    """forward_seconds stubbed: the twin takes `ratio` times the model's time; returns the calls made."""
    calls = []

    def fake(models, n):
        calls.append(n)
        assert models[1].quantized == "int8" and models[0].quantized is None
        return [0.01 * n, 0.01 * n * ratio]

    monkeypatch.setattr(proposer_weights, "forward_seconds", fake)
    return calls


@pytest.mark.parametrize("ratio,chosen", [(MARGIN - 0.01, "int8"), (MARGIN + 0.01, "own"), (1.3, "own")])
def test_the_twin_runs_where_it_is_timed_faster_by_the_margin(model, monkeypatch, int8_kernels, ratio, chosen):
    calls = timed(monkeypatch, ratio)
    table = WeightTimes()
    got, why = choose_weights(model, "retrieval", table)
    assert why["weights"] == chosen and (got.quantized == "int8") == (chosen == "int8")
    assert (got is model) == (chosen == "own") and calls == [1, 5]
    assert why["ms"] == {"int8:1": round(10 * ratio, 3), "int8:5": round(50 * ratio, 3), "own:1": 10.0, "own:5": 50.0}
    assert f"{ratio:.2f}x" in why["why"]


def test_a_choice_is_timed_once_per_machine_and_model_shape(model, monkeypatch, tmp_path, int8_kernels):
    """Kept in the calibration folder: a later process reads it, and a model measured slower as a twin is
    not even quantized again."""
    calls = timed(monkeypatch, 1.2)
    first = WeightTimes(tmp_path / "weights.json")
    assert choose_weights(model, "draft", first)[1]["weights"] == "own" and calls == [1]
    saved = json.loads((tmp_path / "weights.json").read_text())
    assert len(saved) == 1 and set(next(iter(saved.values()))) == {"own:1", "int8:1"}
    made = []
    with monkeypatch.context() as m:
        m.setattr(proposer_weights, "int8_twin", lambda *a: made.append(a))
        got, why = choose_weights(model, "draft", WeightTimes(tmp_path / "weights.json"))
    assert got is model and why["weights"] == "own" and calls == [1] and made == []
    # another role times its own sizes (the retrieval tier's 5 tokens too), adding to the entry
    timed(monkeypatch, 0.5)
    assert choose_weights(model, "retrieval", WeightTimes(tmp_path / "weights.json"))[1]["weights"] == "int8"


def test_a_twin_that_cannot_run_well_or_takes_much_memory_is_not_tried(model, monkeypatch):
    """Without the CPU kernels, or where the twin would take more than MEMORY_SHARE of the memory free: the
    model's own weights, nothing timed (the explicit int8 says why it is refused)."""
    calls = timed(monkeypatch, 0.5)
    monkeypatch.setattr(quantized, "cpu_kernels", lambda: None)
    assert choose_weights(model, "retrieval", WeightTimes())[0] is model
    monkeypatch.setattr(quantized, "cpu_kernels", lambda: object())
    share = proposer_weights.MEMORY_SHARE
    monkeypatch.setattr(quantized, "available_bytes", lambda device: int(twin_bytes(model) / share) - 1)
    got, why = choose_weights(model, "retrieval", WeightTimes())
    assert got is model and why["weights"] == "own" and "no int8 twin" in why["why"] and calls == []


def test_forward_seconds_times_each_model(model, int8_kernels):
    twin = quantized.int8_twin(model)
    seconds = forward_seconds([model, twin], 3)
    assert len(seconds) == 2 and all(0 < s < 5 for s in seconds)


@pytest.mark.timed_weights
@pytest.mark.parametrize("ratio", [0.5, 1.2])
def test_llm_runs_what_auto_chose_and_says_so(tiny_dir, monkeypatch, int8_kernels, ratio):
    """The defaults ("auto"): LLM chooses as it loads, runs the choice (greedy output: the target's either
    way), and names it per tier in `proposer_weights`; explicit settings are named as asked."""
    timed(monkeypatch, ratio)
    target = tiny_dir("api-target", tokenizer=True, seed=51)
    draft = tiny_dir("api-draft", tokenizer=True, seed=52, num_layers=1)
    llm = LLM(target, draft, mode="triforce", dtype="float32", window=64, budget=16, chunk_size=4)
    kind = "int8" if ratio < MARGIN else "own"
    assert {role: c["weights"] for role, c in llm.proposer_weights.items()} == {"retrieval": kind, "draft": kind}
    assert (llm.retrieval_model is llm.target) == (kind == "own") and (llm.draft_model is llm.draft) == (kind == "own")
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    got = llm.generate("w3 w4 w5 w6 w7 w8", params)[0].token_ids
    llm.config = llm.config.__class__(mode="ar")
    assert llm.generate("w3 w4 w5 w6 w7 w8", params)[0].token_ids == got and llm.proposer_weights == {}
    llm.config = llm.config.__class__(mode="retrieval", retrieval_weights="target", budget=16, chunk_size=4)
    assert llm.proposer_weights == {"retrieval": {"weights": "own", "why": "--retrieval-weights target"}}
