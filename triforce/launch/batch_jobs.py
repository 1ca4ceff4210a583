"""`triforce batch`: OpenAI Batch API jobs from a JSONL file, for cluster batch jobs.

Each input line is `{"custom_id", "method": "POST", "url": "/v1/completions" | "/v1/chat/completions" |
"/v1/responses", "body"}`, each custom_id on one line only; each output line is `{"id", "custom_id",
"response": {"status_code", "request_id", "body"}, "error"}`, as OpenAI's: a body the server would refuse
(serve/openai.py and responses.py check it the same way) gets its status and error body as the response;
a line that is not a request (bad JSON, another url, `"stream": true`) gets `error` and a null response, or
a 400; a request that fails as it runs (its own settings: 400, or 413 for caches that cannot fit) gets its
error; a request that fails otherwise (a bug: any other exception) gets a 500 and its traceback on standard
error once it has failed again alone, and the job goes on (its exit status then 1). Up to `--batch-size`
requests run at a time on one continuous batch, as the server's (batch_runner.py: a request's prompts x `n`
choices as sequences of that batch; one that ends makes room for the next at once), and their results are
written as they end, not in the input's order (each names its custom_id). Each result
line is written whole, under a lock, and synced (batch_output.py), so a killed job loses at most the
requests in flight; run again, it skips the custom_ids the output already has (a torn last line, if the
kill came mid-write, is dropped first; an output that is not a results file is refused, untouched;
`--retry-failed` runs failed requests again), and refuses to go on where results answer lines that
changed since or are gone, or name another model (batch_resume.py). `--shard I/N` takes requests I, I + N,
... (default: the Slurm array task, else torchrun's rank and world size, else all; with --workers, where
torchrun's ranks are one pipeline, the Slurm array task, else all).
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import sys
from pathlib import Path

from tqdm import tqdm

from ..errors import UserError
from ..files import read_standard_input, read_user_text, user_path
from ..models.folders import probe_writes
from ..serve.fields import ApiError, request_json
from .cli import llm_from_args
from .batch_output import ResultsWriter
from .batch_shards import by_rank, rank_device, shard_of
from .batch_resume import check_resumable, done_results, drop_results, failed, jsonl_lines
from .generate import not_a_file
from .flags import (add_distributed_args, add_engine_args, add_mode_arg, add_model_args, add_serving_args,
                    check_serving_args)

URLS = {"/v1/completions": "completion", "/v1/chat/completions": "chat", "/v1/responses": "response"}


def add_batch_parser(p: argparse.ArgumentParser) -> None:
    p.description = __doc__.split("\n\n")[0] + " Output is distributed exactly as plain sampling from the target."
    p.add_argument("-i", "--input", required=True,
                   help="JSONL of requests (custom_id, method, url, body); - reads standard input")
    p.add_argument("-o", "--output", required=True,
                   help="JSONL of results, written as requests end; an existing one is resumed (processes "
                        "answering shards may share it: each line is written under a lock)")
    p.add_argument("--retry-failed", action="store_true",
                   help="remove the results of failed requests (an error, a status other than 200) from an "
                        "existing --output first, and run those requests again")
    p.add_argument("--shard", default=None, metavar="I/N",
                   help="take requests I, I+N, ... (blank lines not counted; default: a Slurm array task's "
                        "place in its array, counted from 0 whatever --array numbers it, of "
                        "SLURM_ARRAY_TASK_COUNT; else torchrun's RANK/WORLD_SIZE, but not under --workers, "
                        "whose ranks are one pipeline; else 0/1)")
    p.add_argument("--batch-size", type=int, default=8,
                   help="request lines in flight at a time, on one continuous batch: one that ends makes room "
                        "for the next (a line's prompts x n choices are that many sequences)")
    add_model_args(p)
    add_mode_arg(p)
    add_engine_args(p)
    add_serving_args(p)
    add_distributed_args(p)
    p.set_defaults(func=_batch, precheck=_precheck)


def request_lines(lines: list[str], shard: tuple[int, int] = (0, 1)) -> list[tuple[int, str, object, dict | None]]:
    """Each non-blank line as (its index, its custom_id: the line's own, else line-N, the parsed request or
    None, its error as a result's `error` ({code, message}: not JSON, a custom_id that is not a string) or
    None); the requests of other shards than `shard` (I, N: requests I, I + N, ...) without their parsed
    request, whose custom_id is all this process needs of them (every shard held the whole file parsed, a
    few times its size). A custom_id on two lines is a UserError (as OpenAI's Batch API refuses such a
    file: each result names its request by it)."""
    index, count = shard
    out, seen = [], {}
    for n, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            request, error = request_json(line), None
        except ApiError as exc:
            request, error = None, {"code": "invalid_json", "message": f"line {n + 1}: {exc.message}"}
        given = request.get("custom_id") if isinstance(request, dict) else None
        if given is not None and not isinstance(given, str):
            request, given = None, None
            error = {"code": "invalid_request", "message": f"line {n + 1}: custom_id must be a string"}
        if given == "":
            request = None
            error = {"code": "invalid_request", "message": f"line {n + 1}: custom_id is empty"}
        custom_id = given or f"line-{n + 1}"
        if custom_id in seen:
            first, named = seen[custom_id]
            if named and given is not None:
                raise UserError(f"custom_id {custom_id!r} is on lines {first + 1} and {n + 1}: each request needs "
                                "its own")
            shown, unnamed = (first, n) if named else (n, first)
            raise UserError(f"custom_id {custom_id!r} on line {shown + 1} is the name of line {unnamed + 1}, which "
                            "has none (a line without one goes by its number): give one of them another")
        seen[custom_id] = (n, given is not None)
        out.append((n, custom_id, request if len(out) % count == index else None, error))
    return out


def batch_plan(args) -> tuple[list[str], Path, list, dict, str, list[str]] | None:
    """What `batch` reads and checks before the model loads (with --workers, before the group starts):
    (the input's lines, the output, this shard's request lines, the results already written and to be kept,
    the model's name in results, the custom_ids whose failed results --retry-failed removes). Where it launches a worker group (--workers), whose rank 0 runs the job, an input that
    is not a regular file (standard input, a pipe) is left for rank 0 to read: the output alone is checked,
    and None returned."""
    launching = getattr(args, "workers", 0) > 0
    # torchrun's ranks (and the group this launches) are one pipeline, not shards of the input
    pipeline = launching or getattr(args, "worker_channel", None) is not None
    env = {k: v for k, v in os.environ.items() if not (pipeline and k in ("RANK", "WORLD_SIZE"))}
    index, count = shard_of(args.shard, env)
    if args.shard is None and count > 1 and not launching:  # (an array over different files: said, not silent)
        source = "SLURM_ARRAY_TASK_ID" if "SLURM_ARRAY_TASK_ID" in env else "RANK and WORLD_SIZE"
        print(f"batch: the lines of shard {index}/{count} only, from {source} (--shard 0/1 takes every line)",
              file=sys.stderr)
    if args.batch_size < 1:
        raise UserError("--batch-size must be >= 1")
    check_serving_args(args)
    if args.input == "-" and count > 1 and not pipeline:  # (a group's: rank 0 alone reads it, whole)
        raise UserError(f"--input - with shard {index}/{count}: each of the {count} processes would read a part of "
                        "one standard input; save it to a file")
    lines = None
    if not (launching and not_a_file(args.input)):
        try:
            lines = jsonl_lines(_input_text(args.input))
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"cannot read {args.input}: {exc}") from None
    if args.output == "-":  # (a file named "-" was written, and nothing said so)
        raise UserError("--output - : results go to a file, which a rerun resumes from; name one")
    output = user_path(args.output)
    if output.exists() and user_path(args.input).exists() and output.samefile(user_path(args.input)):
        raise UserError("--output is the --input file: results go to a file of their own")
    if not output.parent.is_dir():
        raise UserError(f"--output {output}: no folder {output.parent}")
    if output.exists() and not output.is_file():  # a pipe or a device: never read back, so never resumed
        raise UserError(f"--output {output} is not a file: results go to a file, which a rerun resumes")
    finished = done_results(output)
    every = None if lines is None else request_lines(lines, (index, count))  # (refused before the output is made)
    try:  # before the model loads, and without making the file (a start that then fails leaves none)
        output.open("a").close() if output.exists() else probe_writes(output.parent)
    except OSError as exc:
        raise UserError(f"cannot write --output {output}: {exc.strerror}") from None
    if every is None:
        return None
    mine = every[index::count]
    model = args.served_model_name or str(args.model)
    ours = {custom_id for _, custom_id, _, _ in mine}
    known = {custom_id for _, custom_id, _, _ in every}
    # this shard's failed results, and those of lines no longer in the input (a line mended since: a bad
    # JSON line's, named by its number, now by its custom_id)
    failures = [custom_id for custom_id, record in finished.items()
                if failed(record) and (custom_id in ours or custom_id not in known)]
    if failures and args.retry_failed:  # (removed from the file as the job starts: retried, mended or not)
        finished = {k: v for k, v in finished.items() if k not in failures}
    elif failures:
        print(f"batch: --output {output} holds {len(failures)} failed requests' results (an error, a status other "
              "than 200): --retry-failed runs them again", file=sys.stderr)
        failures = []
    check_resumable(output, lines, every, mine, finished, model)
    return lines, output, mine, finished, model, failures


def _input_text(path: str) -> str:
    """--input's text: a file, or standard input (`-`), UTF-8 with or without a byte-order mark."""
    return read_standard_input("request lines") if path == "-" else read_user_text(path)


def _precheck(args) -> int | None:
    """batch_plan before a worker group starts: 0 (the command's exit status) where there is nothing to answer."""
    plan = batch_plan(args)
    if plan is None or not _nothing_to_answer(*plan[:4]):
        return None
    if plan[5]:  # failed results to remove, and no line to run (rank 0 removes them otherwise)
        drop_results(plan[1], plan[5])
    return 0


def _nothing_to_answer(lines: list[str], output: Path, mine: list, finished: dict) -> bool:
    """True, and why said, where every line of this shard is answered already (or it has none): the model
    is then not loaded for nothing."""
    if any(custom_id not in finished for _, custom_id, _, _ in mine):
        return False
    requests = sum(1 for line in lines if line.strip())
    why = ("--input holds no request" if not requests else f"this shard holds none of its {requests} requests"
           if not mine else f"--output {output} answers every one of its {len(mine)} lines already")
    print(f"batch: nothing to answer: {why}", file=sys.stderr)
    return True


def _batch(args) -> int:
    lines, output, mine, finished, model, retried = batch_plan(args)
    if retried:  # (also where no line is left to run: the result of a line since removed)
        drop_results(output, retried)
    if _nothing_to_answer(lines, output, mine, finished):
        return 0
    if getattr(args, "worker_channel", None) is None and by_rank(args.shard):  # torchrun's ranks, each a shard
        args.device = rank_device(args.device)
    llm = llm_from_args(args)
    try:
        return _answer(args, llm, lines, output, mine, finished, model)
    except OSError as exc:  # a disk that filled, a file system that went away (also as the file closes)
        raise UserError(f"cannot write --output {output} ({exc.strerror or exc}): the results written so far "
                        "are kept, and a rerun resumes after them") from None


def _answer(args, llm, lines: list[str], output: Path, mine: list, finished: dict, model: str) -> int:
    """Answers this shard's lines not yet answered (batch_runner.py), each result written as it comes; the
    exit status: 1 where a request failed on an internal error, else 0."""
    from ..serve import openai, responses  # (here, as the runner: they load torch, which `batch --help`
    from .batch_runner import LineRunner, request_id, result  # and a job with nothing to answer need not)

    with tqdm(total=len(mine), desc="batch", unit="req", file=sys.stderr) as bar:
        write = ResultsWriter(output, bar)
        runner = LineRunner(llm, model, write, args.batch_size)
        try:
            for n, custom_id, request, error in mine:
                if custom_id in finished:
                    bar.update(1)
                    continue
                job = None
                if error is None and (not isinstance(request, dict) or request.get("method") != "POST" or
                                      not isinstance(request.get("url"), str) or request["url"] not in URLS):
                    error = {"code": "invalid_request", "message": f"line {n + 1}: each line needs method POST and "
                             "url /v1/completions, /v1/chat/completions or /v1/responses"}
                elif error is None:
                    kind, body = URLS[request["url"]], request.get("body")
                    try:
                        job = responses.parse(body, llm, model, args.chat_max_tokens) if kind == "response" else \
                            openai.parse(kind, body, llm, model, args.chat_max_tokens)
                    except openai.ApiError as exc:  # what the server answers it: a response with its status
                        error = {"status_code": exc.status, "request_id": request_id(), "body": exc.body()}
                    except Exception as exc:  # a bug: this line's 500, as the server's, and the job goes on
                        error = write.internal_error(custom_id, request_id(), exc)
                if job is None:  # a line that cannot run: its error, once
                    write(result(lines[n], custom_id, error) if "status_code" in error else
                          result(lines[n], custom_id, error=error))
                    continue
                if args.seed is not None and job.params.seed is None:  # its own, whatever runs before or beside it
                    job.params = dataclasses.replace(job.params, seed=line_seed(args.seed, custom_id))
                runner.run(lines[n], custom_id, job)
            runner.finish()
        finally:
            runner.close()
    return write.summary(output, len(mine) - sum(write.statuses.values()))


def line_seed(seed: int, custom_id: str) -> int:
    """The seed of a line without one under --seed: from --seed and its custom_id, so that shards, a resumed
    run and a line run again alone draw what an uninterrupted run draws, and equal lines differ."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{custom_id}".encode()).digest()[:7], "big")
