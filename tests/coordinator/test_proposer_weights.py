"""What a proposing tier runs where the config leaves it open (coordinator/proposer_weights.py): its model's
own weights or the int8 twin, by what a forward of each takes on this machine."""
import json

import pytest

from triforce import LLM, SamplingParams
from triforce.errors import UserError
from triforce.coordinator import proposer_weights
from triforce.coordinator.costs import model_key
from triforce.coordinator.proposer_weights import MARGIN, WeightTimes, choose_weights, forward_seconds
from triforce.models import quantized
from triforce.models.loader import load_model
from triforce.models.quantized import twin_bytes

pytestmark = pytest.mark.chosen_weights  # (elsewhere the tests pin the models' own weights)


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


def test_a_choice_is_timed_once_per_machine_and_model_shape(model, tiny_dir, monkeypatch, tmp_path, int8_kernels):
    """Kept in the calibration folder: a later process reads it, and a model measured slower as a twin is
    not even quantized again; another role adds its sizes, another machine or dtype times anew."""
    calls = timed(monkeypatch, 1.2)
    file = tmp_path / "weights.json"
    assert choose_weights(model, "draft", WeightTimes(file))[1]["weights"] == "own" and calls == [1]
    saved = json.loads(file.read_text())
    assert len(saved) == 1 and set(next(iter(saved.values()))) == {"own:1", "int8:1"}
    made = []
    with monkeypatch.context() as m:
        m.setattr(proposer_weights, "int8_twin", lambda *a: made.append(a))
        got, why = choose_weights(model, "draft", WeightTimes(file))
    assert got is model and why["weights"] == "own" and calls == [1] and made == []
    # the retrieval tier's 5 tokens too: timed and added to the entry (its 1 token was timed already)
    calls = timed(monkeypatch, 0.5)
    assert choose_weights(model, "retrieval", WeightTimes(file))[1]["weights"] == "int8" and calls == [5]
    saved = json.loads(file.read_text())
    assert len(saved) == 1 and set(next(iter(saved.values()))) == {"own:1", "int8:1", "own:5", "int8:5"}
    # another machine, and the same shape in another dtype: entries of their own
    monkeypatch.setattr(proposer_weights, "machine_key", lambda device: "another machine")
    assert choose_weights(model, "draft", WeightTimes(file))[1]["weights"] == "int8" and calls == [5, 1]
    bf16 = load_model(tiny_dir("int8-llama2", arch="llama2", seed=3, hidden_size=64, scale=10), "bfloat16")
    assert choose_weights(bf16, "draft", WeightTimes(file))[1]["weights"] == "int8" and calls == [5, 1, 1]
    assert len(json.loads(file.read_text())) == 3


def test_a_reduced_vocabulary_draft_is_a_shape_of_its_own(model, monkeypatch, tmp_path, int8_kernels):
    """Its head's rows spread over its target's vocabulary: forwards that cost more than a model of that many
    rows (mode auto's cost table keys them alike, as before: model_key)."""
    calls = timed(monkeypatch, 1.2)
    file = tmp_path / "weights.json"
    choose_weights(model, "draft", WeightTimes(file))
    plain = model_key(model)
    model.vocab = type("Vocab", (), {"target_vocab_size": 4 * model.config.vocab_size})()
    choose_weights(model, "draft", WeightTimes(file))
    assert calls == [1, 1] and len(json.loads(file.read_text())) == 2 and model_key(model) == plain


def test_the_environment_pins_the_models_own_weights(model, monkeypatch):
    """TRIFORCE_PROPOSER_WEIGHTS=own (the tests' processes and those they start): nothing made or timed."""
    calls = timed(monkeypatch, 0.5)
    monkeypatch.setenv("TRIFORCE_PROPOSER_WEIGHTS", "own")
    got, why = choose_weights(model, "retrieval", WeightTimes())
    assert got is model and why == {"weights": "own", "why": "TRIFORCE_PROPOSER_WEIGHTS=own"} and calls == []
    monkeypatch.setenv("TRIFORCE_PROPOSER_WEIGHTS", "int8")  # (a value it does not take: not a silent choice)
    with pytest.raises(UserError, match="TRIFORCE_PROPOSER_WEIGHTS='int8': the one value it takes is 'own'"):
        choose_weights(model, "retrieval", WeightTimes())


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
    assert got is model and why["weights"] == "own" and calls == []
    assert why["why"].startswith("the int8 twin needs") and "more memory" in why["why"]


def test_forward_seconds_times_each_model(model, int8_kernels):
    twin = quantized.int8_twin(model)
    seconds = forward_seconds([model, twin], 3)
    assert len(seconds) == 2 and all(0 < s < 5 for s in seconds)


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
    assert llm.proposer_weights == {"retrieval": {"weights": "own", "why": "set to 'target'"}}


def test_a_twin_made_as_asked_is_the_one_auto_times_and_runs(tiny_dir, monkeypatch, int8_kernels):
    """--retrieval-weights int8, then a config of auto swapped in (as the bench's sweeps do): the twin made at
    load is timed and run, not made again."""
    timed(monkeypatch, 0.5)
    llm = LLM(tiny_dir("api-target", tokenizer=True, seed=51), mode="retrieval", dtype="float32", budget=16,
              chunk_size=4, retrieval_weights="int8")
    twin = llm.retrieval_model
    assert twin.quantized == "int8" and llm.proposer_weights["retrieval"]["why"] == "set to 'int8'"
    made = []
    monkeypatch.setattr(proposer_weights, "int8_twin", lambda *a: made.append(a))
    llm.config = llm.config.__class__(mode="retrieval", budget=16, chunk_size=4)
    assert llm.retrieval_model is twin and made == [] and llm.proposer_weights["retrieval"]["weights"] == "int8"
