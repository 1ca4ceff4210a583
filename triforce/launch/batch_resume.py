"""Where a rerun of `triforce batch` picks up: the results an output already holds (a torn last line cut
off), and whether they still answer the input's lines. A result's id is OpenAI's `batch_req_` and 64 hex
digits: a random 32 (ids stay unique, also for equal lines) and the first 32 of a hash of the line it
answers (its JSON with keys in order; a line that is not JSON, as it is). A rerun refuses, before the model
loads, an output whose results answer lines that changed since (an edited body; lines without a
custom_id, which go by their numbers, shifted by a line added or removed above them) or lines no longer in
the input; results written before ids carried the hash (32 digits) are taken as they are, with a warning.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import sys
import uuid
from pathlib import Path

from ..errors import UserError
from ..files import written_whole
from .batch_output import RESULT_ID_START, RESULT_START, locked, mend_end, result_line, synced, whole_lines

HASH_DIGITS = 32
UUID_DIGITS = 32  # the random half, before the hash (alone, in ids of results written before)


def jsonl_lines(text: str) -> list[str]:
    """The lines of JSONL `text`, split at newlines alone (and CRLF): str.splitlines also splits at
    U+2028, U+2029 and U+0085, which JSON strings may hold raw (json.dumps with ensure_ascii=False writes
    them so), and cut such a request in two."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # what follows the last newline
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def line_hash(line: str) -> str:
    try:
        line = json.dumps(json.loads(line), sort_keys=True)
    except (ValueError, RecursionError):  # not JSON (a line that gets an invalid_json result): its own text
        pass
    return hashlib.sha256(line.encode()).hexdigest()[:HASH_DIGITS]


def result_id(line: str) -> str:
    """A new result's id for the input `line` it answers."""
    return f"{RESULT_ID_START}{uuid.uuid4().hex[:UUID_DIGITS]}{line_hash(line)}"


def done_results(output: Path) -> dict[str, dict]:
    """custom_ids already answered in `output`, each with its result line, read under the output's lock
    (batch_output.py). A torn last line (the start of a line this command writes, what a kill mid-write
    leaves) is cut off, as is a run of NUL bytes at the end (what a node that failed mid-write can leave),
    and said; a last line whole but for its newline is ended. A file that is not a results file (a line
    that is not a result) is a UserError, left as it is."""
    if not output.exists():
        return {}
    try:
        with locked(output) as file:
            file.seek(0)
            data = file.read().decode()
            whole, ended, cut = whole_lines(data)
            done = _results(output, whole)
            mend_end(file, whole, ended, cut)
    except UnicodeDecodeError as exc:
        raise UserError(f"cannot read --output {output}: {exc}") from None
    except OSError as exc:
        raise UserError(f"cannot read or write --output {output}: {exc.strerror or exc}") from None
    if cut:
        print(f"batch: cut {cut} characters off the end of --output {output} (a torn line or NUL bytes, what a "
              "kill or a failed node mid-write leaves; a torn line's request runs again)", file=sys.stderr)
    return done


def drop_results(output: Path, custom_ids: list[str]) -> None:
    """The results of `custom_ids` removed from `output` (--retry-failed, once the run's checks passed), the
    file rewritten whole under its lock: a process appending meanwhile (another shard's) waits for the
    lock, then opens the new file."""
    drop = set(custom_ids)
    try:
        with locked(output) as file:
            file.seek(0)
            whole, _, _ = whole_lines(file.read().decode())
            kept = [line + "\n" for line in jsonl_lines(whole) if line.strip() and
                    (result_line(line) or {}).get("custom_id") not in drop]
            target = output.resolve()  # (a link to the output stays one)

            def write(partial: Path) -> None:  # synced before it replaces the output, with the output's mode
                with partial.open("wb") as new:
                    new.write("".join(kept).encode())
                    shutil.copymode(target, partial)
                    synced(new, output)

            written_whole(target, write)
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot rewrite --output {output}: {exc}") from None
    print(f"batch: --retry-failed: removed the results of {len(drop)} failed requests from --output {output}, to "
          "run them again", file=sys.stderr)


def _results(output: Path, whole: str) -> dict[str, dict]:
    """The results of an output's `whole` lines by custom_id. A line that begins as a result and is not one
    is skipped, and said: a torn line another line was appended to (by a writer that could not lock the
    file, or one before 2026-12 that did not cut it); its request runs again, as does the joined one's."""
    done, torn = {}, []
    for n, line in enumerate(jsonl_lines(whole)):
        if not line.strip():
            continue
        record = result_line(line)
        if record is None and line.startswith(RESULT_START):
            torn.append(n + 1)
        elif record is None:
            raise UserError(f"--output {output} is not a results file (line {n + 1} is not a result line); "
                            "name a new file, or one an earlier run of this job wrote")
        else:
            done[record["custom_id"]] = _slim(record)
    if torn:
        print(f"batch: --output {output} holds {len(torn)} torn results (lines {_listed([str(n) for n in torn])}: a "
              "writer cut off mid-line): skipped, and the requests they answered run again", file=sys.stderr)
    return done


def _slim(record: dict) -> dict:
    """What a rerun reads of a result: its id, whether it failed, the model its answer names (whole bodies,
    logprobs and all, held for every line written were the output's size again in memory)."""
    response = record.get("response")
    if isinstance(response, dict):
        body = response.get("body")
        named = {"model": body["model"]} if isinstance(body, dict) and "model" in body else {}
        response = {"status_code": response.get("status_code"), "body": named}
    return {"id": record.get("id"), "custom_id": record["custom_id"], "error": record.get("error"),
            "response": response}


def failed(record: dict) -> bool:
    """Whether a result line is a failed request's: an error, or a response of a status other than 200."""
    response = record.get("response")
    return record.get("error") is not None or not isinstance(response, dict) or response.get("status_code") != 200


def _listed(names: list[str]) -> str:
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def check_resumable(output: Path, lines: list[str], every: list, mine: list, finished: dict[str, dict],
                    model: str) -> None:
    """Refuses (UserError) an output whose results answer lines other than the input's now, or name another
    model than `model` (the name this run's answers carry); `every` and `mine`: request_lines of the whole
    input and of this shard."""
    others = {}
    for custom_id, record in finished.items():
        response = record.get("response")
        body = response.get("body") if isinstance(response, dict) else None
        if isinstance(body, dict) and "model" in body and body["model"] != model:
            others.setdefault(str(body["model"]), []).append(custom_id)
    if others:
        named, names = next(iter(others.items()))
        raise UserError(f"--output {output} holds answers by model {named!r} (to lines {_listed(names)}), and "
                        f"this run's answers would name {model!r}: name a new --output, or run with the model "
                        "(or --served-model-name) that wrote them")
    known = {custom_id for _, custom_id, _, _ in every}
    gone = [custom_id for custom_id in finished if custom_id not in known]
    ids = {custom_id: str(record.get("id")) for custom_id, record in finished.items()}
    hashed = len(RESULT_ID_START) + UUID_DIGITS + HASH_DIGITS
    changed = [custom_id for n, custom_id, _, _ in mine if custom_id in ids and
               len(ids[custom_id]) == hashed and ids[custom_id][-HASH_DIGITS:] != line_hash(lines[n])]
    for names, what in ((changed, "changed since their results were written to"),
                        (gone, "are no longer in --input, though their results are in")):
        if names:
            shown = _listed(names)
            numbered = " (lines without a custom_id go by their numbers, which a line added or removed above " \
                       "them shifts: give them custom_ids)" if any(n.startswith("line-") for n in names) else ""
            raise UserError(f"--input lines {shown} {what} --output {output}{numbered}. Remove those results "
                            f"from --output to run them again, or name a new --output")
    old = sum(len(ids[custom_id]) != hashed for _, custom_id, _, _ in mine if custom_id in ids)
    if old:
        print(f"triforce: {old} results in --output {output} were written before results named their lines: "
              f"they are taken as they are, unchecked against --input", file=sys.stderr)
