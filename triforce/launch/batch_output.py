"""How `triforce batch` writes its output: each result line appended whole, under an exclusive lock on the
file, and synced to the disk before the next request is counted done. Processes that share one output
(torchrun's ranks, each answering its shard into the same `--output`) thus never interleave their lines, a
rerun that cuts a torn line never cuts one another process is writing, and a node that fails (not only a
killed process) loses at most the line in flight: unsynced lines were lost with the page cache, or read
back as a run of NUL bytes."""
from __future__ import annotations

import errno
import json
import logging
import os
import sys
import traceback
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator

from tqdm import tqdm

from ..errors import UserError
from ..serve.fields import ApiError

try:
    import fcntl
except ImportError:  # (not on Windows: unlocked)
    fcntl = None

log = logging.getLogger("triforce")
_SAID: set[tuple[str, Path]] = set()  # (what, output) said once: a lock or a sync the file system refused
REOPENS = 100  # a file replaced this many times while waiting for its lock: a file system whose inode
# numbers are not stable (CIFS without serverino), taken as it is
INTERNAL_IN_A_ROW = 3  # requests failing on internal errors one after another that end a job
RESULT_ID_START = "batch_req_"
RESULT_START = '{"id": "' + RESULT_ID_START  # how every line this command writes begins


def _say_once(what: str, path: Path, exc: OSError) -> None:
    if (what, path) not in _SAID:
        _SAID.add((what, path))
        log.warning("cannot %s --output %s (%s): going on without", what, path, exc)


@contextmanager
def locked(path: Path) -> Iterator[BinaryIO]:
    """`path` opened to read and append (made where missing) and locked exclusively while the block runs.
    Where another process replaced the file while this one waited (a rerun's `--retry-failed` rewrites it
    whole), the new file is opened and locked instead. Where the file system cannot lock (NFS or Lustre
    mounted without flock), unlocked, said once: one process per output is then safe, several are not."""
    for attempt in range(REOPENS + 1):
        file = path.open("a+b")
        try:
            if fcntl is None or _lock(file, path) or attempt == REOPENS:
                break
        except BaseException:
            file.close()
            raise
        file.close()
    try:
        yield file
    finally:
        file.close()  # (releases the lock)


def _lock(file: BinaryIO, path: Path) -> bool:
    """Locks `file`; False where `path` names another file by the time the lock is taken."""
    try:
        fcntl.flock(file.fileno(), fcntl.LOCK_EX)
    except OSError as exc:  # (one process per output is then safe, several are not)
        _say_once("lock", path, exc)
        return True
    try:
        return os.path.samestat(os.fstat(file.fileno()), os.stat(path))
    except FileNotFoundError:
        return False


def append_result(path: Path, record: dict) -> None:
    """`record` as one line at the end of `path`, written whole and synced (OSError where it cannot be)."""
    line = (json.dumps(record) + "\n").encode()
    with locked(path) as file:
        end = file.seek(0, os.SEEK_END)
        if end and os.pread(file.fileno(), 1, end - 1) != b"\n":  # a writer killed mid-line, another shard's:
            file.seek(0)  # its torn line cut, which this line would otherwise join (and bar every rerun)
            mend_end(file, *whole_lines(file.read().decode()))
        file.write(line)
        synced(file, path)


def synced(file: BinaryIO, path: Path) -> None:
    """`file` (`path`'s) flushed and synced to the disk (OSError where it cannot be)."""
    file.flush()
    try:
        os.fsync(file.fileno())
    except OSError as exc:  # a file system that cannot sync (some FUSE or SMB mounts): written, unsynced
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
        _say_once("sync", path, exc)


def whole_lines(data: str) -> tuple[str, bool, int]:
    """(the whole lines of an output's `data`, with a newline each; whether the last one lacked it; how many
    characters at the end are cut: NUL bytes, and a torn line)."""
    kept = data.rstrip("\0")
    whole, torn = kept[: kept.rfind("\n") + 1], kept[kept.rfind("\n") + 1:]
    if torn and (not torn.startswith(RESULT_START[: len(torn)]) or result_line(torn) is not None):
        return whole + torn + "\n", True, len(data) - len(kept)  # a line (a result's, or one checked below)
    return whole, False, len(data) - len(whole)


def mend_end(file: BinaryIO, whole: str, ended: bool, cut: int) -> None:
    """The locked output `file` cut to its `whole` lines (whole_lines), in place (rewriting the file risked
    all of it), its last line ended where `ended`."""
    if cut:
        os.ftruncate(file.fileno(), len(whole.encode()) - ended)
    if ended:
        file.write(b"\n")


def result_line(line: str) -> dict | None:
    """The result an output's `line` holds (None: not a result)."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("custom_id"), str) and (
        "response" in record or "error" in record) else None  # (a list's: an unhashable-type traceback)


class ResultsWriter:
    """Writes result lines to --output as they come (batch_output.append_result), each a step of the
    progress bar, and counts them by status for the summary. INTERNAL_IN_A_ROW requests failing on internal
    errors one after another end the job (a UserError): a device or an engine that broke would otherwise
    answer every line left with a 500."""

    def __init__(self, output: Path, bar: tqdm):
        self.output, self.bar, self.statuses = output, bar, Counter()
        self.internal_in_a_row = 0

    def __call__(self, record: dict) -> None:
        append_result(self.output, record)
        status = record["response"]["status_code"] if record["response"] else "not a request"
        self.statuses[status] += 1
        self.bar.update(1)
        self.internal_in_a_row = self.internal_in_a_row + 1 if status == 500 else 0
        if self.internal_in_a_row == INTERNAL_IN_A_ROW:
            raise UserError(f"{INTERNAL_IN_A_ROW} requests in a row failed on internal errors (above): the job "
                            "stops, as a device or the engine may be broken; the results written so far are "
                            "kept, and a rerun with --retry-failed runs the failed ones again")

    def internal_error(self, custom_id: str, request_id: str, exc: Exception) -> dict:
        """A request's 500 response (the server's answer to a bug), its traceback on standard error."""
        self.bar.write(f"batch: {custom_id} failed on an internal error (a bug in triforce):\n" +
                       "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip(), sys.stderr)
        body = ApiError(500, f"internal error: {type(exc).__name__}: {exc}", "server_error").body()
        return {"status_code": 500, "request_id": request_id, "body": body}

    def summary(self, output: Path, before: int) -> int:
        """Says what this run wrote; the exit status (1 where a request failed on an internal error)."""
        counts = ", ".join(f"{v} {'status ' + str(k) if isinstance(k, int) else k}"
                           for k, v in sorted(self.statuses.items(), key=lambda kv: str(kv[0])))
        failed = sum(v for k, v in self.statuses.items() if k != 200)
        print(f"batch: {sum(self.statuses.values())} results written to {output} ({counts or 'none'}); "
              f"{before} answered before" + (". --retry-failed runs the failed ones again" if failed else ""),
              file=sys.stderr)
        return 1 if any(isinstance(k, int) and k >= 500 for k in self.statuses) else 0
