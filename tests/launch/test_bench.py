"""`triforce bench` end to end on tiny checkpoints: every mode and peer, both workloads, two temperatures."""
import json
import random

import pytest
import torch

from checkpoints import write_reduced_vocabulary
from triforce.errors import UserError
from triforce.kernels import cpu
from triforce.launch.cli import main
from triforce.launch.peers import widened_draft
from triforce.coordinator.planning import STOP_BELOW

SMALL_TIERS = ["--budget", "32", "--chunk-size", "4", "--sinks", "2", "--window", "16"]
RETRIEVAL_TIER = SMALL_TIERS[:4]  # (where no mode runs a draft: its flags are refused)


def random_words(path, seed: int, count: int):
    """A text of `count` words the tiny tokenizer knows, written to `path`."""
    rng = random.Random(seed)
    path.write_text(" ".join(f"w{rng.randrange(3, 96)}" for _ in range(count)))
    return path


def test_bench_compares_modes_and_peers(tiny_dir, tmp_path, capsys):
    target = tiny_dir("bench-target", tokenizer=True, seed=50, num_layers=2, scale=25)
    kept = list(range(0, 96, 2))
    draft = write_reduced_vocabulary(tiny_dir("bench-draft", seed=51, num_layers=1, scale=25,
                                              vocab_size=len(kept) + 1), kept, 96)
    text = random_words(tmp_path / "text.txt", 0, 600)
    out = tmp_path / "bench.json"
    code = main(["bench", "--model", str(target), "--draft", str(draft), "--dtype", "float32", "--text", str(text),
                 "--workloads", "novel", "passkey", "--lengths", "120", "--max-new-tokens", "12",
                 "--temperatures", "0", "0.8", "--modes", "ar", "triforce", "--peers", "transformers", "assisted",
                 *SMALL_TIERS, "--out", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out) == report
    # which kernels produced the numbers
    assert (report["cpu"]["kernel_path"], report["cpu"]["isa_level"]) == (cpu.kernel_path(), cpu.isa_level())
    assert report["cpu"]["model"] == cpu.cpu_model() != "" and report["cpu"]["threads"] == torch.get_num_threads()
    rows = report["results"]
    assert len(rows) == 2 * 2 * 4  # workloads x temperatures x (ar, triforce, transformers, assisted)
    for row in rows:
        assert row["tokens_per_s"] > 0
        if row["run"] != "ar":
            assert row["speedup_vs_ar"] > 0
        if row["temperature"] == 0 and row["run"] != "ar":
            assert row["equals_ar"], row  # float32 greedy: every system produces plain decoding's tokens
        assert ("passkey_found" in row) == (row["workload"] == "passkey")
        assert row.get("device") == ("cpu" if row["run"] in ("transformers", "assisted") else None)  # where a peer ran
    triforce = [r for r in rows if r["run"] == "triforce"]
    assert all(len(r["tiers"]) == 2 and r["tiers"][0]["proposed"] > 0 for r in triforce)


def test_bench_runs_batches_of_different_texts(tiny_dir, tmp_path):
    target = tiny_dir("bench-target", tokenizer=True, seed=50, num_layers=2, scale=25)
    draft = tiny_dir("bench-draft-full", seed=51, num_layers=1, scale=25)
    texts = [random_words(tmp_path / f"text{i}.txt", 1 + 10 * i, 500) for i in range(2)]
    out = tmp_path / "bench.json"
    assert main(["bench", "--model", str(target), "--draft", str(draft), "--dtype", "float32", "--text",
                 *map(str, texts), "--lengths", "100", "--batch", "1", "3", "--max-new-tokens", "10",
                 "--modes", "ar", "triforce", *SMALL_TIERS, "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["results"]
    assert [(r["batch"], r["run"]) for r in rows] == [(1, "ar"), (1, "triforce"), (3, "ar"), (3, "triforce")]
    assert [r["generated_tokens"] for r in rows] == [10, 10, 30, 30]
    assert all(r["equals_ar"] for r in rows if r["run"] == "triforce")  # every request of the batch
    assert rows[3]["requests_equal_ar"] == 3
    assert rows[3]["tiers"][0]["checks"] > rows[1]["tiers"][0]["checks"]  # the batch's checks summed


def test_bench_refuses_a_batch_that_would_run_in_parts(tiny_dir, tmp_path, capsys, monkeypatch):
    """A batch whose caches do not fit the memory free at once runs in parts, one after another: its
    tokens/s (all its tokens over the longest decode) counted them as together, up to parts times too high."""
    from triforce import LLM

    target = tiny_dir("bench-target", tokenizer=True, seed=50, num_layers=2, scale=25)
    texts = [random_words(tmp_path / f"text{i}.txt", 1 + 10 * i, 500) for i in range(2)]
    monkeypatch.setattr(LLM, "free_memory", lambda self: int(1.5 * self.cache_bytes_for(100, 10) / self.memory_share))
    assert main(["bench", "--model", str(target), "--dtype", "float32", "--text", *map(str, texts), "--lengths",
                 "100", "--batch", "1", "2", "--max-new-tokens", "10", "--modes", "ar"]) == 2
    assert "a batch of 2 prompts of 100 tokens does not fit" in capsys.readouterr().err


def test_bench_runs_restore_every_prompts_kv_with_a_prefix_cache(tiny_dir, tmp_path, capsys):
    """Each batch's prompts are prefilled once, untimed, so every run restores all of them: the batch of two
    repeats the first batch's prompt, and a run that restored one prompt beside another's prefill would
    count that prefill in its decode."""
    # prompts of more than one prefill chunk (512 tokens, the store's block)
    target = tiny_dir("bench-target-1k", tokenizer=True, seed=50, num_layers=2, scale=25, max_position_embeddings=1024)
    draft = tiny_dir("bench-draft-full", seed=51, num_layers=1, scale=25)
    texts = [random_words(tmp_path / f"text{i}.txt", 2 + i, 700) for i in range(2)]
    out = tmp_path / "bench.json"
    assert main(["bench", "--model", str(target), "--draft", str(draft), "--dtype", "float32", "--text",
                 *map(str, texts), "--lengths", "513", "530", "--batch", "1", "2", "--max-new-tokens", "8", "--modes",
                 "ar", "triforce", *SMALL_TIERS, "--prefix-cache-gb", "1", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    # one chunk a prompt of 530; none of 513, whose prefill (all but its last token) is one block, always
    # prefilled (bench expected one and refused such lengths whatever the store's size)
    rows = [(r["prompt_tokens"], r["batch"], r["run"], r.get("cached_prompt_tokens", 0)) for r in report["results"]]
    assert rows == \
        [(513, 1, "ar", 0), (513, 1, "triforce", 0), (513, 2, "ar", 0), (513, 2, "triforce", 0),
         (530, 1, "ar", 512), (530, 1, "triforce", 512), (530, 2, "ar", 1024), (530, 2, "triforce", 1024)]
    assert all(r["equals_ar"] for r in report["results"] if r["run"] == "triforce") and report["prefix_cache_gb"] == 1
    # a store that cannot hold the largest batch's prompts is an error, not runs that prefill beside others'
    # decode, found before any group runs (the batch of one would fit 1.5 blocks)
    from triforce.models.config import ModelConfig

    gb = 1.5 * 512 * ModelConfig.from_folder(target).kv_bytes_per_token(4) / 2**30
    capsys.readouterr()
    assert main(["bench", "--model", str(target), "--dtype", "float32", "--text", *map(str, texts), "--lengths",
                 "530", "--batch", "1", "2", "--max-new-tokens", "8", "--modes", "ar", "--prefix-cache-gb", str(gb)]) == 2
    err = capsys.readouterr().err
    assert "holds 512 of the 1024 reusable prompt tokens of a batch of 2 x 530" in err and '"repeat"' not in err


def test_equality_with_ar_holds_over_every_repeat_of_a_run():
    """A repeat other than the median one whose greedy tokens parted from ar's (mode auto's plans follow the
    timings; a bfloat16 near-tie) was hidden: equals_ar and requests_equal_ar looked at the median one only."""
    from triforce.launch.bench_rows import compare, medians

    def row(run, rate, *outputs):
        return {"run": run, "tokens_per_s": rate, "prefill_s": 1.0, "temperature": 0, "token_ids": list(outputs)}

    rows = [row("ar", 10, [1, 2], [5, 6]), row("ar", 11, [1, 2], [5, 6]), row("ar", 12, [1, 2], [5, 6]),
            row("auto", 20, [1, 2], [5, 6]), row("auto", 21, [1, 2], [5, 6]), row("auto", 22, [1, 3], [5, 7])]
    ar, auto = compare(medians(rows, None), None, None)
    assert auto["tokens_per_s"] == 21 and auto["equals_ar"] is False and auto["requests_equal_ar"] == 0
    assert "token_ids" not in auto and "token_ids_runs" not in auto
    same = compare(medians(rows[:5] + [row("auto", 22, [1, 2], [5, 6])], None), None, None)[1]
    assert same["equals_ar"] is True and same["requests_equal_ar"] == 2


def test_bench_repeats_take_turns_and_report_medians(tiny_dir, tmp_path, capsys):
    target = tiny_dir("bench-target", tokenizer=True, seed=50, num_layers=2, scale=25)
    draft = tiny_dir("bench-draft-full", seed=51, num_layers=1, scale=25)
    text = random_words(tmp_path / "text.txt", 2, 300)
    out = tmp_path / "bench.json"
    assert main(["bench", "--model", str(target), "--draft", str(draft), "--dtype", "float32", "--text", str(text),
                 "--lengths", "100", "--max-new-tokens", "40", "--modes", "ar", "auto", "--repeats", "3",
                 *SMALL_TIERS, "--out", str(out)]) == 0
    shown = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
    assert [(r["repeat"], r["run"]) for r in shown] == [(i, m) for i in range(3) for m in ("ar", "auto")]
    rows = json.loads(out.read_text())["results"]
    assert [r["run"] for r in rows] == ["ar", "auto"]
    for row in rows:
        runs = [r["tokens_per_s"] for r in shown if r["run"] == row["run"]]
        assert row["tokens_per_s_runs"] == [round(x, 3) for x in runs]
        assert row["tokens_per_s"] == round(sorted(runs)[1], 3)
    # auto's later repeats start from what its first saw (priors.py)
    assert [r["auto_prior"][0] for r in shown if r["run"] == "auto"][1:] == ["earlier requests"] * 2
    first = next(r for r in shown if r["run"] == "auto")["auto_plans"][0][0]  # each plan keeps the gist of why
    assert first["why"]["predicted_tokens_per_s"][first["mode"]] > 0 and "draft" in first["why"]["acceptance"]
    assert first["stop_below"] in (0.0, STOP_BELOW)  # (whether its chains end early: chosen per plan)
    assert main(["bench", "--model", str(target), "--text", str(text), "--lengths", "100", "--repeats", "0"]) == 2


def test_widened_draft_proposes_only_its_tokens(tiny_dir):
    import torch

    kept = [0, 2, 3, 5, 7]
    folder = write_reduced_vocabulary(tiny_dir("v8-reduced-w", seed=30, num_layers=1, vocab_size=6, hidden_size=32,
                                               num_heads=4, num_kv_heads=2), kept, 8)
    from triforce.cache.full import FullKVCache
    from triforce.models.loader import load_model

    ours = load_model(folder)
    wide = widened_draft(folder, torch.float32)
    ids = torch.tensor([1, 2, 7, 4, 6])
    with torch.no_grad():
        theirs = wide(ids[None]).logits[0]
    mine = ours(ids, FullKVCache(ours.config, 8, ours.dtype, "cpu"))
    torch.testing.assert_close(theirs, mine, atol=1e-4, rtol=1e-4)


def test_bench_sweeps_an_engine_setting(tiny_dir, tmp_path):
    """--sweep lookup=0,2: one row per value (ar once), each with the setting it ran and, with the lookup on,
    what the lookup did."""
    target = tiny_dir("bench-target", tokenizer=True, seed=50, num_layers=2, scale=25)
    draft = tiny_dir("bench-draft-full", seed=51, num_layers=1, scale=25)
    text = tmp_path / "text.txt"
    text.write_text(" ".join(f"w{3 + i % 17}" for i in range(300)))  # periodic: the lookup finds copies
    out = tmp_path / "bench.json"
    assert main(["bench", "--model", str(target), "--draft", str(draft), "--dtype", "float32", "--text", str(text),
                 "--lengths", "100", "--max-new-tokens", "20", "--modes", "ar", "triforce", "--sweep", "lookup=0,2",
                 *SMALL_TIERS, "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["results"]
    assert [(r["run"], r.get("lookup")) for r in rows] == [("ar", None), ("triforce", 0), ("triforce", 2)]
    assert "lookup_stats" not in rows[1] and rows[2]["lookup_stats"][0]["candidates"] > 0
    assert all(r["equals_ar"] for r in rows[1:])


def test_bench_gives_a_tree_flag_to_the_modes_it_shapes(tiny_dir, tmp_path):
    """--tree2 shapes `retrieval` mode's tier 2; `triforce` mode, which takes none, runs beside it (the flag
    went to every mode, and triforce's refusal of tree2 ended the bench)."""
    target = tiny_dir("bench-target", tokenizer=True, seed=50, num_layers=2, scale=25)
    draft = tiny_dir("bench-draft-full", seed=51, num_layers=1, scale=25)
    text = random_words(tmp_path / "text.txt", 2, 200)
    out = tmp_path / "bench.json"
    assert main(["bench", "--model", str(target), "--draft", str(draft), "--dtype", "float32", "--text", str(text),
                 "--lengths", "100", "--max-new-tokens", "12", "--modes", "ar", "retrieval", "triforce",
                 "--tree2", "4", *SMALL_TIERS, "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [(r["run"], r.get("tree2")) for r in report["results"]] == [("ar", None), ("retrieval", 4), ("triforce", None)]
    assert report["engine"]["tree2"] == 4 and all(r["equals_ar"] for r in report["results"][1:])  # (it said 0)
    checks = next(t for t in report["results"][1]["tiers"] if t["name"] == "target")
    assert checks["proposed_per_check"] == 4  # a tree of 4 nodes (gamma2 is 6)


def test_a_swept_tree_goes_to_the_modes_it_shapes_and_the_report_names_what_ran(tiny_dir, tmp_path):
    """--sweep tree2=0,4 beside triforce (which takes no tree2): retrieval runs each size, triforce once (it
    was given the value and refused it after the model loaded; a mode that ignored one was labelled with
    it). The report names the command, the code, the seed and the texts behind its numbers."""
    target = tiny_dir("bench-target", tokenizer=True, seed=50, num_layers=2, scale=25)
    draft = tiny_dir("bench-draft-full", seed=51, num_layers=1, scale=25)
    text = random_words(tmp_path / "text.txt", 2, 200)
    out = tmp_path / "bench.json"
    args = ["bench", "--model", str(target), "--draft", str(draft), "--dtype", "float32", "--text", str(text),
            "--lengths", "100", "--max-new-tokens", "8", "--modes", "ar", "retrieval", "triforce",
            "--sweep", "tree2=0,4", "--seed", "7", *SMALL_TIERS, "--out", str(out)]
    assert main(args) == 0
    report = json.loads(out.read_text())
    assert [(r["run"], r.get("tree2")) for r in report["results"]] == [
        ("ar", None), ("retrieval", 0), ("retrieval", 4), ("triforce", None)]
    assert report["argv"] == args  # (main's, not the process's: pytest's here)
    assert report["sweep"] == {"setting": "tree2", "values": [0, 4]} and report["torch"] == torch.__version__
    assert {"mode", "tree2"}.isdisjoint(report["engine"]) and report["engine"]["budget"] == 32  # (it said tree2
    # 0 and mode triforce, which neither every row ran)
    assert report["seed"] == 7 and report["texts"][0]["path"] == str(text) and len(report["texts"][0]["sha256"]) == 16
    assert report["commit"] is None or len(report["commit"].split("+")[0]) == 40


def test_a_mode_without_the_swept_settings_tier_runs_once_unlabelled(tiny_dir, tmp_path):
    """--sweep gamma1=2,3 beside mode retrieval, which runs no draft, and --sweep budget beside mode draft,
    which runs no retrieval tier: those modes ran once per value, labelled with it, their noise shown as
    the setting's effect."""
    target = tiny_dir("bench-target", tokenizer=True, seed=50, num_layers=2, scale=25)
    draft = tiny_dir("bench-draft-full", seed=51, num_layers=1, scale=25)
    text = random_words(tmp_path / "text.txt", 2, 200)
    out = tmp_path / "bench.json"
    for sweep, want in (("gamma1=2,3", [("ar", None), ("draft", 2), ("draft", 3), ("retrieval", None)]),
                        ("budget=32,48", [("ar", None), ("draft", None), ("retrieval", 32), ("retrieval", 48)])):
        name = sweep.split("=")[0]
        tiers = SMALL_TIERS[2:] if name == "budget" else SMALL_TIERS  # (--budget beside it is refused)
        assert main(["bench", "--model", str(target), "--draft", str(draft), "--dtype", "float32", "--text",
                     str(text), "--lengths", "100", "--max-new-tokens", "6", "--modes", "ar", "draft", "retrieval",
                     "--sweep", sweep, *tiers, "--out", str(out)]) == 0
        assert [(r["run"], r.get(name)) for r in json.loads(out.read_text())["results"]] == want


def test_a_swept_value_invalid_beside_a_modes_own_tree_is_refused_before_any_run(tiny_dir, tmp_path, capsys):
    """rounds2 4 beside --tree1 auto (a target check of 4 x 65 tokens): refused before the first run, not
    taken for a setting triforce does not use (it would have run once, without the sweep, and no word)."""
    target = tiny_dir("bench-target", tokenizer=True, seed=50, num_layers=2, scale=25)
    draft = tiny_dir("bench-draft-full", seed=51, num_layers=1, scale=25)
    text = random_words(tmp_path / "text.txt", 2, 200)
    assert main(["bench", "--model", str(target), "--draft", str(draft), "--dtype", "float32", "--text", str(text),
                 "--lengths", "50", "--max-new-tokens", "4", "--modes", "ar", "triforce", "--tree1", "auto",
                 "--sweep", "rounds2=0,4", *SMALL_TIERS]) == 2
    err = capsys.readouterr().err
    assert "must be <= 256" in err.splitlines()[-1] and '"run"' not in err


def test_a_batch_refuses_a_first_text_shorter_than_its_prompt(tiny_dir, tmp_path, capsys):
    """Prompt 0 of a batch is the first text's: one shorter than a prompt ran on into the second text,
    whose start, prompt 1, then repeated it in the same batch."""
    target = tiny_dir("bench-target", tokenizer=True, seed=50, num_layers=2, scale=25)
    texts = [random_words(tmp_path / "short.txt", 3, 30), random_words(tmp_path / "long.txt", 4, 300)]
    assert main(["bench", "--model", str(target), "--dtype", "float32", "--text", *map(str, texts), "--lengths", "50",
                 "--max-new-tokens", "4", "--modes", "ar", "--batch", "1", "2"]) == 2
    assert "text file 1 is too short for prompt 1 of the batch" in capsys.readouterr().err


def test_bench_writes_out_through_a_link_and_names_a_default_draft_it_could_not_fetch(tiny_dir, tmp_path, capsys,
                                                                                       monkeypatch):
    """--out is written whole (a temporary file renamed over it), except where it is a link (or a FIFO), which
    stays one; a draft mode whose default draft could not be fetched says so (not "has no default one")."""
    from triforce import llm_models

    target = tiny_dir("bench-target", tokenizer=True, seed=50, num_layers=2, scale=25)
    text = random_words(tmp_path / "text.txt", 2, 200)
    report, link = tmp_path / "report.json", tmp_path / "latest.json"
    report.write_text("{}")
    link.symlink_to(report)
    args = ["bench", "--model", str(target), "--dtype", "float32", "--text", str(text), "--lengths", "50",
            "--max-new-tokens", "4", "--modes", "ar"]
    assert main(args + ["--out", str(link)]) == 0
    assert link.is_symlink() and json.loads(report.read_text())["results"][0]["run"] == "ar"
    capsys.readouterr()
    monkeypatch.setitem(llm_models.DEFAULT_DRAFTS, str(target), str(tmp_path / "no-such-draft"))
    assert main(args[:-1] + ["draft"]) == 2
    assert "the default draft" in capsys.readouterr().err.splitlines()[-1]


def test_a_passkey_prompt_holds_no_special_tokens_mid_text():
    """The planted key and the question are tokenized apart: a Llama or Mistral tokenizer put BOS before each."""
    from types import SimpleNamespace

    from triforce.launch.bench_plan import passkey_prompt

    def llama_like(text, add_special_tokens=True):  # BOS (1) first unless told otherwise
        return SimpleNamespace(input_ids=[1] * add_special_tokens + [3 + ord(c) % 50 for c in text])

    ids, key = passkey_prompt(llama_like, list(range(60, 400)), 300, seed=0)
    assert len(ids) == 300 and 1 not in ids and len(key) == 5


def test_a_sweep_casts_each_value_to_its_settings_type():
    from triforce.launch.bench_plan import parse_sweep

    modes = ["ar", "triforce"]
    assert parse_sweep(["stop_below=0,0.3"], modes) == ("stop_below", [0.0, 0.3])  # float | None
    assert parse_sweep(["tree1=auto,4"], modes) == ("tree1", ["auto", 4])  # int | str
    assert parse_sweep(["lookup=0,3"], modes) == ("lookup", [0, 3])  # int | None
    assert parse_sweep(["budget=256,512"], modes) == ("budget", [256, 512])
    assert parse_sweep(["auto_self_draft=false,True"], ["auto"]) == ("auto_self_draft", [False, True])  # bool
    with pytest.raises(UserError, match="takes true and false"):
        parse_sweep(["auto_self_draft=0,1"], ["auto"])


@pytest.mark.parametrize("flag,value", [("--lengths", "-5"), ("--batch", "0"), ("--max-new-tokens", "0"),
                                        ("--repeats", "0")])
def test_bench_refuses_counts_below_one(tiny_dir, tmp_path, capsys, flag, value):
    """A negative length cut the text from its end and was reported as "prompt_tokens": -5; batch 0 ran."""
    target = tiny_dir("bench-target", tokenizer=True, seed=50, num_layers=2, scale=25)
    text = random_words(tmp_path / "text.txt", 2, 200)
    assert main(["bench", "--model", str(target), "--dtype", "float32", "--text", str(text), "--lengths", "50",
                 "--max-new-tokens", "4", "--modes", "ar", flag, value]) == 2
    assert f"{flag} must be at least 1" in capsys.readouterr().err


@pytest.mark.parametrize("extra, message", [
    (["--lengths", "50", "5000"], "past the model's"), (["--lengths", "50", "240"], "tokens of --text"),
    (["--temperatures", "0", "-1"], "temperature"), (["--top-p", "2"], "--top-p must be in (0, 1]"), (["--sweep", "gamma2=3,-5"], "--gamma1 and --gamma2 must be"),
    (["--sweep", "mode=ar,retrieval"], "other than the mode"), (["--workloads", "novel", "passkey", "--batch", "1", "2"], "batch 1"),
    (["--out", "."], "is a folder"),
    (["--workloads", "passkey", "--lengths", "10"], "--lengths 10: a passkey prompt holds its key and question"),
    (["--sweep", "budget=32", "--sweep", "gamma1=2"], "one --sweep at a time"),  # the last one ran alone
    (["--modes", "ar", "--sweep", "budget=32,64"], "runs ar alone"),  # ignored
    (["--sweep", "tree1=4"], "none of --modes runs"),  # ar and retrieval: tier 1 runs in neither
    (["--tree1", "4"], "none of --modes runs"),  # silently ignored
    (["--draft", "some-draft"], "none of --modes runs a draft"),  # silently ignored
    (["--tree2", "4", "--sweep", "tree2=2,8"], "both set it"),
    (["--budget", "32", "--sweep", "budget=32,64"], "--budget 32 and --sweep budget both set it: leave out --budget"),
    (["--gamma2", "3", "--sweep", "gamma2=2,4"], "--gamma2 3 and --sweep gamma2 both set it"),  # the flag dropped
    (["--sweep", "gamma1=2,3"], "--sweep gamma1: none of --modes (ar retrieval) runs it"),  # one run, as a sweep
    (["--modes", "ar", "draft", "--sweep", "full_layers=1,2"], "--sweep full_layers: none of --modes (ar draft)"),
    (["--budget", "12", "--chunk-size", "4", "--sweep", "tree1=4"], "--sweep 'tree1=4': none of --modes runs it"),
    # (and not "--budget 12: none of --modes runs it": a budget asked apart from its chunk size)
    (["--sinks", "2"], "--sinks 2: none of --modes runs the draft tier"),  # ignored by ar and retrieval
    (["--modes", "ar", "--budget", "64"], "--budget 64: none of --modes runs the retrieval tier"),
    (["--full-layers", "9"], "--full-layers 9 is more than the target's 2 layers"),  # (the LLM was made in mode ar)
    (["--rounds2", "2"], "--rounds2 2: none of --modes runs it"),  # ar and retrieval: silently ignored
    (["--tree-shape", "confidence"], "--tree-shape confidence: none of --modes runs it"),  # chains: ignored
    (["--sweep", "tree_shape=confidence"], "--sweep 'tree_shape=confidence': none of --modes"),
    (["--sweep", "rounds2=2"], "--sweep 'rounds2=2': none of --modes runs it"),
    (["--modes", "ar", "--stop-below", "0.3"], "--stop-below 0.3: none of --modes runs it (--stop-below shapes"),
    (["--modes", "ar", "--lookup", "2"], "--lookup 2: none of --modes runs it"),
    (["--modes", "ar", "ar"], "--modes names a value twice"), (["--lengths", "50", "50"], "--lengths names a value"),
    (["--temperatures", "0", "0.0"], "--temperatures names a value twice"),  # each group ran twice
    (["--temperatures", "0.001", "0.01"], "--temperatures names a value twice"),  # both run at 0.01
    (["--sweep", "budget=32,32"], "--sweep budget names a value twice"),  # merged as if repeats
    (["--peers", "transformers", "transformers"], "--peers names a value twice"),
    (["--peers", "transformers", "--max-new-tokens", "1"], "at least 2"),  # a rate of 0, then a ZeroDivisionError
    (["--batch", "1", "1"], "--batch names a value twice"),
    (["--out", "/proc/bench.json"], "cannot write --out /proc/bench.json"),
    (["--modes", "ar", "draft"], "--modes draft runs a draft"),  # a ValueError traceback after the ar runs
    (["--peers", "llamacpp", "--gguf", "/no/such.gguf"], "--gguf /no/such.gguf: no such file"),
    (["--peers", "transformers", "--batch", "2"], "the peers run at batch 1"),  # loaded, never run
    (["--gguf", "/no/such.gguf"], "add --peers llamacpp")])
def test_bench_checks_every_setting_before_the_first_run(tiny_dir, tmp_path, capsys, extra, message):
    """A bad value met in a later group threw away the groups before it (and `--sweep mode=` was a traceback)."""
    target = tiny_dir("bench-target", tokenizer=True, seed=50, num_layers=2, scale=25)
    text = random_words(tmp_path / "text.txt", 2, 200)
    args = ["bench", "--model", str(target), "--dtype", "float32", "--text", str(text), "--lengths", "50",
            "--max-new-tokens", "4", "--modes", "ar", "retrieval"]
    assert main(args + extra) == 2
    err = capsys.readouterr().err
    assert message in err.splitlines()[-1] and '"run"' not in err  # no run reported before it


@pytest.mark.chosen_weights
def test_a_swept_int8_twin_is_made_or_refused_before_any_run(tiny_dir, tmp_path, capsys, monkeypatch, int8_kernels):
    """--sweep retrieval_weights=target,int8: the twin the second value asks for is made in the checks before
    the first run (so the memory check of a batch counts it), and a twin that does not fit is refused there,
    not after the runs of the first value. No value is auto: nothing is timed, and each row, not the report,
    names the weights."""
    from triforce.coordinator import proposer_weights
    from triforce.models import quantized

    monkeypatch.setattr(proposer_weights, "forward_seconds", lambda *a: pytest.fail("timed a twin no run reads"))

    target = tiny_dir("bench-target", tokenizer=True, seed=50, num_layers=2, scale=25)
    text = random_words(tmp_path / "text.txt", 2, 200)
    args = ["bench", "--model", str(target), "--dtype", "float32", "--text", str(text), "--lengths", "50",
            "--max-new-tokens", "4", "--modes", "ar", "retrieval", *RETRIEVAL_TIER, "--sweep",
            "retrieval_weights=target,int8"]
    with monkeypatch.context() as m:
        m.setattr(quantized, "available_bytes", lambda device: 1)
        assert main(args) == 2
    err = capsys.readouterr().err
    assert "--retrieval-weights int8 needs" in err.splitlines()[-1] and '"run"' not in err
    out = tmp_path / "bench.json"
    assert main(args + ["--out", str(out)]) == 0
    rows = json.loads(out.read_text())["results"]
    assert [(r["run"], r.get("retrieval_weights")) for r in rows] == [("ar", None), ("retrieval", "target"),
                                                                       ("retrieval", "int8")]
    assert [r["proposer_weights"] for r in rows] == [{}, {"retrieval": "own"}, {"retrieval": "int8"}]
    assert json.loads(out.read_text())["proposer_weights"] == {}
    assert all(r["equals_ar"] for r in rows[1:])


@pytest.mark.chosen_weights
def test_the_report_names_the_weights_each_run_read_and_times_only_tiers_that_run(tiny_dir, tmp_path, monkeypatch,
                                                                                  int8_kernels):
    """--modes ar draft: the bench's LLM (mode triforce, to load the draft) makes and times no twin for the
    retrieval tier, which no run reads; the report says why the draft runs what it runs, and each row what it
    read."""
    from triforce.coordinator import proposer_weights

    timed = []
    monkeypatch.setattr(proposer_weights, "forward_seconds", lambda models, n: timed.append(models[0]) or [1.0, 0.5])
    target = tiny_dir("bench-target", tokenizer=True, seed=50, num_layers=2, scale=25)
    draft = tiny_dir("bench-draft-full", seed=51, num_layers=1, scale=25)
    text = random_words(tmp_path / "text.txt", 2, 200)
    out = tmp_path / "bench.json"
    assert main(["bench", "--model", str(target), "--draft", str(draft), "--dtype", "float32", "--text", str(text),
                 "--lengths", "50", "--max-new-tokens", "4", "--modes", "ar", "draft", *SMALL_TIERS[4:],
                 "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert list(report["proposer_weights"]) == ["draft"] and report["proposer_weights"]["draft"]["weights"] == "int8"
    assert "0.50x the time" in report["proposer_weights"]["draft"]["why"]
    assert len(timed) == 1 and timed[0].config.num_layers == 1  # the draft's, timed once
    assert report["engine"]["retrieval_weights"] == "target"
    assert [(r["run"], r["proposer_weights"]) for r in report["results"]] == [("ar", {}), ("draft", {"draft": "int8"})]
    assert report["results"][1]["equals_ar"]


def test_bench_on_a_model_without_a_tokenizer_is_one_line(tiny_dir, tmp_path, capsys):
    """Its prompts are cut from --text with the tokenizer: a folder without one was a TypeError traceback."""
    target = tiny_dir("bench-untokenized", seed=50, num_layers=2, scale=25)
    text = random_words(tmp_path / "text.txt", 2, 200)
    assert main(["bench", "--model", str(target), "--dtype", "float32", "--text", str(text), "--lengths", "50",
                 "--max-new-tokens", "4", "--modes", "ar"]) == 2
    assert "has none" in capsys.readouterr().err.splitlines()[-1]


@pytest.mark.parametrize("stop, code, why", [(KeyboardInterrupt, 130, "Ctrl-C"),
                                             (UserError("the caches need 9 GiB"), 2, "UserError: the caches need 9 GiB")])
def test_bench_keeps_the_groups_that_ended_when_interrupted(tiny_dir, tmp_path, capsys, monkeypatch, stop, code, why):
    """Ctrl-C, or a later group the memory check refuses: the groups before it are written."""
    from triforce.api import LLM

    target = tiny_dir("bench-target", tokenizer=True, seed=50, num_layers=2, scale=25)
    text = random_words(tmp_path / "text.txt", 2, 300)
    calls = []
    generate = LLM.generate

    def generate_until_the_third_group(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 1 + 2 * 2 + 1:  # the warm-up, two groups of two modes, then Ctrl-C
            raise stop
        return generate(self, *args, **kwargs)

    monkeypatch.setattr(LLM, "generate", generate_until_the_third_group)
    out = tmp_path / "b.json"
    assert main(["bench", "--model", str(target), "--dtype", "float32", "--text", str(text), "--lengths", "40", "60",
                 "80", "--max-new-tokens", "4", "--modes", "ar", "retrieval", *RETRIEVAL_TIER, "--out", str(out)]) == code
    report = json.loads(out.read_text())
    assert report["interrupted"] == why and [r["prompt_tokens"] for r in report["results"]] == [40, 40, 60, 60]
    assert json.loads(capsys.readouterr().out) == report


def test_the_report_file_is_written_before_standard_output(tmp_path, monkeypatch):
    """A reader of standard output that has gone (`| head` on a report past the pipe's buffer) ended the
    program with a broken pipe, and --out, written after, was never written: now it is, first."""
    import argparse

    from triforce.launch import bench

    class Gone:
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            pass

    out = tmp_path / "report.json"
    monkeypatch.setattr("sys.stdout", Gone())
    with pytest.raises(BrokenPipeError):
        bench._write(argparse.Namespace(out=str(out)), {"results": [1, 2]})
    assert json.loads(out.read_text()) == {"results": [1, 2]}


def test_a_tree_flag_of_0_is_no_tree(tmp_path):
    """--tree1 0 (a chain, the default) was the string "0", a set flag: refused beside modes it does not
    shape, and beside a sweep of tree1."""
    from triforce.launch.bench_plan import check_tier_settings
    from triforce.launch.cli import build_parser

    args = build_parser().parse_args(["bench", "--text", str(tmp_path), "--modes", "ar", "retrieval", "--tree1", "0"])
    assert args.tree1 == 0
    check_tier_settings(args, None, [None])
    check_tier_settings(args, "tree1", [0])
    args = build_parser().parse_args(["bench", "--text", str(tmp_path), "--tree2", "auto"])
    assert args.tree2 == "auto"
