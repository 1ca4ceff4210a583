"""`triforce train-draft` on a tiny target: it learns, resumes, and writes a draft the engine accepts."""
import json
import random

import pytest
import torch

from triforce.draft.train import (DraftShape, TrainSettings, distillation_loss, grow_draft, init_draft, rejection_loss,
                                  sample_order, train)
from triforce.launch.cli import main
from triforce.models.loader import load_model


def test_distillation_loss_is_soft_cross_entropy_over_kept_tokens():
    logits = torch.randn(3, 5)  # 4 kept draft ids + the "other" id
    label_ids = torch.tensor([[0, 2, 4], [1, 3, 0], [2, 4, 4]])  # id 4: a target token the draft lacks
    label_logp = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.6, 0.2, 0.2], [0.9, 0.05, 0.05]]))
    logq = torch.log_softmax(logits[:, :4], -1)
    expected = -torch.stack([(0.5 * logq[0, 0] + 0.3 * logq[0, 2]) / 0.8,
                             0.6 * logq[1, 1] + 0.2 * logq[1, 3] + 0.2 * logq[1, 0],
                             logq[2, 2]]).mean()
    torch.testing.assert_close(distillation_loss(logits, label_ids, label_logp, 4), expected)


def test_rejection_loss_is_one_minus_speculative_samplings_acceptance():
    """Where the labels hold the target's whole vocabulary, 1 - sum min(p_T, q_T) as evaluate.py measures it;
    a target token the draft does not keep overlaps nothing."""
    from triforce.speculation.sampling import probabilities

    target, draft = torch.randn(6, 10) * 3, torch.randn(6, 10) * 3
    top = torch.log_softmax(target, -1).topk(10, -1)
    for t in (0.3, 0.6, 1.0):
        accept = torch.minimum(probabilities(target, t), probabilities(draft, t)).sum(-1).mean()
        torch.testing.assert_close(rejection_loss(draft, top.indices, top.values, 10, t), 1 - accept)
    # keeping 9 tokens: the target's token 9 is "other" to the draft (id 9 >= kept), never proposed
    p, q = probabilities(target, 0.6), probabilities(draft[:, :9], 0.6)
    accept = torch.minimum(p[:, :9], q).sum(-1).mean()
    torch.testing.assert_close(rejection_loss(draft, top.indices, top.values, 9, 0.6), 1 - accept)


def test_training_on_the_rejection_at_a_temperature_lowers_it_below_distillation_alone(tiny_dir, tmp_path):
    """The same steps, data and seed with and without --acceptance-at 0.6: with it, the trained draft's
    rejection chance at 0.6 on the training labels ends lower."""
    target = load_model(tiny_dir("td-target", tokenizer=True, seed=40, num_layers=2, scale=25))
    sequences = torch.randint(3, 96, (12, 32), generator=torch.Generator().manual_seed(0))
    top = torch.log_softmax(torch.stack([target(row, _cache(target, 32)) for row in sequences]), -1).topk(8, -1)
    shape = DraftShape(layers=1, hidden=32, intermediate=64, heads=2, kv_heads=1, vocab=96)
    rejections = {}
    for at in ((), (0.6,)):
        model = init_draft(shape, target, None, seed=0)
        settings = TrainSettings(steps=40, batch_size=4, seq_len=32, lr=1e-2, warmup=5, checkpoint_every=1000,
                                 acceptance_at=at)
        train(model, sequences, top.indices.int(), top.values.half(), torch.arange(96), 96, settings, tmp_path,
              f"key{at}")
        with torch.no_grad():
            logits = model(input_ids=sequences).logits
        rejections[at] = rejection_loss(logits, top.indices.long(), top.values.float(), 96, 0.6).item()
    assert rejections[(0.6,)] < rejections[()] - 0.008, rejections  # (0.687 against 0.704 when written)


def write_corpus(path, words=6000, seed=0):
    rng = random.Random(seed)
    path.write_text(" ".join(f"w{rng.randrange(3, 60)}" for _ in range(words)))
    return path


def test_vendored_copies_of_held_out_packages_are_not_trained_on(tmp_path):
    """pip/_vendor/distlib is distlib's code: trained on under pip's name while distlib itself was held out."""
    from triforce.draft import local_text

    for folder in ("pip", "pip/_vendor/distlib", "pkg/vendor/lib", "other/_vendored"):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        write_corpus(tmp_path / folder / "module.py", words=400)
    found = {p.parent.relative_to(tmp_path).as_posix() for p in local_text._candidates(tmp_path)}
    assert found == {"pip"}


def test_training_lowers_the_loss(tiny_dir, tmp_path):
    target = load_model(tiny_dir("td-target", tokenizer=True, seed=40, num_layers=2, scale=25))
    sequences = torch.randint(3, 96, (12, 32), generator=torch.Generator().manual_seed(0))
    cache_logits = torch.stack([target(row, _cache(target, 32)) for row in sequences])
    top = torch.log_softmax(cache_logits, -1).topk(8, -1)
    shape = DraftShape(layers=1, hidden=32, intermediate=64, heads=2, kv_heads=1, vocab=96)
    model = init_draft(shape, target, None, seed=0)
    settings = TrainSettings(steps=60, batch_size=4, seq_len=32, lr=1e-2, warmup=5, checkpoint_every=1000)
    losses = train(model, sequences, top.indices.int(), top.values.half(), torch.arange(96), 96, settings,
                   tmp_path, "key")
    assert len(losses) == 60
    assert sum(losses[-5:]) / 5 < 0.7 * sum(losses[:5]) / 5


def test_a_step_whose_loss_is_not_finite_ends_training_and_a_nan_draft_is_not_exported(tiny_dir, tmp_path):
    """One NaN step made every weight NaN (AdamW), and every checkpoint after it, and the export replaced
    the good draft in --out: training ends there, the checkpoint before it kept, and no NaN draft is
    written over a folder."""
    from triforce.draft.train import export
    from triforce.errors import UserError

    target = load_model(tiny_dir("td-target", tokenizer=True, seed=40, num_layers=2, scale=25))
    sequences = torch.randint(3, 96, (12, 32), generator=torch.Generator().manual_seed(0))
    top = torch.log_softmax(torch.stack([target(row, _cache(target, 32)) for row in sequences]), -1).topk(8, -1)
    settings = TrainSettings(steps=12, batch_size=4, seq_len=32, lr=1e-2, warmup=1, checkpoint_every=1)
    values = top.values.half()
    order = sample_order(torch.ones(12, dtype=torch.long), 48, settings.seed).tolist()
    values[next(i for i in order[8:12] if i not in order[:8])] = float("nan")  # in step 3's batch, not before
    model = init_draft(DraftShape(layers=1, hidden=32, intermediate=64, heads=2, kv_heads=1, vocab=96), target,
                       None, seed=0)
    with pytest.raises(UserError, match=r"not finite at step 3 .* keeps step 2"):
        train(model, sequences, top.indices.int(), values, torch.arange(96), 96, settings, tmp_path, "key")
    assert all(torch.isfinite(p).all() for p in model.parameters())
    saved = torch.load(tmp_path / "checkpoint-key.pt")
    assert all(torch.isfinite(t).all() for t in saved["model"].values())
    out = tmp_path / "draft"
    out.mkdir()
    (out / "config.json").write_text("{}")
    with torch.no_grad():
        next(model.parameters())[0, 0] = float("nan")
    with pytest.raises(UserError, match="not all finite"):
        export(model, out, None, 96, {})
    assert (out / "config.json").read_text() == "{}"


def _cache(model, n):
    from triforce.cache.full import FullKVCache

    return FullKVCache(model.config, n, model.dtype, "cpu")


@pytest.fixture
def installed_packages(tmp_path, monkeypatch):
    """A site-packages of twenty small packages stands in for the machine's (draft/local_text.py)."""
    from triforce.draft import local_text

    root = tmp_path / "site-packages"
    for i in range(20):
        (root / f"pkg{i}").mkdir(parents=True)
        write_corpus(root / f"pkg{i}" / "module.py", words=400, seed=i)
    monkeypatch.setattr(local_text, "roots", lambda: [root])
    assert any(local_text._heldout(f"pkg{i}") for i in range(20)) and not all(
        local_text._heldout(f"pkg{i}") for i in range(20))
    return root


@pytest.mark.parametrize("vocab", [40, 0])
def test_train_draft_command_writes_a_usable_draft_and_resumes(tiny_dir, tmp_path, capsys, vocab, installed_packages,
                                                               umask_022):
    target = tiny_dir("td-target", tokenizer=True, seed=40, num_layers=2, scale=25)
    text = write_corpus(tmp_path / "corpus.txt")
    out, work = tmp_path / "drafts" / "new", tmp_path / "work"  # its parent made too
    argv = ["train-draft", "--target", str(target), "--text", str(text), "--out", str(out), "--work-dir", str(work),
            "--layers", "1", "--hidden", "32", "--intermediate", "64", "--heads", "2", "--kv-heads", "1",
            "--vocab", str(vocab), "--steps", "6", "--batch-size", "2", "--seq-len", "64", "--top-k", "8",
            "--heldout-fraction", "0.2", "--heldout-sequences", "2", "--checkpoint-every", "3",
            "--local-tokens", "256", "--answers", "8", "--answer-tokens", "24", "--answer-batch", "4"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(report["data_tokens"]) == set(report["genres"]) == {"prose", "code", "chat"}
    for name, genre in report["genres"].items():
        # chat: the sampled answers on held-out subjects, which may end early, fill one or both sequences
        assert genre["tokens"] == 2 * 64 or (name == "chat" and genre["tokens"] == 64)
        assert 0 <= genre["top1_agreement"] <= 1 and 0 < genre["expected_acceptance"] <= 1
    (checkpoint,) = work.glob("checkpoint-*.pt")
    assert torch.load(checkpoint, weights_only=True)["step"] == 6
    # others may read it as the umask (022 here) lets them: safetensors wrote the weights 0600
    assert {p.stat().st_mode & 0o777 for p in out.iterdir()} == {0o644}
    def cached():
        return sorted(p.stat().st_mtime_ns for p in [*work.glob("labels-*/*.pt"), *work.glob("answers-*/*.pt"),
                                                     *work.glob("installed-*.pt")])

    before = cached()
    assert len(before) >= 6

    # Resuming: data and labels are reused and no training step runs again, so the draft is the same.
    weights = (out / "model.safetensors").read_bytes()
    assert main(argv) == 0
    assert "resuming at step 6 of 6" in capsys.readouterr().err  # a rerun said nothing of it
    assert cached() == before
    assert (out / "model.safetensors").read_bytes() == weights
    assert json.loads((out / "triforce_draft.json").read_text())["final_loss"] > 0  # (the rerun wrote null)
    every = argv.index("--checkpoint-every") + 1  # how often it saves is not how it trains: it resumes
    assert main(argv[:every] + ["2"] + argv[every + 1:]) == 0  # (it started again from step 0)
    assert "resuming at step 6 of 6" in capsys.readouterr().err and cached() == before

    from triforce import LLM, SamplingParams

    llm = LLM(str(target), draft=str(out), mode="triforce", dtype="float32", budget=32, chunk_size=4, sinks=2,
              window=16)
    assert llm.draft.output_vocab_size == 96 and (llm.draft.vocab is None) == (vocab == 0)
    plain = LLM(str(target), mode="ar", dtype="float32")
    prompt = "w5 w6 w7 w8 " * 10
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    assert llm.generate(prompt, params)[0].token_ids == plain.generate(prompt, params)[0].token_ids


def test_train_draft_rejects_a_bad_shape(tiny_dir, tmp_path, capsys, monkeypatch):
    """Before the target loads (a minute for a large one; it loaded first)."""
    import triforce

    target = tiny_dir("td-target", tokenizer=True, seed=40, num_layers=2, scale=25)
    text = write_corpus(tmp_path / "corpus.txt", words=500)
    monkeypatch.setattr(triforce, "LLM", lambda *a, **k: pytest.fail("the target loaded first"))
    code = main(["train-draft", "--target", str(target), "--text", str(text), "--out", str(tmp_path / "d"),
                 "--hidden", "30", "--heads", "4"])
    assert code == 2 and "--hidden (30) must divide by --heads (4)" in capsys.readouterr().err
    code = main(["train-draft", "--target", str(target), "--text", str(text), "--out", str(tmp_path / "d"),
                 "--hidden", "40", "--heads", "8", "--kv-heads", "2"])  # head size 5: a traceback at step 1
    assert code == 2 and "must be even" in capsys.readouterr().err
    code = main(["train-draft", "--target", str(target), "--text", str(text), "--out", str(tmp_path / "d"),
                 "--layers", "0"])
    assert code == 2 and "--layers must be >= 1 (got 0)" in capsys.readouterr().err  # (it named six settings)
    code = main(["train-draft", "--target", str(target), "--text", str(text), "--out", str(tmp_path / "d"),
                 "--kv-heads", "-1"])
    assert code == 2 and "--kv-heads must be >= 1 (got -1)" in capsys.readouterr().err
    code = main(["train-draft", "--target", str(target), "--text", str(text), "--out", str(tmp_path / "d"),
                 "--vocab", "1"])  # (NaN weights from its zero embedding, and "lower --lr" at step 1)
    assert code == 2 and "--vocab must keep at least 2 tokens" in capsys.readouterr().err
    code = main(["train-draft", "--target", str(target), "--text", str(text), "--out", str(tmp_path / "d"),
                 "--heldout", str(tmp_path / "." / "corpus.txt")])  # (its held-out figures were training text's)
    assert code == 2 and "is a --text file too" in capsys.readouterr().err


def test_an_export_over_a_draft_replaces_it_whole_and_a_failed_one_keeps_it(tmp_path, monkeypatch):
    """The old draft was deleted, then the new one renamed in: a kill between them left neither, and the
    default model ran without a draft. Now the old one is renamed aside first, and put back where the new
    one cannot be renamed in."""
    from pathlib import Path

    from transformers import LlamaConfig, LlamaForCausalLM

    from triforce.draft.train import export

    model = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1))
    out = tmp_path / "draft"
    export(model, out, None, 16, {"run": "first"})
    assert json.loads((out / "triforce_draft.json").read_text())["run"] == "first"
    rename = Path.rename

    def failing(self, target):
        if self.name.endswith(".partial"):
            raise OSError(28, "No space left on device")
        return rename(self, target)

    monkeypatch.setattr(Path, "rename", failing)
    with pytest.raises(OSError):
        export(model, out, None, 16, {"run": "second"})
    monkeypatch.undo()
    assert json.loads((out / "triforce_draft.json").read_text())["run"] == "first"
    export(model, out, None, 16, {"run": "third"})
    assert json.loads((out / "triforce_draft.json").read_text())["run"] == "third"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["draft"]


def test_sample_order_weighs_sequences_by_their_repeats():
    repeats = torch.tensor([2, 1, 0, 3])
    order = sample_order(repeats, 600, seed=5)
    counts = torch.bincount(order, minlength=4)
    assert counts[2] == 0 and counts.sum() == 600
    for i in (0, 1, 3):
        assert counts[i].item() == 100 * repeats[i].item()
    for first in range(0, 600, 6):  # each pass of 6 draws (2 + 1 + 3) holds each sequence its repeats (shuffled
        # together, a pass's worth of steps left a quarter of a large pool unseen)
        assert torch.equal(torch.bincount(order[first:first + 6], minlength=4), repeats)
    assert len({tuple(order[f:f + 6].tolist()) for f in range(0, 600, 6)}) > 1  # and each shuffled anew
    assert torch.equal(sample_order(repeats, 600, seed=5), order)  # a resumed run continues the same order
    assert sample_order(repeats, 0, seed=5).numel() == 0
    assert not torch.equal(sample_order(repeats, 600, seed=6), order)
    # (the passes shuffled together before: a run's key holds ORDER_VERSION, so an older checkpoint is not
    # resumed in this order; its labels, keyed apart, are reused)


@pytest.mark.parametrize("spec, message", [(["poetry=2"], "one of this run's sources (prose)"),
                                           (["prose=x"], "expected SOURCE=N"),
                                           (["prose=0"], "leaves every source out")])
def test_train_draft_rejects_a_bad_repeat_before_building_data(tiny_dir, tmp_path, capsys, spec, message):
    target = tiny_dir("td-target", tokenizer=True, seed=40, num_layers=2, scale=25)
    text = write_corpus(tmp_path / "corpus.txt", words=500)
    work = tmp_path / "work"
    code = main(["train-draft", "--target", str(target), "--text", str(text), "--out", str(tmp_path / "d"),
                 "--work-dir", str(work), "--local-tokens", "0", "--answers", "0", "--repeat", *spec])
    assert code == 2 and message in capsys.readouterr().err
    assert not work.exists()


@pytest.mark.parametrize("extra, message", [(["--steps", "-1"], "--steps must be >= 1"),
                                            (["--lr", "0"], "--lr must be a number > 0 (got 0.0)"),
                                            (["--heldout-fraction", "1"], "--heldout-fraction must be in [0, 1)"),
                                            (["--heldout-fraction", "0.1", "--heldout", "x.txt"],
                                             "--heldout names its files instead"),  # ignored
                                            (["--answer-temperatures", "0.6", "nan"], "--answer-temperatures"),
                                            (["--top-k", "97"], "--top-k 97 is more than the target's 96 tokens"),
                                            (["--acceptance-at", "0"], "--acceptance-at needs temperatures > 0"),
                                            (["--acceptance-weight", "-1"], "--acceptance-weight a number >= 0"),
                                            (["--seq-len", "600"], "--seq-len 600 is past the target's 512 positions"),
                                            (["--local-tokens", "0", "--answers", "0"], "no training sources"),
                                            (["--work-dir", "/proc/version/w"], "/proc/version is a file"),
                                            (["--work-dir", "/proc/self/w"], "cannot write in /proc/self"),
                                            (["--text", "/no/such/novel.txt"], "cannot read text file /no/such/novel.txt"),
                                            (["--heldout", "/no/such/held.txt"], "cannot read text file /no/such/held.txt")])
def test_train_draft_rejects_bad_settings_before_building_data(tiny_dir, tmp_path, capsys, extra, message):
    """--steps -1 went on to generate the target's answers and write the work folder; no sources at all
    blamed --repeat, which was not given. A --top-k past the vocabulary was a traceback while labelling; a
    bad answer temperature was found after the model loaded, named as the Python API's; --lr and
    --heldout-fraction shared one message. A --seq-len past the target's positions trained on labels there."""
    target = tiny_dir("td-target", tokenizer=True, seed=40, num_layers=2, scale=25)
    work = tmp_path / "work"
    code = main(["train-draft", "--target", str(target), "--out", str(tmp_path / "d"), "--work-dir", str(work),
                 *extra])
    assert code == 2 and message in capsys.readouterr().err
    assert not work.exists()


@pytest.mark.parametrize("out, message", [("precious", "holds files that are not a draft"), (".", "name a folder below"),
                                          ("..", "name a folder below"), ("note.txt", "is a file"),
                                          ("d", "--work-dir"), ("note.txt/d", "cannot write the draft in")])
def test_train_draft_refuses_an_out_folder_it_would_destroy(tiny_dir, tmp_path, capsys, monkeypatch, out, message):
    """The export replaces --out whole: it deleted a folder of someone's files, and `--out ..` the folder above.
    An --out that cannot be made was found when the trained draft was written (a traceback, the run lost)."""
    target = tiny_dir("td-target", tokenizer=True, seed=40, num_layers=2, scale=25)
    text = write_corpus(tmp_path / "corpus.txt", words=500)
    here = tmp_path / "here"
    (here / "precious").mkdir(parents=True)
    (here / "precious" / "thesis.txt").write_text("important")
    (here / "note.txt").write_text("important")
    monkeypatch.chdir(here)
    work = here / "d" / "work" if message == "--work-dir" else tmp_path / "work"  # the cached data, in --out
    code = main(["train-draft", "--target", str(target), "--text", str(text), "--out", out, "--work-dir", str(work),
                 "--local-tokens", "0", "--answers", "0", "--steps", "2"])
    assert code == 2 and message in capsys.readouterr().err
    assert (here / "precious" / "thesis.txt").read_text() == "important" and (here / "note.txt").is_file()
    assert not work.exists()


def test_no_held_out_prose_trains_and_a_held_out_text_too_short_is_named_first(tiny_dir, tmp_path, capsys):
    """--heldout-fraction 0 failed as the held-out prose (a line break, or nothing) made no sequence; a
    --heldout file too short failed after the training data was built (the answers: half an hour), blaming
    the text."""
    target = tiny_dir("td-target", tokenizer=True, seed=40, num_layers=2, scale=25)
    text = write_corpus(tmp_path / "corpus.txt", words=2000)
    base = ["train-draft", "--target", str(target), "--text", str(text), "--out", str(tmp_path / "d"),
            "--work-dir", str(tmp_path / "work"), "--local-tokens", "0", "--answers", "0", "--seq-len", "64",
            "--layers", "1", "--hidden", "32", "--intermediate", "64", "--heads", "2", "--kv-heads", "1",
            "--steps", "2", "--batch-size", "2", "--top-k", "8"]
    assert main(base + ["--heldout-fraction", "0"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["genres"] == {}
    short = write_corpus(tmp_path / "letters.txt", words=20)
    assert main(base + ["--heldout", str(short), "--answers", "4"]) == 2
    err = capsys.readouterr().err
    assert "--heldout letters: the text holds no complete sequence of 64 tokens" in err and "answers" not in err


def test_a_text_too_short_for_one_sequence_says_how_long_it_is(tiny_dir, tmp_path, capsys):
    target = tiny_dir("td-target", tokenizer=True, seed=40, num_layers=2, scale=25)
    text = write_corpus(tmp_path / "corpus.txt", words=40)
    code = main(["train-draft", "--target", str(target), "--text", str(text), "--out", str(tmp_path / "d"),
                 "--work-dir", str(tmp_path / "work"), "--local-tokens", "0", "--answers", "0", "--seq-len", "64",
                 "--heldout-fraction", "0"])
    err = capsys.readouterr().err
    assert code == 2 and "no complete sequence of 64 tokens (about " in err and "--seq-len" in err, err


def test_a_target_changed_in_place_names_other_data(tiny_dir, tmp_path):
    """train-draft named its cached data, answers, labels and checkpoints by the target's folder alone: a
    target fine-tuned in place reused the old model's labels and resumed its checkpoint."""
    import os

    from transformers import AutoTokenizer

    from triforce.launch.train_draft import _target_key

    source = tiny_dir("td-target", tokenizer=True, seed=40, num_layers=2, scale=25)
    folder = tmp_path / "target"
    folder.mkdir()
    for path in source.iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    tokenizer = AutoTokenizer.from_pretrained(folder)
    key = _target_key(folder, tokenizer)
    assert _target_key(folder, tokenizer) == key
    weights = folder / "model.safetensors"
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))  # written again
    assert _target_key(folder, tokenizer) != key
    # what says how it runs and tokenizes, changed in place (triforce's own mends rewrite these: a config's
    # RoPE scaling, a tokenizer's pre-tokenizer), names other data too
    for name, change in (("config.json", lambda c: {**c, "rope_theta": 5e5}),
                         ("tokenizer.json", lambda t: {**t, "pre_tokenizer": {"type": "Whitespace"}})):
        key = _target_key(folder, tokenizer)
        (folder / name).write_text(json.dumps(change(json.loads((folder / name).read_text()))))
        assert _target_key(folder, tokenizer) != key, name


def test_sequences_of_other_lengths_cut_from_one_stream_name_other_labels():
    """The same tokens cut into sequences of 512 or of 1024 had one digest, so the labels made for one length
    were loaded for the other."""
    from triforce.draft.sources import digest

    stream = torch.arange(4096, dtype=torch.int32)
    assert digest(stream.view(-1, 512)) != digest(stream.view(-1, 1024))
    assert digest(stream.view(-1, 512)) == digest(stream.clone().view(-1, 512))


def test_a_grown_draft_computes_what_it_grew_from_until_it_trains():
    from transformers import AutoConfig, LlamaForCausalLM

    torch.manual_seed(0)
    small = LlamaForCausalLM(AutoConfig.for_model(
        "llama", vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=True)).float()
    with torch.no_grad():  # (a fresh model's norms are ones: make the copied ones tell)
        for p in small.parameters():
            p.add_(0.1 * torch.randn_like(p))
    grown = grow_draft(small, 6, seed=1)
    tokens = torch.randint(0, 50, (2, 20))
    assert len(grown.model.layers) == 6 and grown.lm_head.weight is grown.model.embed_tokens.weight
    assert torch.equal(small(tokens).logits, grown(tokens).logits)
    assert torch.equal(grown.model.layers[3].mlp.up_proj.weight, small.model.layers[1].mlp.up_proj.weight)
    # training reaches the new layers: their output projections' gradients first
    grown(tokens, labels=tokens).loss.backward()
    assert grown.model.layers[1].self_attn.o_proj.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="multiple of 2"):
        grow_draft(small, 5, seed=1)
