"""On-policy draft data and training on from a draft (draft/generated.py Passages, draft/sources.py
continuations, `train-draft --continuations` and `--init`): the continuations are the target's own text
after passages cut from the training prose, and a draft trains on from where an earlier one stopped."""
import hashlib
import json

import pytest
import torch

from triforce import LLM
from triforce.cache.full import FullKVCache
from triforce.draft.generated import GeneratedSamples, GenerationSettings, Passages
from triforce.launch.cli import main
from triforce.models.loader import load_model
from test_train_draft import write_corpus


@pytest.fixture(scope="module")
def llm(tiny_dir):
    return LLM(tiny_dir("gen-target", tokenizer=True, seed=81, num_layers=2, scale=25), mode="ar", dtype="float32")


def test_passages_are_pieces_of_the_prose_each_once_before_any_repeats():
    sequences = torch.arange(3 * 20).view(3, 20)
    passages = Passages(sequences, tokens=6, seed=4)
    assert passages.distinct == 9  # three pieces of 6 per sequence of 20
    pieces = [passages.prompt(i)[1] for i in range(9)]
    expected = {tuple(range(r * 20 + 6 * k, r * 20 + 6 * k + 6)) for r in range(3) for k in range(3)}
    assert {tuple(p) for p in pieces} == expected  # every piece once
    assert pieces != sorted(pieces)  # shuffled
    assert [passages.prompt(i + 9)[1] for i in range(9)] == pieces  # then again in the same order
    assert [Passages(sequences, 6, seed=4).prompt(i)[1] for i in range(9)] == pieces  # by its seed alone
    with pytest.raises(Exception, match="does not fit"):
        Passages(sequences, tokens=21)


def test_greedy_continuations_are_the_targets_and_sampled_ones_follow_their_seeds(llm, tmp_path):
    from transformers import LlamaForCausalLM

    ids = llm.tokenizer(" ".join(f"w{3 + i % 50}" for i in range(400))).input_ids
    prose = torch.tensor(ids[:256]).view(4, 64)
    settings = GenerationSettings(samples=6, max_tokens=10, temperatures=(0.0, 1.0), batch=4)
    samples = GeneratedSamples(tmp_path / "c", settings, Passages(prose, 16))
    samples.generate(llm)
    rows = samples.load()
    assert {r["genre"] for r in rows} == {"continuation"} and [r["temperature"] for r in rows] == [0.0, 1.0] * 3
    pieces = {tuple(prose[r, k * 16:(k + 1) * 16].tolist()) for r in range(4) for k in range(4)}
    assert all(tuple(r["prompt"].tolist()) in pieces for r in rows)
    reference = LlamaForCausalLM.from_pretrained(llm.model_path, dtype=torch.float32).eval()
    for r in rows[::2]:
        out = reference.generate(r["prompt"].long()[None], max_new_tokens=10, do_sample=False,
                                 eos_token_id=llm.eos_ids()[0], pad_token_id=0)
        assert r["answer"].tolist() == out[0, 16:].tolist()[: len(r["answer"])]
    # batched otherwise, the same samples (each has its own seed)
    other = GeneratedSamples(tmp_path / "c3", GenerationSettings(samples=6, max_tokens=10, temperatures=(0.0, 1.0),
                                                                 batch=3), Passages(prose, 16))
    other.generate(llm)
    assert [r["answer"].tolist() for r in other.load()] == [r["answer"].tolist() for r in rows]


def _argv(target, text, out, work, *extra):
    return ["train-draft", "--target", str(target), "--text", str(text), "--out", str(out), "--work-dir", str(work),
            "--steps", "4", "--batch-size", "2", "--seq-len", "64", "--top-k", "8", "--heldout-fraction", "0.2",
            "--heldout-sequences", "2", "--local-tokens", "0", "--answers", "0", "--answer-tokens", "24",
            "--answer-batch", "4", *extra]


def test_train_draft_trains_on_continuations_and_on_from_a_draft(tiny_dir, tmp_path, capsys):
    target = tiny_dir("td-target", tokenizer=True, seed=40, num_layers=2, scale=25)
    text = write_corpus(tmp_path / "corpus.txt", words=3000)
    first, work = tmp_path / "first", tmp_path / "work"
    shape = ["--layers", "1", "--hidden", "32", "--intermediate", "64", "--heads", "2", "--kv-heads", "1",
             "--vocab", "40"]
    assert main(_argv(target, text, first, work, *shape, "--continuations", "8", "--passage-tokens", "20")) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(report["data_tokens"]) == {"prose", "continuations"}
    assert set(report["genres"]) == {"prose", "continuations"} and report["genres"]["continuations"]["tokens"] > 0
    # the training set's 8 in two shards of 4, and the held-out prose's (4: one batch) beside them
    assert sorted(len(list(f.glob("samples-*.pt"))) for f in work.glob("continuations-*")) == [1, 2]

    # --init: at a learning rate too small to move a weight, the draft comes out as it went in, vocabulary
    # and shape included; at the usual one it moves. A fresh draft of the same seed is another one.
    def weights(folder):
        from safetensors.torch import load_file

        return load_file(folder / "model.safetensors")

    kept = json.loads((first / "triforce_draft.json").read_text())["token_ids"]
    still, moved = tmp_path / "still", tmp_path / "moved"
    assert main(_argv(target, text, still, work, "--init", str(first), "--lr", "1e-30", "--repeat", "prose=0",
                      "--continuations", "8", "--passage-tokens", "20")) == 0
    capsys.readouterr()
    record = json.loads((still / "triforce_draft.json").read_text())
    assert record["token_ids"] == kept
    assert record["init_weights"] == hashlib.sha1((first / "model.safetensors").read_bytes()).hexdigest()
    assert json.loads((first / "triforce_draft.json").read_text())["init_weights"] is None
    assert all(torch.equal(a, b) for a, b in zip(weights(first).values(), weights(still).values()))
    assert main(_argv(target, text, moved, work, "--init", str(first), "--continuations", "8",
                      "--passage-tokens", "20")) == 0
    assert not all(torch.equal(a, b) for a, b in zip(weights(first).values(), weights(moved).values()))
    assert json.loads((moved / "triforce_draft.json").read_text())["token_ids"] == kept

    # --layers beside --init grows it: twice the layers, and (at that learning rate) the same logits
    grown = tmp_path / "grown"
    assert main(_argv(target, text, grown, work, "--init", str(first), "--layers", "2", "--lr", "1e-30",
                      "--repeat", "prose=0", "--continuations", "8", "--passage-tokens", "20")) == 0
    record = json.loads((grown / "triforce_draft.json").read_text())
    assert record["shape"]["layers"] == 2 and record["token_ids"] == kept
    tokens = torch.tensor(kept[:30])
    before, after = (load_model(folder, "float32") for folder in (first, grown))
    assert len(after.layers) == 2 and len(before.layers) == 1
    assert torch.equal(before(tokens, FullKVCache(before.config, 30, torch.float32, "cpu")),
                       after(tokens, FullKVCache(after.config, 30, torch.float32, "cpu")))


@pytest.mark.parametrize("extra, message", [
    (["--init", "{first}", "--hidden", "64"], "leave out --hidden"),
    (["--init", "{first}", "--layers", "3"], "--layers 3 beside --init grows that draft's 2 layers: give a multiple"),
    (["--init", "{first}", "--layers", "2"], "give a multiple of 2 above it"),
    (["--init", "{bare}", "--layers", "2"], "its config.json names no layer count"),
    (["--init", "{out}"], "is --out too"),
    (["--init", "{nowhere}"], "no draft there"),
    (["--continuations", "4", "--passage-tokens", "64"], "--passage-tokens 64 must be below --seq-len 64"),
    (["--continuations", "-1"], "--continuations must be >= 0"),
])
def test_train_draft_refuses_bad_continuation_and_init_flags_before_building_data(tiny_dir, tmp_path, capsys, extra,
                                                                                  message):
    target = tiny_dir("td-target", tokenizer=True, seed=40, num_layers=2, scale=25)
    text = write_corpus(tmp_path / "corpus.txt", words=500)
    (tmp_path / "first").mkdir()
    (tmp_path / "first" / "config.json").write_text('{"num_hidden_layers": 2}')
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "config.json").write_text("[]")
    names = {"first": tmp_path / "first", "out": tmp_path / "d", "nowhere": tmp_path / "nowhere",
             "bare": tmp_path / "bare"}
    work = tmp_path / "work"
    code = main(_argv(target, text, tmp_path / "d", work, *[e.format(**names) for e in extra]))
    assert code == 2 and message in capsys.readouterr().err
    assert not work.exists()


def test_continuations_need_prose_and_init_needs_a_draft_of_this_target(tiny_dir, tmp_path, capsys):
    target = tiny_dir("td-target", tokenizer=True, seed=40, num_layers=2, scale=25)
    other = tiny_dir("td-other", tokenizer=True, seed=41, num_layers=1, scale=25, vocab_size=80)
    assert main(["train-draft", "--target", str(target), "--out", str(tmp_path / "d"), "--local-tokens", "8",
                 "--answers", "0", "--continuations", "4"]) == 2
    assert "--continuations continues passages of the --text prose" in capsys.readouterr().err
    text = write_corpus(tmp_path / "corpus.txt", words=500)
    assert main(_argv(target, text, tmp_path / "d", tmp_path / "work", "--init", str(other))) == 2
    assert "not a draft train-draft made for this target" in capsys.readouterr().err
