"""`triforce batch` (launch/batch_jobs.py): OpenAI Batch API lines in, results out, against LLM.generate;
bad lines become error lines; a resumed run skips what is written; shards split the lines."""
import io
import json
from pathlib import Path

import pytest

from triforce import LLM, SamplingParams
from triforce.engine_args import MEMORY_SHARE
from triforce.errors import UserError
from triforce.launch.batch_output import append_result, locked
from triforce.launch.batch_jobs import request_lines
from triforce.launch.batch_shards import rank_device, shard_of
from triforce.launch.batch_resume import done_results, drop_results
from triforce.launch.cli import main

PROMPT = " ".join(f"w{3 + (5 * i) % 90}" for i in range(30))
TEMPLATE = "{% for m in messages %}w3 {{ m['content'] }} {% endfor %}{% if add_generation_prompt %}w4{% endif %}"


def request(custom_id, prompt, max_tokens, url="/v1/completions"):
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def run(target, inp, out, *extra):
    return main(["batch", "--input", str(inp), "--output", str(out), "--model", str(target), "--mode", "ar",
                 "--dtype", "float32", "--served-model-name", "tiny", "--batch-size", "2", *extra])


def results(path):
    return {r["custom_id"]: r for r in map(json.loads, path.read_text().splitlines())}


def test_batch_answers_each_line_and_resumes(tiny_dir, tmp_path):
    target = tiny_dir("batch-target", tokenizer=True, seed=91)
    prompts = {"a": PROMPT, "b": PROMPT + " w7", "c": " ".join(PROMPT.split()[:12])}
    lines = [request(k, p, 6) for k, p in prompts.items()]
    lines += ["{not json", request("d", PROMPT, 6, url="/v1/embeddings"),
              json.dumps({"custom_id": "e", "method": "POST", "url": "/v1/completions", "body": {"prompt": PROMPT,
                                                                                                "n": 0}})]
    sampled = {"prompt": PROMPT, "max_tokens": 6, "temperature": 0.8, "seed": 11, "n": 3}  # choices: seeds 11-13
    lines.append(json.dumps({"custom_id": "f", "method": "POST", "url": "/v1/completions", "body": sampled}))
    listed = {"prompt": [prompts["a"], prompts["c"]], "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    lines.append(json.dumps({"custom_id": "g", "method": "POST", "url": "/v1/completions", "body": listed}))
    asked = {"input": [{"role": "user", "content": "w5 w6"}], "max_output_tokens": 4, "temperature": 0}
    lines.append(json.dumps({"custom_id": "h", "method": "POST", "url": "/v1/responses", "body": asked}))
    lines.append(json.dumps({"custom_id": "i", "url": "/v1/completions", "body": {"prompt": PROMPT}}))  # no method
    tagged = {"prompt": PROMPT, "max_tokens": 2, "request_id": "mine"}  # (its body's id: two lines might share it)
    lines += [json.dumps({"custom_id": k, "method": "POST", "url": "/v1/completions", "body": tagged}) for k in "jk"]
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("\n".join(lines) + "\n")
    llm = LLM(target, mode="ar", dtype="float32")
    llm.tokenizer.chat_template = TEMPLATE
    llm.tokenizer.save_pretrained(target)  # the job's model has the template too
    expected = {k: llm.generate(p, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))[0].text
                for k, p in prompts.items()}
    choices = llm.generate([PROMPT] * 3, [SamplingParams(max_tokens=6, temperature=0.8, seed=s) for s in (11, 12, 13)])
    assert len({o.text for o in choices}) > 1  # the seeds differ
    out.write_text(json.dumps({"id": "batch_req_1", "custom_id": "b", "response": {"status_code": 200, "body": {}},
                               "error": None}) + "\n" + '{"id": "batch_req_2", "custom_id": "c", "resp')  # killed
    # mid-write: b done, c torn
    assert run(target, inp, out) == 0
    got = results(out)
    assert sorted(got) == ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "line-4"]
    assert len(out.read_text().splitlines()) == 12  # b kept once, the torn line gone
    assert "method POST" in got["i"]["error"]["message"] and got["i"]["response"] is None  # (run as POST before)
    assert got["j"]["response"]["body"]["id"] == got["k"]["response"]["body"]["id"] == "cmpl-mine"
    request_ids = [r["response"]["request_id"] for r in got.values() if r["response"] and "request_id" in r["response"]]
    assert len(request_ids) == len(set(request_ids)) > 2 and all(i.startswith("req_") for i in request_ids)
    for k in ("a", "c"):
        body = got[k]["response"]["body"]
        assert body["choices"][0]["text"] == expected[k] and body["model"] == "tiny" and got[k]["error"] is None
    assert got["b"]["response"]["body"] == {}  # not run again
    assert got["line-4"]["error"]["code"] == "invalid_json" and got["line-4"]["response"] is None
    assert "url" in got["d"]["error"]["message"] and got["d"]["response"] is None
    refused = got["e"]["response"]  # what the server answers: its status and error body, as OpenAI's batches
    assert got["e"]["error"] is None and refused["status_code"] == 400
    assert refused["body"]["error"]["message"] == "'n' must be an integer from 1 to 128"
    body = got["f"]["response"]["body"]
    assert [c["text"] for c in body["choices"]] == [o.text for o in choices]
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert body["usage"]["prompt_tokens"] == 30
    assert body["usage"]["completion_tokens"] == sum(len(o.token_ids) for o in choices)
    assert [c["text"] for c in got["g"]["response"]["body"]["choices"]] == [expected["a"], expected["c"]]
    answer = got["h"]["response"]["body"]
    ids = llm.tokenizer.apply_chat_template(asked["input"], add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    assert answer["object"] == "response" and answer["output"][0]["content"][0]["text"] == llm.generate(
        ids, SamplingParams(max_tokens=4, temperature=0))[0].text
    assert run(target, inp, out) == 0 and len(out.read_text().splitlines()) == 12  # all done: nothing added


def test_lines_python_reads_otherwise_than_json_get_their_errors_and_a_rerun_skips_them(tiny_dir, tmp_path):
    """A 5,000-digit integer and arrays nested past the recursion limit (json.loads raises a ValueError and a
    RecursionError, not a JSONDecodeError), NaN (a result that echoed it would be no JSON) and a url that is a
    list (an unhashable key) ended the whole job with a traceback, at the same line on every rerun."""
    target = tiny_dir("batch-target", tokenizer=True, seed=91)
    lines = ['{"custom_id": "big", "method": "POST", "url": "/v1/completions", "body": {"prompt": "w5", "seed": '
             + "7" * 5000 + "}}",
             "[" * 100000 + "]" * 100000,
             '{"custom_id": "nan", "method": "POST", "url": "/v1/completions", "body": {"prompt": "w5", '
             '"temperature": NaN}}',
             json.dumps({"custom_id": "listed", "method": "POST", "url": ["/v1/completions"], "body": {}}),
             request("good", PROMPT, 4)]
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("\n".join(lines) + "\n")
    for _ in range(2):  # and again: every line has its result
        assert run(target, inp, out) == 0
        got = results(out)
        assert sorted(got) == ["good", "line-1", "line-2", "line-3", "listed"]
        assert [got[k]["error"]["code"] for k in ("line-1", "line-2", "line-3", "listed")] == \
            ["invalid_json"] * 3 + ["invalid_request"]
        assert "NaN is not a JSON number" in got["line-3"]["error"]["message"]
        assert got["good"]["response"]["status_code"] == 200


def test_a_line_holding_unicode_line_breaks_is_one_request(tiny_dir, tmp_path):
    """JSON strings may hold U+2028, U+2029 and U+0085 raw (json.dumps with ensure_ascii=False writes them
    so); str.splitlines broke such a line in two, each half an invalid_json error under a made-up id."""
    target = tiny_dir("batch-target", tokenizer=True, seed=91)
    line = json.dumps({"custom_id": "one\u2028line\u2029of\u0085json", "method": "POST", "url": "/v1/completions",
                       "body": {"prompt": PROMPT, "max_tokens": 2, "temperature": 0}}, ensure_ascii=False)
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text(line + "\r\n" + request("after", PROMPT, 2) + "\n", encoding="utf-8")
    assert run(target, inp, out) == 0
    got = results(out)
    assert sorted(got) == ["after", "one\u2028line\u2029of\u0085json"]
    assert all(r["error"] is None and r["response"]["status_code"] == 200 for r in got.values())
    assert run(target, inp, out) == 0 and len(out.read_text().splitlines()) == 2  # resumed: nothing added


def test_an_output_that_is_not_a_results_file_and_repeated_ids_are_refused_untouched(tiny_dir, tmp_path, capsys):
    """The input as the output (its request lines would read as done), a file of other text (its last line,
    unterminated, read as torn), a missing folder and a custom_id on two lines: one-line errors before
    anything runs, and the files as they were."""
    target = tiny_dir("batch-target", tokenizer=True, seed=91)
    inp, notes = tmp_path / "in.jsonl", tmp_path / "notes.txt"
    inp.write_text(request("a", PROMPT, 2) + "\n")
    notes.write_text("my notes\nthe last line, unterminated")
    note = tmp_path / "note.txt"
    note.write_text("one line, unterminated")  # all of it read as torn once, and emptied
    listed = tmp_path / "listed.jsonl"  # (a list's custom_id: an unhashable-type traceback)
    listed.write_text(json.dumps({"custom_id": ["a"], "response": None, "error": None}) + "\n")
    for out, message in ((inp, "is the --input file"), (notes, "not a results file"), (note, "not a results file"),
                         (listed, "not a results file"), (tmp_path / "none" / "out.jsonl", "no folder")):
        before = out.read_text() if out.exists() else None
        assert run(target, inp, out) == 2 and message in capsys.readouterr().err
        assert (out.read_text() if out.exists() else None) == before
    inp.write_text("\n".join([request("a", PROMPT, 2), request("b", PROMPT, 2), request("a", PROMPT, 3)]) + "\n")
    assert run(target, inp, tmp_path / "out.jsonl") == 2 and "'a' is on lines 1 and 3" in capsys.readouterr().err
    inp.write_text("\n".join([request("line-2", PROMPT, 2), json.dumps({"method": "POST"})]) + "\n")  # line 2's id
    assert run(target, inp, tmp_path / "out.jsonl") == 2
    assert "'line-2' on line 1 is the name of line 2, which has none" in capsys.readouterr().err
    assert not (tmp_path / "out.jsonl").exists()
    assert run(target, inp, "-") == 2 and "--output - : results go to a file" in capsys.readouterr().err


def test_shards_split_the_lines(tiny_dir, tmp_path):
    target = tiny_dir("batch-target", tokenizer=True, seed=91)
    inp = tmp_path / "in.jsonl"
    inp.write_text("\n\n".join(request(f"r{i}", PROMPT, 2) for i in range(5)) + "\n")  # (blank lines: not counted)
    for i in range(2):
        assert run(target, inp, tmp_path / f"out{i}.jsonl", "--shard", f"{i}/2") == 0
    assert sorted(results(tmp_path / "out0.jsonl")) == ["r0", "r2", "r4"]
    assert sorted(results(tmp_path / "out1.jsonl")) == ["r1", "r3"]
    # a shard holds other shards' requests by their custom_ids alone, and results by what a rerun reads of
    # them (each held the whole input parsed, and every answer's body, a few times the files' size)
    parsed = request_lines(inp.read_text().splitlines(), (1, 2))
    assert [(custom_id, request is not None) for _, custom_id, request, _ in parsed] == \
        [("r0", False), ("r1", True), ("r2", False), ("r3", True), ("r4", False)]
    done = done_results(tmp_path / "out0.jsonl")
    assert {r["response"]["status_code"] for r in done.values()} == {200}
    assert all(r["response"]["body"] == {"model": "tiny"} for r in done.values())
    assert shard_of(None, {"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_COUNT": "4", "RANK": "1"}) == (3, 4)
    assert shard_of(None, {"RANK": "1", "WORLD_SIZE": "2"}) == (1, 2) and shard_of(None, {}) == (0, 1)
    # an array numbered from 1 (--array=1-8): task 8 is the last shard, task 1 the first (task 8 was refused,
    # and shard 0 never ran)
    slurm = {"SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_COUNT": "8"}
    assert [shard_of(None, {**slurm, "SLURM_ARRAY_TASK_ID": t}) for t in ("1", "8")] == [(0, 8), (7, 8)]
    stepped = {"SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_STEP": "2", "SLURM_ARRAY_TASK_COUNT": "8"}  # 0-14:2
    assert shard_of(None, {**stepped, "SLURM_ARRAY_TASK_ID": "14"}) == (7, 8)
    with pytest.raises(UserError, match="I must be in"):
        shard_of("2/2")
    with pytest.raises(UserError, match="RANK/WORLD_SIZE 2/2: I must be in"):
        shard_of(None, {"RANK": "2", "WORLD_SIZE": "2"})
    # a task submitted again alone (--array=3) or a list (--array=3,5) cannot tell its shard: refused, where
    # it took every line (or the first half) and answered again what the other tasks answer
    again = {"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_MIN": "3", "SLURM_ARRAY_TASK_MAX": "3",
             "SLURM_ARRAY_TASK_COUNT": "1"}
    listed = {"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_MIN": "3", "SLURM_ARRAY_TASK_MAX": "5",
              "SLURM_ARRAY_TASK_COUNT": "2"}
    for env in (again, listed, {**stepped, "SLURM_ARRAY_TASK_ID": "3"}):
        with pytest.raises(UserError, match="pass --shard I/N"):
            shard_of(None, env)
    assert shard_of("3/8", again) == (3, 8)


def test_a_job_with_nothing_to_answer_says_so_without_loading_the_model(tiny_dir, tmp_path, capsys, monkeypatch):
    """An empty input, a shard past its lines, an output that answers them all: the model loaded, nothing was
    written and the job ended without a word."""
    import triforce.launch.batch_jobs as batch_jobs

    target = tiny_dir("batch-target", tokenizer=True, seed=91)
    monkeypatch.setattr(batch_jobs, "llm_from_args", lambda args: pytest.fail("the model loaded"))
    empty, inp, out = tmp_path / "empty.jsonl", tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    empty.write_text("")
    inp.write_text("\n".join(request(f"r{i}", PROMPT, 2) for i in range(2)) + "\n")
    out.write_text("".join(json.dumps({"id": f"batch_req_{i}", "custom_id": f"r{i}", "error": None,
                                       "response": {"status_code": 200, "body": {}}}) + "\n" for i in range(2)))
    for args, why in (((empty, tmp_path / "o.jsonl"), "--input holds no request"),
                      ((inp, tmp_path / "o.jsonl", "--shard", "2/3"), "this shard holds none of its 2 requests"),
                      ((inp, out), f"--output {out} answers every one of its 2 lines already")):
        assert run(target, *args) == 0
        assert capsys.readouterr().err.strip().endswith(f"batch: nothing to answer: {why}")
    import triforce.launch.with_workers as with_workers  # with a worker group: before it starts

    monkeypatch.setattr(with_workers, "launch_with_torchrun", lambda args: pytest.fail("the group started"))
    assert run(target, inp, out, "--workers", "1") == 0 and "nothing to answer" in capsys.readouterr().err


def test_a_shard_taken_from_the_environment_is_said(tiny_dir, tmp_path, capsys, monkeypatch):
    """A Slurm array over different input files, or a launcher's RANK and WORLD_SIZE, shards the input
    too: each task answered a part of its file, and said nothing; now it says which part, and why. A
    write that fails mid-job (a full disk) is one line, the results so far kept."""
    target = tiny_dir("batch-target", tokenizer=True, seed=91)
    inp = tmp_path / "in.jsonl"
    inp.write_text("\n".join(request(f"r{i}", PROMPT, 2) for i in range(4)) + "\n")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert run(target, inp, tmp_path / "out.jsonl") == 0
    assert "shard 1/2 only, from RANK and WORLD_SIZE" in capsys.readouterr().err
    assert sorted(results(tmp_path / "out.jsonl")) == ["r1", "r3"]
    assert run(target, inp, tmp_path / "all.jsonl", "--shard", "0/1") == 0
    assert "lines of shard" not in capsys.readouterr().err and len(results(tmp_path / "all.jsonl")) == 4
    monkeypatch.delenv("RANK")
    full = tmp_path / "full.jsonl"
    real_open = type(full).open

    class NoRoom:  # a full disk: a result's write fails
        def __init__(self, file):
            self.file = file

        def write(self, data):
            raise OSError(28, "No space left on device")

        def __getattr__(self, name):
            return getattr(self.file, name)

    def failing_open(path, mode="r", *args, **kwargs):
        file = real_open(path, mode, *args, **kwargs)
        return NoRoom(file) if path == full and mode == "a+b" else file

    monkeypatch.setattr(type(full), "open", failing_open)
    assert run(target, inp, full) == 2
    err = capsys.readouterr().err
    assert "No space left on device" in err and "a rerun resumes" in err and "Traceback" not in err


def test_a_job_killed_mid_run_and_restarted_answers_every_line_once(tiny_dir, tmp_path):
    """SIGKILL of a running `triforce batch` (no chance to clean up), then the same command again: every
    custom_id is in the output exactly once, each with the answer LLM.generate gives."""
    import signal
    import subprocess
    import sys
    import time

    target = tiny_dir("batch-target", tokenizer=True, seed=91)
    prompts = {f"r{i}": " ".join(PROMPT.split()[i % 7:]) for i in range(16)}
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("\n".join(request(k, p, 40) for k, p in prompts.items()) + "\n")
    argv = [sys.executable, "-m", "triforce", "batch", "--input", str(inp), "--output", str(out), "--model",
            str(target), "--mode", "ar", "--dtype", "float32", "--batch-size", "1"]
    log = tmp_path / "stderr.txt"
    with log.open("w") as stderr:
        job = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=stderr)
    deadline = time.monotonic() + 120  # a loaded machine starting torch (and CUDA) takes its time
    while not (out.exists() and out.read_text().count("\n") >= 3) and time.monotonic() < deadline:
        if job.poll() is not None and not (out.exists() and out.read_text().count("\n") >= 3):
            pytest.fail(f"the job ended before it was killed (exit {job.returncode}): {log.read_text()[-2000:]}")
        time.sleep(0.01)
    job.send_signal(signal.SIGKILL)
    job.wait()
    written = out.read_text().count("\n")
    assert 3 <= written < len(prompts)  # killed mid-run
    assert subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["custom_id"] for r in lines) == sorted(prompts)  # each exactly once
    llm = LLM(target, mode="ar", dtype="float32")
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    expected = dict(zip(prompts, (o.text for o in llm.generate(list(prompts.values()), params))))
    assert {r["custom_id"]: r["response"]["body"]["choices"][0]["text"] for r in lines} == expected


LONG = 400


def test_lines_run_on_a_continuous_batch_so_a_long_one_holds_back_none(tiny_dir, tmp_path):
    """--batch-size 2 with a long line first: each short line that ends makes room for the next, so all
    three are written before the long one (in lock-step groups of two, the second group waited for the
    long line, and was written after it); every answer is the line's own. `"stream": true` is a 400."""
    target = tiny_dir("batch-target", tokenizer=True, seed=91)
    # (400 tokens: the short lines are submitted from the main thread as the scheduler's thread decodes; with
    # 40, a loaded machine once let the long line end before the last short one was in)
    lines = [request("long", PROMPT, LONG)] + [request(f"s{i}", PROMPT + f" w{7 + i}", 2) for i in range(3)]
    streamed = {"prompt": PROMPT, "max_tokens": 2, "stream": True}
    lines.append(json.dumps({"custom_id": "stream", "method": "POST", "url": "/v1/completions", "body": streamed}))
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("\n".join(lines) + "\n")
    assert run(target, inp, out) == 0
    order = [json.loads(line)["custom_id"] for line in out.read_text().splitlines()]
    assert order[-1] == "long" and sorted(order[:-1]) == ["s0", "s1", "s2", "stream"]
    got = results(out)
    llm = LLM(target, mode="ar", dtype="float32")
    for k, prompt, n in (("long", PROMPT, LONG), ("s2", PROMPT + " w9", 2)):
        assert got[k]["response"]["body"]["choices"][0]["text"] == llm.generate(
            prompt, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True))[0].text
    refused = got["stream"]["response"]
    assert refused["status_code"] == 400 and refused["body"]["error"]["param"] == "stream"


def test_a_line_that_fails_as_it_runs_gets_its_error_and_the_others_their_answers(tiny_dir, tmp_path, monkeypatch,
                                                                                   capsys):
    """A line whose rules contradict each other after its first token (allowed_token_ids that a bad word
    rules out), and one whose caches cannot fit in memory even alone, fail as they run: each gets the status
    the server answers (400, 413) and the lines batched with them their answers (the job ended, and every
    rerun met the same line). Besides: a custom_id that is not a string, an input with a byte-order mark, an
    output that is no file."""
    target = tiny_dir("batch-target", tokenizer=True, seed=91)
    llm = LLM(target, mode="ar", dtype="float32")
    contradicting = {"prompt": PROMPT, "max_tokens": 4, "temperature": 0, "allowed_token_ids": [5, 6],
                     "bad_words": ["w6", "w5 w5"]}  # w5 first, then nothing left
    lines = [request("a", PROMPT, 6), json.dumps({"custom_id": "x", "method": "POST", "url": "/v1/completions",
                                                  "body": contradicting}),
             request("big", PROMPT, 200), request("b", PROMPT + " w7", 6),
             json.dumps({"custom_id": 7, "method": "POST", "url": "/v1/completions", "body": {"prompt": PROMPT}}),
             json.dumps({"custom_id": "", "method": "POST", "url": "/v1/completions", "body": {"prompt": PROMPT}})]
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("\n".join(lines) + "\n", encoding="utf-8-sig")  # as some editors save it
    room = (llm.cache_bytes_for(31, 6) + llm.cache_bytes_for(30, 200)) // 2  # "big" alone does not fit
    monkeypatch.setattr(LLM, "free_memory", lambda self: int(room / MEMORY_SHARE))
    assert run(target, inp, out) == 0
    got = results(out)
    assert sorted(got) == ["a", "b", "big", "line-5", "line-6", "x"]
    for k, prompt in (("a", PROMPT), ("b", PROMPT + " w7")):
        assert got[k]["response"]["body"]["choices"][0]["text"] == llm.generate(
            prompt, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))[0].text
    failed = {k: got[k]["response"] for k in ("x", "big")}
    assert failed["x"]["status_code"] == 400 and "contradict each other" in failed["x"]["body"]["error"]["message"]
    assert failed["big"]["status_code"] == 413 and "caches" in failed["big"]["body"]["error"]["message"]
    assert got["line-5"]["error"] == {"code": "invalid_request", "message": "line 5: custom_id must be a string"}
    assert got["line-6"]["error"] == {"code": "invalid_request", "message": "line 6: custom_id is empty"}
    assert run(target, inp, "/dev/null") == 2 and "is not a file" in capsys.readouterr().err


def test_a_rerun_refuses_results_of_lines_that_changed_or_are_gone(tiny_dir, tmp_path, capsys):
    """A result's id carries a hash of its line: a rerun after a line's body changed, or after a line added
    above lines without a custom_id shifted their numbers, is refused, naming them, before anything runs;
    the same requests written another way (keys in another order, spaces) are the same lines; equal lines
    still get ids of their own; an output written before ids carried the hash is resumed with a warning;
    answers by another model are refused. (A changed body kept its old answer, silently; a rerun with
    another model mixed its answers into the first one's.)"""
    target = tiny_dir("batch-target", tokenizer=True, seed=91)
    body = {"prompt": PROMPT, "max_tokens": 3, "temperature": 0, "ignore_eos": True}
    a = {"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": body}
    nameless = {"method": "POST", "url": "/v1/completions", "body": body}
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"

    def write_input(*requests):
        inp.write_text("".join(json.dumps(r) + "\n" for r in requests))

    write_input(a, nameless, nameless)
    assert run(target, inp, out) == 0
    written = out.read_text()
    ids = [results(out)[k]["id"] for k in ("line-2", "line-3")]
    assert ids[0] != ids[1] and ids[0][-32:] == ids[1][-32:]  # unique, and both name the same line
    inp.write_text(json.dumps(dict(reversed(a.items())), indent=1).replace("\n", "") + "\n"
                   + 2 * (json.dumps(nameless) + "\n"))
    assert run(target, inp, out) == 0 and out.read_text() == written  # the same requests: nothing to run
    write_input(a, nameless, nameless, nameless)  # a line added after the others: it runs
    assert run(target, inp, out) == 0 and sorted(results(out)) == ["a", "line-2", "line-3", "line-4"]
    written = out.read_text()
    capsys.readouterr()
    other = {**nameless, "body": {**body, "max_tokens": 5}}
    for requests, named, hint in (([{**a, "body": {**body, "max_tokens": 4}}, nameless, nameless, nameless], "a", ""),
                                  ([a, other, nameless, nameless, nameless], "line-2", "give them custom_ids"),
                                  ([{**a, "custom_id": "b"}, nameless, nameless, nameless], "a", "no longer in")):
        write_input(*requests)
        assert run(target, inp, out) == 2
        err = capsys.readouterr().err
        assert f"--input lines {named} " in err and f"--output {out}" in err and hint in err
        assert out.read_text() == written
    write_input(a, nameless, nameless, nameless)  # the same lines, answered by another model: refused
    assert run(target, inp, out, "--served-model-name", "other") == 2
    err = capsys.readouterr().err
    assert "answers by model 'tiny'" in err and "'other'" in err and out.read_text() == written
    old = "".join(json.dumps({**r, "id": r["id"][:-32]}) + "\n" for r in map(json.loads, written.splitlines()))
    out.write_text(old)  # as an earlier triforce wrote it: a uuid alone
    write_input({**a, "body": {**body, "max_tokens": 4}}, nameless, nameless, nameless)
    assert run(target, inp, out) == 0 and out.read_text() == old
    assert "4 results in --output" in capsys.readouterr().err


def test_vllms_serving_flags_bound_positions_seed_requests_and_name_themselves(tiny_dir, tmp_path, capsys):
    """--max-model-len bounds what a request may fill (the server's context-length answer); --seed makes
    unseeded samples repeat from run to run, also split in shards (each line's seed its own: equal lines
    differ); a bad --gpu-memory-utilization is an error that names it."""
    target = tiny_dir("batch-target", tokenizer=True, seed=91)
    body = {"prompt": PROMPT, "max_tokens": 8, "temperature": 1.0, "ignore_eos": True}
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": body}) + "\n"
                   + json.dumps({"custom_id": "b", "method": "POST", "url": "/v1/completions", "body": body}) + "\n")
    texts = []
    for name, extra in (("one", ["--seed", "3"]), ("two", ["--seed", "3"]), ("three", ["--seed", "4"])):
        assert run(target, inp, tmp_path / f"{name}.jsonl", *extra) == 0
        got = results(tmp_path / f"{name}.jsonl")
        texts.append([got[k]["response"]["body"]["choices"][0]["text"] for k in ("a", "b")])
    assert texts[0] == texts[1] != texts[2] and texts[0][0] != texts[0][1]
    for shard in ("0/2", "1/2"):  # each line draws its own seed: shards answer as one run does
        assert run(target, inp, tmp_path / "shards.jsonl", "--seed", "3", "--shard", shard) == 0
    got = results(tmp_path / "shards.jsonl")
    assert [got[k]["response"]["body"]["choices"][0]["text"] for k in ("a", "b")] == texts[0]
    assert run(target, inp, tmp_path / "short.jsonl", "--max-model-len", "35") == 0
    refused = results(tmp_path / "short.jsonl")["a"]["response"]
    assert refused["status_code"] == 400 and refused["body"]["error"]["code"] == "context_length_exceeded"
    assert "35" in refused["body"]["error"]["message"]
    capsys.readouterr()
    assert run(target, inp, tmp_path / "x.jsonl", "--gpu-memory-utilization", "2") == 2
    assert "--gpu-memory-utilization must be in (0, 1]" in capsys.readouterr().err


def test_vllms_launch_flags_are_taken(tiny_dir, tmp_path, capsys):
    """A vLLM launch line's flags (and run_batch's -i/-o): --no-enable-prefix-caching keeps no prompt for
    reuse (a repeated long prompt is prefilled again), --tensor-parallel-size 1 and the flags that change
    nothing run; a larger parallel size is refused, naming --workers."""
    target = tiny_dir("batch-target-1k", tokenizer=True, seed=91, max_position_embeddings=1024)
    body = {"prompt": " ".join([PROMPT] * 20), "max_tokens": 2, "temperature": 0}  # > one 512-token block
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"custom_id": k, "method": "POST", "url": "/v1/completions", "body": body})
                           + "\n" for k in ("a", "b")))
    cached = {}
    for name, extra in (("on", []), ("off", ["--no-enable-prefix-caching", "--tensor-parallel-size", "1",
                                             "--enforce-eager", "--trust-remote-code", "--disable-log-requests"])):
        assert run(target, inp, tmp_path / f"{name}.jsonl", "--batch-size", "1", *extra) == 0
        cached[name] = results(tmp_path / f"{name}.jsonl")["b"]["response"]["body"]["usage"][
            "prompt_tokens_details"]["cached_tokens"]
    assert cached == {"on": 512, "off": 0}
    assert main(["batch", "-i", str(inp), "-o", str(tmp_path / "short.jsonl"), "--model", str(target), "--mode", "ar",
                 "--dtype", "float32"]) == 0 and sorted(results(tmp_path / "short.jsonl")) == ["a", "b"]  # run_batch's
    capsys.readouterr()
    assert run(target, inp, tmp_path / "x.jsonl", "--tensor-parallel-size", "2") == 2
    assert "--tensor-parallel-size 2: this LLM runs in one process" in capsys.readouterr().err


def test_resuming_cuts_a_torn_line_in_place_and_ends_a_whole_one(tmp_path, monkeypatch):
    """What a kill mid-write leaves: the torn line is cut off in place (the file is not rewritten, which a
    second kill could have emptied), the lines before it untouched; a whole last line gets its newline."""
    out = tmp_path / "out.jsonl"
    first = json.dumps({"id": "batch_req_1", "custom_id": "a", "response": None, "error": {"code": "x"}})
    second = json.dumps({"custom_id": "b", "id": "batch_req_2", "response": None, "error": {"code": "x"}})
    out.write_text(first + "\n" + second)  # not as this command writes (it would be a torn one): another tool's
    assert set(done_results(out)) == {"a", "b"} and out.read_text() == first + "\n" + second + "\n"
    with out.open("a") as f:
        f.write('{"id": "batch_req_3", "custom_id": "c", "resp')
    monkeypatch.setattr(Path, "write_text", lambda *_, **__: pytest.fail("the output rewritten whole"))
    assert set(done_results(out)) == {"a", "b"} and out.read_text() == first + "\n" + second + "\n"
    # a line as this command writes it, whole but for its newline (an editor took it): kept, not cut as torn;
    # NUL bytes at the end (what a node that failed mid-write can leave): cut
    third = json.dumps({"id": "batch_req_3", "custom_id": "c", "response": None, "error": {"code": "x"}})
    with out.open("a") as f:
        f.write(third + "\0" * 9)
    assert set(done_results(out)) == {"a", "b", "c"}
    assert out.read_text() == first + "\n" + second + "\n" + third + "\n"
    with out.open("a") as f:
        f.write('{"id": "batch_req_4", "cus' + "\0" * 9)
    assert set(done_results(out)) == {"a", "b", "c"}
    assert out.read_text() == first + "\n" + second + "\n" + third + "\n"


def test_torchruns_ranks_each_take_the_gpu_of_their_local_rank(monkeypatch):
    """torchrun's ranks answering shards of one input, the device CUDA's default: each on its LOCAL_RANK's
    GPU (each loaded the model onto GPU 0), made current; a device named, or a CPU, as given."""
    import torch

    current = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    env = {"RANK": "6", "WORLD_SIZE": "8", "LOCAL_RANK": "2"}
    assert [rank_device(d, env) for d in (None, "cuda", "cpu", "cuda:1")] == ["cuda:2", "cuda:2", "cpu", "cuda:1"]
    assert current == [2, 2]
    assert rank_device(None, {"RANK": "0", "WORLD_SIZE": "1"}) is None  # no torchrun
    with pytest.raises(UserError, match="LOCAL_RANK 5: this process sees 4 CUDA GPUs"):
        rank_device(None, {**env, "LOCAL_RANK": "5"})
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # each process given its own GPU (srun)
    assert rank_device(None, {**env, "CUDA_VISIBLE_DEVICES": "3"}) is None and current == [2, 2]
    with pytest.raises(UserError, match="sees 1 CUDA GPUs"):  # four ranks on a node of one GPU: all on it
        rank_device(None, {**env, "LOCAL_WORLD_SIZE": "4"})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert rank_device(None, env) is None


def test_a_line_appended_after_a_writer_killed_mid_line_cuts_its_torn_line(tmp_path, capsys):
    """Shards sharing an output: one killed mid-line leaves a torn line, which the next append cuts (joined to
    it, the appended result was lost, and every rerun refused the file as no results file); a line whole but
    for its newline is ended; a torn line already joined to another (a writer that could not lock) is
    skipped, and said, and the requests of both run again."""
    out = tmp_path / "out.jsonl"

    def record(custom_id):
        return {"id": "batch_req_1", "custom_id": custom_id, "response": None, "error": {"code": "x"}}

    def written():
        return [json.loads(x)["custom_id"] for x in out.read_text().splitlines()]

    append_result(out, record("a"))
    with out.open("a") as f:
        f.write('{"id": "batch_req_2", "custom_id": "b", "resp')
    append_result(out, record("c"))
    assert written() == ["a", "c"]
    with out.open("a") as f:
        f.write(json.dumps(record("d")))
    append_result(out, record("e"))
    assert written() == ["a", "c", "d", "e"]
    with out.open("a") as f:
        f.write('{"id": "batch_req_5", "custom_id": "f", "resp' + json.dumps(record("g")) + "\n")
    append_result(out, record("h"))
    capsys.readouterr()
    assert set(done_results(out)) == {"a", "c", "d", "e", "h"}
    assert "1 torn results (lines 5: a writer cut off mid-line)" in capsys.readouterr().err


def test_retry_failed_rewrites_an_output_behind_a_link_keeping_its_mode(tmp_path, capsys):
    """--retry-failed rewrites the output whole: the file a link names, the link kept (it was replaced by a
    file of its own), and the file's mode kept (a group's shared output lost its group's write)."""
    real, out = tmp_path / "real.jsonl", tmp_path / "out.jsonl"
    out.symlink_to(real)
    for custom_id in "ab":
        append_result(out, {"id": "batch_req_1", "custom_id": custom_id, "response": None, "error": {"code": "x"}})
    real.chmod(0o664)
    drop_results(out, ["a"])
    assert out.is_symlink() and [json.loads(x)["custom_id"] for x in real.read_text().splitlines()] == ["b"]
    assert real.stat().st_mode & 0o777 == 0o664 and not list(tmp_path.glob("*.partial"))


def test_a_rerun_waits_for_a_process_writing_the_same_output(tmp_path):
    """Processes sharing an output (torchrun's ranks, each its shard) write each line under a lock: a rerun
    reading the output waits for a line being written, where it cut it as torn; a line written while the
    file is rewritten whole (--retry-failed) goes to the new file, where it was lost with the old one."""
    import threading

    out = tmp_path / "out.jsonl"
    record = {"id": "batch_req_1", "custom_id": "a", "response": None, "error": {"code": "x"}}
    line = (json.dumps(record) + "\n").encode()
    got = {}
    with locked(out) as f:
        f.write(line[:20])
        f.flush()
        reader = threading.Thread(target=lambda: got.update(done_results(out)))
        reader.start()
        reader.join(0.5)
        assert reader.is_alive()  # waiting for the lock
        f.write(line[20:])
    reader.join(10)
    assert set(got) == {"a"} and out.read_bytes() == line
    with locked(out):
        writer = threading.Thread(target=append_result, args=(out, {**record, "custom_id": "b"}))
        writer.start()
        writer.join(0.5)
        out.with_name("new").write_bytes(line)
        out.with_name("new").replace(out)
    writer.join(10)
    assert [json.loads(x)["custom_id"] for x in out.read_text().splitlines()] == ["a", "b"]


def test_retry_failed_runs_this_shards_failed_requests_again_once_the_checks_pass(tiny_dir, tmp_path, capsys):
    """--retry-failed removes this shard's failed results (an error, a status other than 200) from the output
    and runs their lines again; another shard's, in a shared output, stay for that shard; a run refused by
    its checks (a line changed since its result) leaves the file as it was."""
    from triforce.launch.batch_resume import result_id

    target = tiny_dir("batch-target", tokenizer=True, seed=91)
    lines = [request(f"r{i}", PROMPT, 2) for i in range(4)]
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("\n".join(lines) + "\n")

    def result(i, status, error=None, id_=None):
        return json.dumps({"id": id_ or result_id(lines[i]), "custom_id": f"r{i}", "error": error,
                           "response": None if error else {"status_code": status, "body": {}}}) + "\n"

    text = result(0, 404) + result(1, None, {"code": "x"}) + result(2, 200, id_="batch_req_" + "0" * 64) + \
        result(3, 500)
    out.write_text(text)
    assert run(target, inp, out, "--shard", "0/2", "--retry-failed") == 2
    assert "changed since" in capsys.readouterr().err and out.read_text() == text  # untouched
    text = text.replace("batch_req_" + "0" * 64, result_id(lines[2]))
    out.write_text(text)
    assert run(target, inp, out, "--shard", "0/2") == 0  # r2 answered, r0 failed: nothing to run, said
    assert "holds 1 failed requests' results" in capsys.readouterr().err and out.read_text() == text
    assert run(target, inp, out, "--shard", "0/2", "--retry-failed") == 0
    assert "removed the results of 1 failed requests" in capsys.readouterr().err
    got = results(out)
    assert [got[f"r{i}"]["response"] and got[f"r{i}"]["response"]["status_code"] for i in range(4)] == \
        [200, None, 200, 500]  # r1 and r3 are shard 1's
    assert len(out.read_text().splitlines()) == 4
    # a failed line mended runs again: a line that was not JSON (its error named by its number), then a body
    lines.append('{"custom_id": "r4", "method": "POST"')
    inp.write_text("\n".join(lines) + "\n")
    assert run(target, inp, out, "--shard", "0/2") == 0 and results(out)["line-5"]["error"]["code"] == "invalid_json"
    lines[4] = request("r4", PROMPT, -1)
    inp.write_text("\n".join(lines) + "\n")
    assert run(target, inp, out, "--shard", "0/2", "--retry-failed") == 0
    got = results(out)
    assert "line-5" not in got and got["r4"]["response"]["status_code"] == 400
    lines[4] = request("r4", PROMPT, 2)
    inp.write_text("\n".join(lines) + "\n")
    assert run(target, inp, out, "--shard", "0/2", "--retry-failed") == 0
    assert results(out)["r4"]["response"]["status_code"] == 200 and len(out.read_text().splitlines()) == 5
    lines.append("{not json")  # shard 1's failed line, then removed from the input: its result is removed
    inp.write_text("\n".join(lines) + "\n")  # too, also by a run with no line left to run
    assert run(target, inp, out, "--shard", "1/2") == 0 and "line-6" in results(out)
    inp.write_text("\n".join(lines[:5]) + "\n")
    assert run(target, inp, out, "--shard", "0/2", "--retry-failed") == 0
    assert "nothing to answer" in capsys.readouterr().err
    assert "line-6" not in results(out) and len(out.read_text().splitlines()) == 5


def test_a_request_that_fails_on_a_bug_gets_a_500_and_the_job_goes_on(tiny_dir, tmp_path, monkeypatch, capsys):
    """Any exception but a UserError as a line runs (a bug) is that line's 500, its traceback on standard
    error, and the job's exit status 1: the lines batched with it get their answers (the whole job ended
    with a traceback, at the same line on every rerun). --retry-failed runs it again. Input from standard
    input (-)."""
    from triforce.request import Request
    from triforce.serve import scheduler

    target = tiny_dir("batch-target", tokenizer=True, seed=91)
    lines = [request(k, PROMPT + extra, n) for k, extra, n in (("a", "", 4), ("bug", " w9", 5), ("b", " w7", 4))]
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("\n".join(lines) + "\n")
    starts = []

    def failing(fails, message):
        class Failing(Request):
            def run(self):
                starts.append(self.params.max_tokens)
                if fails(self.params):
                    raise RuntimeError(message)
                return (yield from super().run())
        return Failing

    monkeypatch.setattr(scheduler, "Request", failing(lambda p: p.max_tokens == 5, "boom"))  # the "bug" line's
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(inp.read_bytes())))
    assert run(target, "-", out, "--batch-size", "3") == 1
    err = capsys.readouterr().err
    assert "bug failed on an internal error" in err and "RuntimeError: boom" in err and "--retry-failed" in err
    got = results(out)
    assert [got[k]["response"]["status_code"] for k in ("a", "bug", "b")] == [200, 500, 200]
    assert "boom" in got["bug"]["response"]["body"]["error"]["message"]
    assert starts.count(5) == 2  # beside the others, then alone
    monkeypatch.setattr(scheduler, "Request", Request)
    assert run(target, inp, out) == 0 and results(out)["bug"]["response"]["status_code"] == 500  # kept
    assert run(target, inp, out, "--retry-failed") == 0
    assert len(out.read_text().splitlines()) == 3 and results(out)["bug"]["response"]["status_code"] == 200
    # a device or an engine that broke: every line would get its 500; three in a row end the job
    monkeypatch.setattr(scheduler, "Request", failing(lambda p: True, "device lost"))
    many = tmp_path / "many.jsonl"
    many.write_text("\n".join(request(f"m{i}", PROMPT, 2) for i in range(5)) + "\n")
    assert run(target, many, tmp_path / "broken.jsonl", "--batch-size", "1") == 2
    assert "3 requests in a row failed on internal errors" in capsys.readouterr().err
    assert len(results(tmp_path / "broken.jsonl")) == 3
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert run(target, "-", tmp_path / "o.jsonl") == 2  # each rank would read a part of one standard input
    assert "save it to a file" in capsys.readouterr().err


def test_a_line_whose_submission_fails_on_a_bug_gets_a_500_and_the_job_goes_on(tiny_dir, tmp_path, monkeypatch,
                                                                                capsys):
    """What LLM.generate did under its `except` (weighing a line's caches, reading the memory free) now runs
    as the line is submitted: a failure there ended the whole job with a traceback."""
    target = tiny_dir("batch-target", tokenizer=True, seed=91)
    lines = [request(k, PROMPT + extra, n) for k, extra, n in (("a", "", 4), ("bug", " w9", 5), ("b", " w7", 4))]
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("\n".join(lines) + "\n")
    weigh = LLM.cache_bytes_for

    def failing(self, length, max_tokens, *rest):
        if max_tokens == 5:
            raise RuntimeError("cannot weigh")
        return weigh(self, length, max_tokens, *rest)

    monkeypatch.setattr(LLM, "cache_bytes_for", failing)
    assert run(target, inp, out) == 1
    got = results(out)
    assert [got[k]["response"]["status_code"] for k in ("a", "bug", "b")] == [200, 500, 200]
    assert "cannot weigh" in capsys.readouterr().err


def test_batch_lays_chat_lines_out_by_the_chat_template_given(tiny_dir, tmp_path, capsys):
    """vLLM's --chat-template (a Jinja file, or the template's text): chat lines of a model without a
    template run with it; without it they are error lines; a file that cannot be read or a template that
    is not Jinja stops the job before the model loads."""
    target = tiny_dir("batch-no-template", tokenizer=True, seed=91)  # (another test gives batch-target one)
    chat = {"messages": [{"role": "user", "content": "w5 w6"}], "max_tokens": 3, "temperature": 0}
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text(json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": chat}))
    template = tmp_path / "chat.jinja"
    template.write_text(TEMPLATE)
    llm = LLM(target, mode="ar", dtype="float32")
    assert not llm.tokenizer.chat_template
    want = llm.chat(chat["messages"], SamplingParams(max_tokens=3, temperature=0), chat_template=TEMPLATE)[0]
    braced = tmp_path / "in{braces}"  # a file's name may hold braces: read as a file first, as vLLM's
    braced.mkdir()
    (braced / "chat.jinja").write_text(TEMPLATE)
    for given in (str(template), TEMPLATE, str(braced / "chat.jinja")):
        out.unlink(missing_ok=True)
        assert run(target, inp, out, "--chat-template", given) == 0
        body = results(out)["a"]["response"]["body"]
        assert body["usage"]["prompt_tokens"] == len(want.prompt_token_ids) == len(llm.encode("w3 w5 w6 w4"))
        assert body["choices"][0]["message"]["content"] == want.text
    out.unlink()
    assert run(target, inp, out) == 0
    assert "no chat template" in results(out)["a"]["response"]["body"]["error"]["message"]
    for bad, says in ((str(tmp_path / "nope.jinja"), "cannot read it (No such file or directory)"),
                      ("{% for m in %}", "not a Jinja template")):
        assert run(target, inp, tmp_path / "x.jsonl", "--chat-template", bad, "--model", "/nonexistent") == 2
        assert says in capsys.readouterr().err
    assert run(target, inp, tmp_path / "x.jsonl", "--chat-template", TEMPLATE, "--skip-tokenizer-init", "--model",
               "/nonexistent") == 2
    assert "--skip-tokenizer-init loads no tokenizer" in capsys.readouterr().err


def test_a_tokenizer_from_elsewhere_by_vllms_flags(tiny_dir, tmp_path):
    """--tokenizer (vLLM's, as for a GGUF file) gives a model folder without one its text prompts;
    --skip-tokenizer-init loads none, so a text line is an error line and a token-id line runs."""
    bare, tokenized = tiny_dir("batch-bare", seed=91), tiny_dir("batch-target", tokenizer=True, seed=91)
    ids = LLM(tokenized, mode="ar", dtype="float32").encode(PROMPT)
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text(request("text", PROMPT, 3) + "\n" + request("ids", ids, 3) + "\n")
    assert run(bare, inp, out, "--tokenizer", str(tokenized)) == 0
    got = results(out)
    assert got["text"]["response"]["body"]["choices"][0]["text"] == got["ids"]["response"]["body"]["choices"][0]["text"]
    assert got["text"]["response"]["body"]["choices"][0]["text"]  # text, which a model without a tokenizer has not
    out.unlink()
    assert run(tokenized, inp, out, "--skip-tokenizer-init") == 0
    got = results(out)
    assert "skip_tokenizer_init=True loaded no tokenizer" in got["text"]["response"]["body"]["error"]["message"]
    assert got["ids"]["response"]["status_code"] == 200
    asked = json.loads(request("ids", ids, 3))
    asked["body"]["return_token_ids"] = True  # the answer's ids, where there is no text
    inp.write_text(json.dumps(asked) + "\n")
    out.unlink()
    assert run(tokenized, inp, out, "--skip-tokenizer-init") == 0
    choice = results(out)["ids"]["response"]["body"]["choices"][0]
    want = LLM(tokenized, mode="ar", dtype="float32").generate([ids], SamplingParams(max_tokens=3, temperature=0,
                                                                                     ignore_eos=True))[0]
    assert choice["text"] == "" and choice["token_ids"] == want.token_ids and choice["prompt_token_ids"] == ids


def test_batch_refuses_a_blank_model_name_as_serve_does(tiny_dir, tmp_path, capsys):
    """--served-model-name " " was written into every result as the model; serve refused it. One rule now."""
    target = tiny_dir("batch-target", tokenizer=True, seed=91)
    inp = tmp_path / "in.jsonl"
    inp.write_text(request("a", PROMPT, 2) + "\n")
    for bad, needle in ((["--served-model-name", " "], "must not be blank"), (["--chat-max-tokens", "0"], ">= 1")):
        assert main(["batch", "--input", str(inp), "--output", str(tmp_path / "out.jsonl"), "--model", str(target),
                     *bad]) == 2
        assert needle in capsys.readouterr().err
    assert not (tmp_path / "out.jsonl").exists()


def test_a_start_that_fails_after_the_checks_of_the_output_leaves_no_file(tiny_dir, tmp_path, capsys):
    """An engine flag refused as the model loads (or a model not there) left an empty results file behind,
    as if the job had run; the output's folder is still checked before the model loads."""
    target = tiny_dir("batch-target", tokenizer=True, seed=91)
    inp = tmp_path / "in.jsonl"
    inp.write_text(request("a", PROMPT, 2) + "\n")
    out = tmp_path / "out.jsonl"
    assert run(target, inp, out, "--budget", "64") == 2  # (mode ar runs no retrieval tier)
    assert "--budget sets the retrieval tier" in capsys.readouterr().err and not out.exists()
    assert run(tmp_path / "no-model", inp, out) == 2 and not out.exists()
    assert run(target, inp, out) == 0 and set(results(out)) == {"a"}


def test_an_input_that_is_not_utf8_names_the_line(tiny_dir, tmp_path, capsys):
    """One bad byte failed the job with its offset in the file alone (and that offset counted from the last
    chunk read): in thousands of lines, the line is what finds it."""
    target = tiny_dir("batch-target", tokenizer=True, seed=91)
    inp = tmp_path / "in.jsonl"
    lines = [request(f"r{i}", PROMPT, 2).encode() for i in range(400)]
    lines[300] = lines[300].replace(b'"prompt": "', b'"prompt": "\xff')
    inp.write_bytes(b"\n".join(lines) + b"\n")
    assert run(target, inp, tmp_path / "out.jsonl") == 2
    assert capsys.readouterr().err.strip().endswith("invalid start byte (line 301)")
