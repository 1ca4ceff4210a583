"""The CLI: JSON and streamed output, and one clear line with exit code 2 for each kind of bad input."""
import json
import os
import re
import subprocess
import sys

import pytest

from triforce import api, request_memory
from triforce.errors import UserError
from triforce.launch.cli import build_parser, main

WORDS = " ".join(f"w{3 + i % 90}" for i in range(60))


@pytest.fixture(scope="module")
def target(tiny_dir):
    return tiny_dir("cli-target", tokenizer=True, seed=31, max_position_embeddings=256)


@pytest.fixture(scope="module")
def draft(tiny_dir):
    return tiny_dir("cli-draft", tokenizer=True, seed=32, num_layers=1)


def run_cli(capsys, *args):
    code = main(["generate", *map(str, args)])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_json_output(capsys, target, draft):
    code, out, err = run_cli(capsys, "--model", target, "--draft", draft, "--prompt", WORDS, "--max-new-tokens", 12,
                             "--temperature", 0, "--ignore-eos", "--json", "--dtype", "float32", "--window", 64,
                             "--mode", "triforce", "--logprobs", 2)
    assert code == 0, err
    result = json.loads(out)
    assert set(result) >= {"text", "token_ids", "prompt_tokens", "metrics", "logprobs"}
    assert len(result["token_ids"]) == 12 and result["prompt_tokens"] == 60
    entries = result["logprobs"]  # greedy: each token is the most likely there
    assert [e["token"] for e in entries] == [e["top"][0][0] for e in entries] == result["token_ids"]
    assert all(len(e["top"]) == 2 and e["logprob"] == e["top"][0][1] < 0 for e in entries)
    pinned = {"weights": "own", "why": "TRIFORCE_PROPOSER_WEIGHTS=own"}  # (the tests')
    assert result["proposer_weights"] == {"retrieval": pinned, "draft": pinned}
    metrics = result["metrics"]
    assert {"prefill_s", "decode_s", "tokens_per_s"} <= set(metrics)
    assert [t["name"] for t in metrics["tiers"]] == ["retrieval", "target"]
    assert [t["drafter"] for t in metrics["tiers"]] == ["draft", "retrieval"]
    assert all({"proposed", "accepted", "acceptance_rate"} <= set(t) for t in metrics["tiers"])


def test_a_tiers_own_weights_are_taken_in_modes_without_the_tier(capsys, target):
    """--retrieval-weights target in mode ar, --draft-weights draft in mode retrieval: what those modes run anyway
    (the defaults until "auto"), so taken; int8 would be ignored there, so refused."""
    base = ["--model", target, "--prompt", WORDS, "--max-new-tokens", 2, "--dtype", "float32", "--json"]
    for mode, flag, own in (("ar", "--retrieval-weights", "target"), ("retrieval", "--draft-weights", "draft")):
        code, out, err = run_cli(capsys, *base, "--mode", mode, flag, own)
        assert code == 0, err
        assert json.loads(out)["proposer_weights"] == ({} if mode == "ar" else {"retrieval": {
            "weights": "own", "why": "TRIFORCE_PROPOSER_WEIGHTS=own"}})
        code, out, err = run_cli(capsys, *base, "--mode", mode, flag, "int8")
        assert code == 2 and f"{flag} sets the" in err


def test_confidence_shaped_trees_from_the_command_line(capsys, target, draft):
    code, out, err = run_cli(capsys, "--model", target, "--draft", draft, "--prompt", WORDS, "--max-new-tokens", 12,
                             "--temperature", 0.8, "--seed", 1, "--ignore-eos", "--json", "--dtype", "float32",
                             "--window", 64, "--mode", "triforce", "--tree1", 6, "--tree-shape", "confidence")
    assert code == 0, err
    tier2 = json.loads(out)["metrics"]["tiers"][0]
    assert tier2["drafter"] == "draft" and tier2["proposed_per_check"] >= 4  # at least the spine of gamma1


def test_streamed_text_equals_json_text(capsys, target, draft):
    common = ["--model", target, "--draft", draft, "--prompt", WORDS, "--max-new-tokens", 10, "--seed", 3,
              "--temperature", 0.9, "--ignore-eos", "--dtype", "float32", "--window", 64]
    _, out, err = run_cli(capsys, *common)
    _, js, _ = run_cli(capsys, *common, "--json")
    assert out.strip() == json.loads(js)["text"].strip() and "tok/s" in err


def test_auto_is_the_default_and_says_what_it_chose(capsys, target, draft):
    code, out, err = run_cli(capsys, "--model", target, "--draft", draft, "--prompt", WORDS, "--max-new-tokens", 40,
                             "--temperature", 0, "--ignore-eos", "--json", "--dtype", "float32", "--window", 64)
    assert code == 0, err
    result = json.loads(out)
    assert result["mode"] == "auto" and len(result["token_ids"]) == 40
    first = result["metrics"]["auto"][0]
    assert first["at_token"] == 0 and first["mode"] in ("ar", "draft", "retrieval", "triforce")
    assert "ar" in first["why"]["predicted_tokens_per_s"] and "draft" in first["why"]["acceptance"]
    from triforce.launch.generate import plans_text

    assert plans_text([{"mode": "draft", "gammas": [2]}, {"mode": "ar", "gammas": []},
                       {"mode": "triforce", "gammas": [4, 6]}]) == "draft(2) -> ar -> triforce(4, 6)"


@pytest.mark.parametrize("extra", [[], ["--tree1", "0"]])  # a chain named as such (the flag's "0" was refused)
def test_triforce_without_draft_falls_back_with_one_notice(capsys, target, extra):
    code, out, err = run_cli(capsys, "--model", target, "--prompt", WORDS, "--max-new-tokens", 4, "--json",
                             "--mode", "triforce", *extra)
    assert code == 0 and json.loads(out)["mode"] == "retrieval"
    assert err.count("falls back to 'retrieval'") == 1


def test_a_default_draft_not_to_be_had_runs_without_one_and_a_named_one_is_an_error(capsys, target, monkeypatch,
                                                                                       tiny_dir):
    """A known target's default draft is fetched on first use; offline (or the fetch failing) mode auto and
    triforce ran nothing at all, though they run without a draft. A draft the user named, or mode draft,
    still fail with the reason."""
    from triforce import llm_models
    from triforce.models.config import ModelLoadError

    def offline(spec, revision=None):
        if str(spec) == "some-draft":
            raise ModelLoadError("could not download some-draft-part1==0.9.0: no network")
        return real(spec, revision)

    real = llm_models.resolve_model
    monkeypatch.setattr(llm_models, "resolve_model", offline)
    monkeypatch.setitem(llm_models.DEFAULT_DRAFTS, str(target), "some-draft")
    for mode, ran in (("auto", "auto"), ("triforce", "retrieval")):
        code, out, err = run_cli(capsys, "--model", target, "--prompt", WORDS, "--max-new-tokens", 4, "--json",
                                 "--mode", mode)
        assert code == 0 and json.loads(out)["mode"] == ran
        assert "the default draft some-draft is not to be had (could not download" in err
    for extra in (["--mode", "draft"], ["--draft", "some-draft"]):
        code, out, err = run_cli(capsys, "--model", target, "--prompt", WORDS, "--max-new-tokens", 4, *extra)
        assert code != 0 and "could not download some-draft" in err.splitlines()[-1]
    # one that is had but cannot serve the target (another tokenizer, a damaged folder): left out too
    other = tiny_dir("cli-other-tokens-draft", tokenizer=True, vocab_size=40, seed=3, num_layers=1)
    monkeypatch.setitem(llm_models.DEFAULT_DRAFTS, str(target), other)
    code, out, err = run_cli(capsys, "--model", target, "--prompt", WORDS, "--max-new-tokens", 4, "--json",
                             "--mode", "triforce")
    assert code == 0 and json.loads(out)["mode"] == "retrieval"
    assert f"the default draft {other} cannot serve this target" in err
    code, out, err = run_cli(capsys, "--model", target, "--prompt", WORDS, "--max-new-tokens", 4, "--draft", other)
    assert code != 0 and "the draft: draft tokenizer differs" in err.splitlines()[-1]  # named: its error


def bad_inputs(target, draft, tmp_path, tiny_dir):
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "config.json").write_text((target / "config.json").read_text())
    (corrupt / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    broken_tokenizer = tmp_path / "broken-tokenizer"
    broken_tokenizer.mkdir()
    for file in target.iterdir():
        (broken_tokenizer / file.name).symlink_to(file)
    (broken_tokenizer / "tokenizer.json").unlink()
    (broken_tokenizer / "tokenizer.json").write_text('{"garbage": ')
    windowed = tmp_path / "sliding-window"  # Mistral-style: attention within a band of 32 tokens
    windowed.mkdir()
    for file in target.iterdir():
        if file.name != "config.json":
            (windowed / file.name).symlink_to(file)
    (windowed / "config.json").write_text(json.dumps({**json.loads((target / "config.json").read_text()),
                                                      "model_type": "mistral", "sliding_window": 32}))
    other_vocab = tiny_dir("cli-draft-v64", tokenizer=True, seed=33, vocab_size=64, num_layers=1)
    empty_file = tmp_path / "empty.txt"
    empty_file.write_text("")
    long_prompt = " ".join(f"w{3 + i % 90}" for i in range(300))
    base = ["--prompt", WORDS, "--max-new-tokens", 4]
    return {
        "missing folder": (["--model", tmp_path / "nope", *base], "no such model folder"),
        "a draft that is a plain file": (["--model", target, "--draft", empty_file, *base],
                                         "empty.txt is a file, not a model folder or a .gguf file"),
        "corrupt folder": (["--model", corrupt, *base], "corrupt"),
        "corrupt tokenizer": (["--model", broken_tokenizer, *base], "cannot read the tokenizer"),  # was "no tokenizer"
        "draft vocabulary": (["--model", target, "--draft", other_vocab, *base], "vocabulary"),
        "prompt too long": (["--model", target, "--prompt", long_prompt], "positions; --rope-scaling yarn:"),
        "prompt past a sliding window": (["--model", windowed, *base], "32 positions (its sliding window"),
        "draft window past its positions": (["--model", target, "--draft", draft, *base, "--window", 600], "positions"),
        "budget not multiple": (["--model", target, *base, "--budget", 30, "--chunk-size", 8], "multiple"),
        "gamma1 < 1": (["--model", target, *base, "--gamma1", 0], "gamma"),
        "tree past the draft's window": (["--model", target, "--draft", draft, *base, "--mode", "triforce",
                                          "--tree1", 20, "--window", 16], "streaming window"),
        "a draft's tree without a draft": (["--model", target, *base, "--mode", "triforce", "--tree1", 8],
                                           "this target has no draft"),
        "rounds without a draft": (["--model", target, *base, "--mode", "triforce", "--rounds2", 2],
                                   "--rounds2 counts the retrieval tier's checks of a draft's proposals, and this "
                                   "target has no draft"),
        "a draft window without a draft": (["--model", target, *base, "--mode", "triforce", "--window", 64],
                                           "--window sets the draft tier, and this target has no draft"),  # ignored
        "a tree in mode ar": (["--model", target, *base, "--mode", "ar", "--tree1", 8], "mode ar does not run"),
        "a draft in mode retrieval": (["--model", target, "--draft", draft, *base, "--mode", "retrieval"],
                                      "runs a tier that mode retrieval does not run"),
        "tier 2's tree in mode draft": (["--model", target, "--draft", draft, *base, "--mode", "draft", "--tree2", 8],
                                        "takes mode retrieval"),
        "gamma2 < 1": (["--model", target, *base, "--gamma2", -1], "gamma"),
        "a tree shape without a tree": (["--model", target, "--draft", draft, *base, "--mode", "triforce",
                                         "--tree-shape", "confidence"], "--tree-shape 'confidence' shapes token trees"),
        "stop-below in mode ar": (["--model", target, *base, "--mode", "ar", "--stop-below", 0.3], "mode ar runs"),
        "lookup in mode ar": (["--model", target, *base, "--mode", "ar", "--lookup", 2],
                              "lookup shapes a proposer's chains"),
        "rounds in mode retrieval": (["--model", target, *base, "--mode", "retrieval", "--rounds2", 2],
                                     "mode retrieval does not take it"),
        "a budget in mode ar": (["--model", target, *base, "--mode", "ar", "--budget", 512],
                                "--budget sets the retrieval tier, which mode ar does not run"),  # ignored
        "a window in mode retrieval": (["--model", target, *base, "--mode", "retrieval", "--window", 64],
                                       "--window sets the draft tier, which mode retrieval does not run"),
        "gamma2 beside rounds": (["--model", target, "--draft", draft, *base, "--mode", "triforce", "--rounds2", 2,
                                  "--gamma2", 4], "--gamma2 4 is unused while --rounds2"),
        "full layers past the target's": (["--model", target, *base, "--full-layers", 9], "--full-layers 9 is more"),
        "temperature < 0": (["--model", target, *base, "--temperature", -0.5], "temperature"),
        "top-p 0": (["--model", target, *base, "--top-p", 0], "--top-p"),
        "top-p > 1": (["--model", target, *base, "--top-p", 1.5], "--top-p"),
        "logprobs without json": (["--model", target, *base, "--logprobs", 2], "--json"),
        "logprobs < 0": (["--model", target, *base, "--logprobs", -1, "--json"], "logprobs"),
        "empty prompt": (["--model", target, "--prompt", ""], "empty prompt"),
        "empty prompt file": (["--model", target, "--prompt-file", empty_file], "empty prompt"),
        "missing prompt file": (["--model", target, "--prompt-file", tmp_path / "none.txt"], "cannot read"),
        "rope scaling without factor": (["--model", target, *base, "--rope-scaling", "yarn"], "KIND:FACTOR"),
        "empty rope scaling": (["--model", target, *base, "--rope-scaling", ""], "KIND:FACTOR"),  # was none
        "rope scaling of an unknown kind": (["--model", target, *base, "--rope-scaling", "ntk:2"], "KIND:FACTOR"),
        "rope scaling factor 1": (["--model", target, *base, "--rope-scaling", "linear:1"], "FACTOR > 1"),
        "rope scaling factor past 64": (["--model", target, *base, "--rope-scaling", "yarn:inf"], "at most 64"),
        "rope scaling a scaled model": (["--model", tiny_dir("cli-llama3", tokenizer=True, arch="llama3"), *base,
                                         "--rope-scaling", "yarn:2"], "already scales RoPE"),
        "workers < 0": (["--model", target, *base, "--workers", -1], "--workers"),
        "workers that do not split the model": (["--model", target, *base, "--workers", 3], "do not split 3 ways"),
        "one worker and no model": (["--model", tmp_path / "nope", *base, "--workers", 1], "no such model folder"),
        "worker timeout 0": (["--model", target, *base, "--workers", 1, "--worker-timeout", 0], "--worker-timeout"),
        "worker timeout nan": (["--model", target, *base, "--workers", 1, "--worker-timeout", "nan"],
                               "--worker-timeout"),
        "control port past 65535": (["--model", target, *base, "--workers", 1, "--control-port", 70000],
                                    "--control-port"),
        "a schema file that is not there": (["--model", target, *base, "--json-schema", tmp_path / "none.json"],
                                            "no such file"),
        "unknown device": (["--model", target, *base, "--device", "tpu"], "device must be"),
        "a GPU this process lacks": (["--model", target, *base, "--device", "cuda:99"], "device cuda:99"),
        "unknown worker device": (["--model", target, *base, "--workers", 1, "--worker-device", "tpu"],
                                  "--worker-device"),
        "worker flags without workers": (["--model", target, *base, "--worker-device", "cuda", "--control-port", 9],
                                         "--control-port, --worker-device set a worker group, and this command runs"),
    }


CASES = ["missing folder", "a draft that is a plain file", "corrupt folder", "corrupt tokenizer", "draft vocabulary",
         "prompt too long", "prompt past a sliding window", "draft window past its positions", "budget not multiple", "gamma1 < 1",
         "tree past the draft's window", "a draft's tree without a draft", "rounds without a draft",
         "a draft window without a draft", "a tree in mode ar",
         "a draft in mode retrieval", "tier 2's tree in mode draft", "gamma2 < 1", "rounds in mode retrieval",
         "a tree shape without a tree", "stop-below in mode ar", "lookup in mode ar", "a budget in mode ar",
         "a window in mode retrieval",
         "gamma2 beside rounds", "full layers past the target's",
         "temperature < 0", "top-p 0", "top-p > 1", "logprobs without json", "logprobs < 0", "empty prompt",
         "empty prompt file", "missing prompt file", "rope scaling without factor", "empty rope scaling",
         "rope scaling of an unknown kind", "rope scaling factor 1", "rope scaling factor past 64",
         "rope scaling a scaled model", "workers < 0", "workers that do not split the model",
         "one worker and no model", "worker timeout 0", "worker timeout nan", "control port past 65535",
         "a schema file that is not there", "unknown device", "a GPU this process lacks", "unknown worker device",
         "worker flags without workers"]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_one_clear_line(capsys, target, draft, tmp_path, tiny_dir, case):
    cases = bad_inputs(target, draft, tmp_path, tiny_dir)
    assert set(cases) == set(CASES)  # none written and left out of the run
    args, needle = cases[case]
    code, out, err = run_cli(capsys, *args)
    lines = [line for line in err.splitlines() if line.startswith("triforce: error:")]
    assert code == 2 and len(lines) == 1 and needle in lines[0], err
    assert "Traceback" not in err and out == ""


def test_a_bad_prompt_or_flag_is_said_before_the_model_loads(capsys, tmp_path, monkeypatch):
    """A missing prompt file, a schema file that is not there: said at once, not after the weights load
    (on a fresh machine after a model's download and conversion)."""
    import triforce.launch.generate as generate_module

    monkeypatch.setattr(generate_module, "llm_from_args", lambda args: pytest.fail("the model was loaded first"))
    for args, needle in ((["--prompt-file", tmp_path / "none.txt"], "cannot read prompt file"),
                         (["--prompt", "hi", "--json-schema", tmp_path / "none.json"], "no such file"),
                         (["--prompt", "hi", "--grammar", "gramar.gbnf"], "no such file, nor a grammar")):
        code, _, err = run_cli(capsys, "--model", "qwen2.5-coder-1.5b", *args)
        assert code == 2 and needle in err, err


def test_rope_scaling_stretches_the_positions_and_is_recorded(capsys, target, draft):
    """A prompt past the target's 256 positions runs with --rope-scaling yarn:2 (512), in all three tiers,
    recorded as the scaling it is however it was written (it was recorded as typed)."""
    long_prompt = " ".join(f"w{3 + i % 90}" for i in range(300))
    code, out, err = run_cli(capsys, "--model", target, "--draft", draft, "--prompt", long_prompt, "--max-new-tokens",
                             6, "--ignore-eos", "--json", "--dtype", "float32", "--rope-scaling", " YaRN:2.0")
    assert code == 0, err
    result = json.loads(out)
    assert result["rope_scaling"] == "yarn:2" and result["prompt_tokens"] == 300 and len(result["token_ids"]) == 6


def test_prompt_larger_than_memory(capsys, target, monkeypatch):
    monkeypatch.setattr(request_memory, "available_bytes", lambda device: 1000)
    code, _, err = run_cli(capsys, "--model", target, "--prompt", WORDS)
    assert code == 2 and "of the 0.98 KiB free on" in err, err  # (it read 0.00 GiB)


def test_console_entry_point_prints_no_traceback(tmp_path):
    done = subprocess.run([sys.executable, "-m", "triforce", "generate", "--model", str(tmp_path / "missing"),
                           "--prompt", "hi"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.startswith("triforce: error:") and "Traceback" not in done.stderr


def test_help_lists_every_command_without_loading_torch():
    """`triforce --help`, and each command's, import only what those commands need: torch is not loaded (it
    took 2.3 s of `triforce --help`, and of `bench --help`, `batch --help` and `train-draft --help` until
    their flags left their runs' modules); bench's and train-draft's flags are still all there."""
    code = ("import contextlib, io, sys\n"
            "from triforce.launch.cli import main\n"
            "for argv in (['--help'], ['generate', '--help'], ['serve', '--help'], ['fetch-model', '--help'],\n"
            "             ['bench', '--help'], ['batch', '--help'], ['train-draft', '--help']):\n"
            "    out = io.StringIO()\n"
            "    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):\n"
            "        main(argv)\n"
            "    print(len(out.getvalue()), 'torch' in sys.modules, out.getvalue().split()[2])\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    lines = [line.split() for line in done.stdout.splitlines()]
    assert done.returncode == 0 and len(lines) == 7, done.stderr
    assert all(int(size) > 300 and loaded == "False" for size, loaded, _ in lines), lines
    assert [usage for _, _, usage in lines] == ["[-h]", "generate", "serve", "fetch-model", "bench", "batch",
                                                "train-draft"]  # each its own
    summary = subprocess.run([sys.executable, "-m", "triforce", "--help"], capture_output=True, text=True, timeout=120)
    assert all(name in summary.stdout for name in ("generate", "fetch-model", "bench", "serve", "batch", "train-draft"))
    bench = build_parser("bench")._subparsers._group_actions[0].choices["bench"]
    assert {"--text", "--modes", "--gamma1"} <= {o for a in bench._actions for o in a.option_strings}
    train = build_parser("train-draft")._subparsers._group_actions[0].choices["train-draft"]
    assert {"--out", "--layers", "--steps", "--answers"} <= {o for a in train._actions for o in a.option_strings}


def test_every_option_with_a_default_states_it_once():
    """Each command's --help names the default of every option that has one, and no option's twice (serve's
    used to append argparse's "(default: None)" after the text's own)."""
    import argparse

    from triforce.launch.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in sub.choices.items():
        formatter = command._get_formatter()
        for action in command._actions:  # 0 and 0.0 are defaults to state, though they equal False
            if not action.option_strings or action.default is None or action.default is False or \
                    action.default == [] or action.default is argparse.SUPPRESS:
                continue
            text = formatter._expand_help(action) if action.help else ""
            assert text.count("default") == 1, (name, action.option_strings, text)
        assert "(default: None)" not in command.format_help(), name


def test_the_summary_starts_a_line_of_its_own_when_both_streams_share_a_file(target, tmp_path):
    """`triforce generate > log 2>&1`: the text's last newline reaches the file before the summary (stdout is
    block-buffered there; the summary ran onto the text)."""
    log = tmp_path / "log"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # buffered, as by default
    with log.open("w") as out:
        code = subprocess.run([sys.executable, "-m", "triforce", "generate", "--model", str(target), "--prompt", WORDS,
                               "--max-new-tokens", "4", "--mode", "ar", "--dtype", "float32"], stdout=out,
                              stderr=subprocess.STDOUT, env=env).returncode
    assert code == 0, log.read_text()
    assert log.read_text().splitlines()[-1].startswith("[ar] prompt")


@pytest.mark.parametrize("output, unbuffered", [("text", True), ("json", False)])  # a stream, a last print
def test_a_reader_that_leaves_early_ends_the_command_quietly(target, unbuffered, output):
    """`triforce generate ... | head -c 20` printed a 30-line BrokenPipeError traceback."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    run = subprocess.Popen([sys.executable, "-m", "triforce", "generate", "--model", str(target), "--prompt", WORDS,
                            "--max-new-tokens", "40", "--mode", "ar", "--dtype", "float32",
                            *(["--json"] if output == "json" else [])],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    run.stdout.close()  # the reader is gone before the first token
    err = run.stderr.read()
    assert run.wait(120) == 141 and "Traceback" not in err and "Error" not in err, err


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
@pytest.mark.parametrize("output, stdout, why", [("text", "full", "No space left on device"),
                                                 ("json", "full", "No space left on device"),
                                                 ("json", "closed", "standard output is closed")])
def test_an_output_that_cannot_be_written_is_one_line_not_a_traceback(target, output, stdout, why):
    """`triforce generate > /dev/full` (a disk full) printed an OSError traceback, twice: once from the
    command, once from the flush at exit; with stdout closed (`>&-`), an AttributeError traceback."""
    with open("/dev/full", "w") as full:
        run = subprocess.run([sys.executable, "-m", "triforce", "generate", "--model", str(target), "--prompt", WORDS,
                              "--max-new-tokens", "4", "--mode", "ar", "--dtype", "float32",
                              *(["--json"] if output == "json" else [])],
                             stdout=full, stderr=subprocess.PIPE, text=True, timeout=120,
                             preexec_fn=(lambda: os.close(1)) if stdout == "closed" else None)
    assert run.returncode == 1 and run.stderr.strip() == f"triforce: error: cannot write the output: {why}", run.stderr


def test_ctrl_c_while_the_command_loads_exits_130_without_a_traceback(target):
    """A Ctrl-C in the first second, while torch imported, printed the import's traceback (the package's
    __init__ loaded the API before the command's Ctrl-C handling ran), aborted in torch's C++ (status -6),
    or was swallowed by an import it left half made: the command then failed with "cannot read the
    tokenizer" (exit 2)."""
    import signal
    import time

    for delay in (0.2, 0.35, 0.5, 0.8):  # (torch takes a second or more to import)
        run = subprocess.Popen([sys.executable, "-m", "triforce", "generate", "--model", str(target), "--prompt",
                                WORDS, "--max-new-tokens", "150", "--mode", "ar"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # (xdist's
        time.sleep(delay)  # workers ignore it, and so would the child)
        run.send_signal(signal.SIGINT)
        out, err = run.communicate(timeout=120)
        assert run.returncode in (130, -signal.SIGINT) and "Traceback" not in err and "error" not in err, \
            (delay, run.returncode, err)  # (-2: a loaded machine started Python after the signal)


SWALLOWING_COMMAND = """
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # (xdist's workers ignore it, and so would this child)
import triforce.__main__ as entry
import triforce.launch.cli as cli

class Freed:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # the Ctrl-C lands here, in a finalizer

def command(argv=None):
    Freed()
    for _ in range(100):
        time.sleep(0.01)
    print("ran to its end", file=sys.stderr)
    return 0

cli.main = command
sys.exit(entry.main())
"""


def test_a_ctrl_c_that_a_finalizer_swallows_still_ends_the_command_with_130():
    """A Ctrl-C that lands in a finalizer (a __del__ as a tensor or socket is freed) printed "Exception
    ignored in" and was lost: the command ran on to its end and exited 0."""
    run = subprocess.run([sys.executable, "-c", SWALLOWING_COMMAND, "generate"], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 130 and "ran to its end" not in run.stderr and "Traceback" not in run.stderr, \
        (run.returncode, run.stderr)


def test_a_prompt_from_standard_input_or_a_file_with_a_byte_order_mark_is_the_same_prompt(capsys, target, tmp_path,
                                                                                           monkeypatch):
    """--prompt-file - read a file named "-"; a UTF-8 byte-order mark was kept as text (3 more tokens)."""
    import io

    args = ["--model", target, "--max-new-tokens", 3, "--mode", "ar", "--dtype", "float32", "--json", "--temperature", 0]
    plain = json.loads(run_cli(capsys, *args, "--prompt", WORDS)[1])
    marked = tmp_path / "bom.txt"
    marked.write_bytes(b"\xef\xbb\xbf" + WORDS.encode())
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"\xef\xbb\xbf" + WORDS.encode())))
    for source in (marked, "-"):
        code, out, err = run_cli(capsys, *args, "--prompt-file", source)
        assert code == 0, err
        assert json.loads(out)["prompt_tokens"] == plain["prompt_tokens"] and \
            json.loads(out)["token_ids"] == plain["token_ids"], source
    code, out, err = run_cli(capsys, *args, "--prompt", "w5 \udcff w6")  # how Python hands over bytes not UTF-8
    assert code == 2 and err.strip() == "triforce: error: --prompt is not valid UTF-8 text"


def test_every_text_file_a_user_gives_is_read_without_its_byte_order_mark(tmp_path, monkeypatch):
    """A schema, grammar, chat template, bench text, draft-training text or batch input from an editor that
    writes a UTF-8 byte-order mark reads as the same text without it (files.read_user_text): the bench and
    train-draft kept it as the text's first character (tokens of the first prompt), a schema file with one
    was no JSON."""
    import triforce.launch.generate as generate_module
    from triforce.draft.data import read_texts
    from triforce.launch.bench import _read_text
    from triforce.launch.flags import read_chat_template

    def marked(name, text):
        path = tmp_path / name
        path.write_bytes(b"\xef\xbb\xbf" + text.encode())
        return str(path)

    schema, template, prose = '{"type": "object"}', "{{ messages[0]['content'] }}", "It is a truth universally"
    args = build_parser().parse_args(["generate", "--prompt", "hi", "--json-schema", marked("s.json", schema)])
    assert generate_module.structured_outputs(args).json == schema
    assert read_chat_template(marked("t.jinja", template)) == template
    assert _read_text(marked("emma.txt", prose)) == prose
    assert read_texts([marked("draft.txt", prose)]) == [prose]


def test_ctrl_c_while_streaming_ends_the_text_with_a_newline(capsys, target, monkeypatch):
    def interrupted(self, prompt, params, stream=None, **kwargs):
        stream("some text")
        raise KeyboardInterrupt

    monkeypatch.setattr(api.LLM, "generate", interrupted)
    code, out, err = run_cli(capsys, "--model", target, "--prompt", WORDS, "--mode", "ar")
    assert code == 130 and out == "some text\n" and "Traceback" not in err


def test_ctrl_c_is_130_where_the_output_fails_too(target, monkeypatch):
    """The newline written after Ctrl-C, where the output cannot take it, turned the Ctrl-C into 'cannot write
    the output' and exit 1."""
    import errno
    import io

    class Full(io.StringIO):
        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

    def interrupted(self, prompt, params, stream=None, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(api.LLM, "generate", interrupted)
    monkeypatch.setattr(sys, "stdout", Full())
    assert main(["generate", "--model", str(target), "--prompt", WORDS, "--mode", "ar"]) == 130


def test_errors_name_the_flags_not_the_api_fields(capsys, target):
    """"max_tokens must be ..." answered --max-new-tokens -1."""
    code, _, err = run_cli(capsys, "--model", target, "--prompt", WORDS, "--min-tokens", 10, "--max-new-tokens", 4)
    assert code == 2 and err.strip().startswith("triforce: error: --min-tokens must be an integer from 0 to "
                                                "--max-new-tokens"), err
    code, _, err = run_cli(capsys, "--model", target, "--prompt", WORDS, "--gamma1", 0)
    assert code == 2 and "--gamma1 and --gamma2 must be" in err
    from triforce.config import ConfigError
    from triforce.launch.cli import settings_named_by_flags

    with pytest.raises(ConfigError) as raised, settings_named_by_flags():  # paths, quotes, words and fields
        raise ConfigError("top_k and gamma1 (got 'top_k' in /tmp/max_tokens/x.json; prompt_logprobs; window)")
    assert str(raised.value) == "--top-k and --gamma1 (got 'top_k' in /tmp/max_tokens/x.json; prompt_logprobs; window)"
    code, _, err = run_cli(capsys, "--model", target, "--prompt", WORDS, "--json-schema", "{bad")
    assert code == 2 and "error: --json-schema must be a JSON schema (an object)" in err, err  # (the field's name)
    with pytest.raises(ConfigError, match="^--regex: bad"), settings_named_by_flags():
        raise ConfigError("structured_outputs regex: bad")


@pytest.mark.parametrize("flag, value, message", [
    ("--temperature", "-1", "--temperature must be from 0"), ("--lookup", "-1", "--lookup must be an n-gram"),
    ("--budget", "0", "--budget (0) must be a multiple of the chunk size"), ("--window", "0", "--window must be >= 1"),
    ("--sinks", "-1", "--sinks must be >= 0 (got -1)"), ("--full-layers", "-1", "--full-layers must be >= 0"),
    ("--chunk-size", "0", "--chunk-size must be >= 1"),
    ("--allowed-token-id", "500", "--allowed-token-id names token 500, outside the vocabulary"),
    # the Python API's None is a flag left out: not said ("must be an integer >= 0 or None")
    ("--max-new-tokens", "-1", "--max-new-tokens must be an integer >= 0 (got -1"),
    ("--top-k", "-5", "--top-k must be an integer >= 1, or 0 or -1 for off (got -5)")])
def test_each_refused_setting_is_named_by_its_flag(capsys, target, flag, value, message):
    """Settings without an underscore (temperature, budget) were left bare, a token past the vocabulary was
    named by its API field, and one message named four settings for any one of them ("full_layers and sinks
    must be >= 0, window and prefill_chunk >= 1", --window 0)."""
    code, _, err = run_cli(capsys, "--model", target, "--prompt", WORDS, "--max-new-tokens", 2, flag, value)
    assert code == 2 and err.strip().startswith(f"triforce: error: {message}"), err


@pytest.mark.parametrize("workers", [[], ["--workers", "1"]])
def test_serve_refuses_a_negative_prefix_cache_by_its_flag(capsys, target, workers, monkeypatch):
    """Without --workers the LLM refuses it (it named prefix_cache_gb, the Python API's name); with them
    the workers' store was silently off."""
    from triforce.launch import with_workers
    from triforce.launch.with_workers import free_port

    monkeypatch.setattr(with_workers, "run_torchrun", lambda *args, **kwargs: 0)  # (a group that started: 0)

    assert main(["serve", "--model", str(target), *workers, "--port", str(free_port()), "--prefix-cache-gb", "-1"]) == 2
    assert "triforce: error: --prefix-cache-gb must be a number >= 0" in capsys.readouterr().err
    # and both a bound and vLLM's switch off (one would be ignored; with --workers the bound was, silently)
    assert main(["serve", "--model", str(target), *workers, "--port", str(free_port()), "--prefix-cache-gb", "2",
                 "--no-enable-prefix-caching"]) == 2
    assert "--no-enable-prefix-caching keeps no prompts for reuse, and --prefix-cache-gb 2" in capsys.readouterr().err


@pytest.mark.parametrize("mib", ["0", "-1", "nan", "inf", "1e303"])
def test_serve_refuses_a_request_size_bound_that_reads_no_body(capsys, target, monkeypatch, mib):
    monkeypatch.setattr(api.LLM, "__init__", lambda *a, **k: pytest.fail("the model loaded"))
    assert main(["serve", "--model", str(target), "--max-request-mb", mib]) == 2
    assert "--max-request-mb must be a positive number of MiB" in capsys.readouterr().err


def test_serve_on_a_port_in_use_is_one_line_before_the_model_loads(capsys, target, monkeypatch):
    """It said "serving ... at" and loaded the model, then uvicorn failed to bind and exited 3."""
    import socket

    monkeypatch.setattr(api.LLM, "__init__", lambda *a, **k: pytest.fail("the model loaded"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--model", str(target), "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"triforce: error: cannot listen on 127.0.0.1:{port}: Address already in use", err
    assert main(["serve", "--model", str(target), "--host", ""]) == 2  # an unset $HOST: not every interface
    assert "--host is empty" in capsys.readouterr().err
    for flags, said in ((["--port", "99999"], "--port must be from 1 to 65535 (got 99999)"),
                        (["--max-queue", "0"], "--max-queue must be >= 1 (got 0)")):  # (each its own: a port
        assert main(["serve", "--model", str(target), *flags]) == 2  # out of range named --max-queue too)
        assert capsys.readouterr().err.strip() == f"triforce: error: {said}"


def test_stop_strings_read_their_escapes_and_seed_minus_one_is_random():
    """`--stop '\\n'` stops at a newline, as llama.cpp reads it (it stopped at a backslash and an n); `--seed
    -1`, vLLM's and llama.cpp's spelling of no seed, draws a random one (it was the fixed seed -1)."""
    import numpy as np

    from triforce import SamplingParams
    from triforce.launch.generate import sampling_params

    args = build_parser().parse_args(["generate", "--prompt", "hi", "--stop", "\\n", "--stop", "a\\\\b",
                                      "--stop", "é\\t", "--stop", "\\begin{x}\\", "--seed", "-1"])
    params = sampling_params(args)  # (llama.cpp's escapes alone: any other backslash as written)
    assert params.stop == ("\n", "a\\b", "é\t", "\\begin{x}\\") and params.seed is None
    assert SamplingParams(seed=-1, n=2).seed is None and SamplingParams(seed=-2).seed == -2
    assert [c.seed for c in SamplingParams(seed=-2, n=3).choices()] == [-2, -1, 0]  # seed + i, -1 too
    ids = np.where(np.arange(6) % 2 == 0)[0]  # numpy's integers are token ids, as they are a prompt's
    params = SamplingParams(allowed_token_ids=ids, stop_token_ids=np.array([1]), logit_bias={np.int64(3): 1.0})
    assert list(params.allowed_token_ids) == [0, 2, 4] and list(params.stop_token_ids) == [1]
    assert dict(params.logit_bias) == {3: 1.0} and type(dict(params.logit_bias).popitem()[0]) is int


def test_serve_refuses_an_empty_api_key_before_the_model_loads(capsys, target, monkeypatch):
    """TRIFORCE_API_KEY= (a compose file's ${VAR} left unset) or --api-key "": the server required the
    header "Bearer " with nothing after it, and its banner said no key was needed."""
    from triforce.launch.with_workers import free_port

    monkeypatch.setattr(api.LLM, "__init__", lambda *a, **k: pytest.fail("the model loaded"))
    monkeypatch.setenv("TRIFORCE_API_KEY", "")
    assert main(["serve", "--model", str(target), "--port", str(free_port())]) == 2
    assert "the API key is empty" in capsys.readouterr().err
    monkeypatch.delenv("TRIFORCE_API_KEY")
    assert main(["serve", "--model", str(target), "--port", str(free_port()), "--api-key", " "]) == 2
    assert "the API key is empty" in capsys.readouterr().err
    monkeypatch.setenv("TRIFORCE_API_KEY", "secret\n")  # read from a file: HTTP strips the header's, no match
    assert main(["serve", "--model", str(target), "--port", str(free_port())]) == 2
    assert "begins or ends with whitespace" in capsys.readouterr().err


def test_serve_takes_the_model_as_vllm_serve_does(capsys, target, monkeypatch):
    """`triforce serve MODEL` as `vllm serve MODEL` (a vLLM launch line failed on it); the same model
    also as --model is fine, two different ones an error before anything loads. (The server's own end
    to end test, tests/serve/test_server.py, launches with the positional model.)"""
    from triforce.launch import flags

    monkeypatch.setattr(api.LLM, "__init__", lambda *a, **k: pytest.fail("the model loaded"))
    taken = []
    real = flags.take_model_tag
    monkeypatch.setattr("triforce.launch.cli.take_model_tag", lambda args: real(args) or taken.append(args.model))
    for other in ("smollm3", "smollm2"):  # smollm2, the default, given by name is given too
        assert main(["serve", str(target), "--model", other, "--port", "1"]) == 2
        assert capsys.readouterr().err.strip() == (f"triforce: error: the model is named twice: '{target}' and "
                                                   f"--model '{other}'; give one")
    assert main(["serve", str(target), "--model", str(target), "--port", "-1"]) == 2
    assert taken == [str(target)]


def test_an_inline_chat_template_reads_its_escapes_as_vllms_does(tmp_path):
    """vLLM decodes an inline --chat-template's escapes (a shell line writes a newline as \\n); a file's
    text is taken as it is."""
    from triforce.launch.flags import read_chat_template

    assert read_chat_template("{{ m }}\\n{{ 'é' }}") == "{{ m }}\n{{ 'é' }}"
    assert read_chat_template("{{ m }}\\\\n") == "{{ m }}\\n"
    (tmp_path / "t.jinja").write_text("{{ m }}\\n")
    assert read_chat_template(str(tmp_path / "t.jinja")) == "{{ m }}\\n"
    for bad, why in (("{{ m }}\\", "\\ at end of string"), ("{{ '\\x' }}", "truncated \\xXX escape")):
        with pytest.raises(UserError, match=f"--chat-template: a bad escape in the template's text: {re.escape(why)}"):
            read_chat_template(bad)  # (a traceback before)


def test_text_flags_that_are_not_utf8_are_refused_by_name(capsys):
    """Bytes the locale could not decode (a stop string, a banned word) reached the tokenizer and ended in
    a traceback: the flag is refused by name as it is parsed."""
    for flag in ("--stop", "--bad-word", "--regex", "--choice"):
        with pytest.raises(SystemExit) as done:
            main(["generate", "--prompt", "hi", flag, "ab\udcff"])
        err = capsys.readouterr().err
        assert done.value.code == 2 and f"argument {flag}" in err and "not valid UTF-8" in err and "Traceback" not in err


def test_a_schema_or_grammar_file_may_have_any_name_and_their_text_must_be_utf8(capsys, tmp_path, monkeypatch):
    """--json-schema and --grammar take a text or a file holding it: a file whose name is not UTF-8 is
    read (a Linux name may be any bytes), a text that is not UTF-8 refused by the flag's name."""
    import triforce.launch.generate as generate_module

    monkeypatch.setattr(generate_module, "llm_from_args", lambda args: pytest.fail("loaded"))
    odd = tmp_path / "schema-\udcff.json"
    odd.write_text('{"type": "object"}')
    args = build_parser().parse_args(["generate", "--prompt", "hi", "--json-schema", str(odd)])
    assert generate_module.structured_outputs(args).json == '{"type": "object"}'
    code, _, err = run_cli(capsys, "--model", "m", "--prompt", "hi", "--grammar", "root ::= \udcff")
    assert code == 2 and "--grammar: not valid UTF-8" in err
