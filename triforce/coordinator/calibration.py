"""What a machine learns once and keeps: a JSON file under `$TRIFORCE_HOME/calibration/`, read once per
process (costs.py: forward costs; priors.py: what earlier requests of `--mode auto` saw; proposer_weights.py:
what a forward of a proposing model and of its int8 twin took, whence the proposers' default weights).
TRIFORCE_CALIBRATION=FOLDER keeps them there instead (a calibration shared by a cluster's jobs, or a
test's own), and TRIFORCE_CALIBRATION=0 in this process's memory only.

Processes that run at once share the file: a save writes only the entries this process changed or
dropped, into what the file holds then (read again under a lock; `merged`: how a kind combines its entry
with the file's), and takes the rest from it. So a
long-lived server keeps what a bench measured meanwhile, and an entry one process dropped as stale
stays dropped until some process measures it again (writing the whole of what a process read at its
start, as before, lost the others' entries and brought dropped ones back).
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import os
from pathlib import Path

try:
    import fcntl
except ImportError:  # not POSIX: saves are still whole (os.replace), only not serialised
    fcntl = None

from ..config import is_number
from ..errors import UserError
from ..files import write_whole

log = logging.getLogger(__name__)
_FILES: dict[tuple[type, Path | None], "CalibrationFile"] = {}  # `default`'s, one per kind and path


class CalibrationFile:
    """A dict of entries kept in `path` (None: in memory only)."""

    filename: str  # each kind's own file, in calibration_folder()

    def __init__(self, path: Path | None = None):
        self.path = path
        self.entries: dict[str, dict] = {} if path is None else self._read(path)
        self._changed: set[str] = set()  # keys set or dropped here since the last save
        self._dropped: dict[str, dict] = {}  # keys `drop`ped here since the last save: what they held then
        self._save_failed = False

    def _read(self, path: Path, warn: bool = True) -> dict[str, dict]:
        """The file's valid entries ({} for a missing or unreadable one; `warn`: say what was left out)."""
        if not path.is_file():
            return {}
        try:
            entries = json.loads(path.read_text())
            if not isinstance(entries, dict):
                raise ValueError(f"a {type(entries).__name__}, not an object")
        except (OSError, ValueError):  # unreadable, not JSON, not UTF-8, not an object
            if warn:
                log.warning("ignoring unreadable calibration file %s", path)
            return {}
        valid = {key: value for key, value in entries.items() if self.valid(key, value)}
        if len(valid) < len(entries) and warn:  # a hand edit, another version's file: measured again
            log.warning("ignoring %d malformed entries of calibration file %s", len(entries) - len(valid), path)
        return valid

    @staticmethod
    def valid(key: str, value) -> bool:
        """Whether an entry read from the file has the shape this kind writes (each kind says)."""
        return True

    def merged(self, key: str, theirs: dict, ours: dict) -> dict:
        """Entry `key`, which this process changed, saved over the file's (each kind says how; here: ours
        whole)."""
        return ours

    def drop(self, key: str) -> None:
        """Drops entry `key` here and from the file, all but what another process set anew in it since this
        one read it (a cost size measured again: it was deleted, and measured yet again)."""
        self._dropped[key] = self.entries.pop(key)
        self.save(key)

    @staticmethod
    def pruned(entries: dict[str, dict]) -> dict[str, dict]:
        """What a save keeps of the entries (each kind says; here: all of them)."""
        return entries

    @classmethod
    def default(cls):
        """This process's file of this kind in calibration_folder() (read from disk once), or an in-memory
        one with TRIFORCE_CALIBRATION=0: either way a process learns a thing once."""
        folder = calibration_folder()
        path = None if folder is None else folder / cls.filename
        if (cls, path) not in _FILES:
            _FILES[cls, path] = cls(path)
        return _FILES[cls, path]

    def save(self, key: str) -> None:
        """Keeps entry `key` as this process has it now (set, changed, or dropped) in the file, with the
        file's other entries as other processes left them; this process then has those too."""
        if self.path is None:
            return
        self._changed.add(key)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self._locked():
                entries = self._read(self.path, warn=False)  # said once, as the process read it first
                for changed in self._changed:
                    if changed not in self.entries:  # dropped here, but for what another process set anew
                        theirs, dropped = entries.pop(changed, None), self._dropped.get(changed)
                        anew = {} if theirs is None or dropped is None else \
                            {k: v for k, v in theirs.items() if dropped.get(k) != v}
                        if anew:
                            entries[changed] = anew
                    else:
                        ours = self.entries[changed]
                        entries[changed] = ours if changed not in entries else self.merged(changed, entries[changed], ours)
                entries = self.pruned(entries)
                write_whole(self.path, json.dumps(entries, indent=0, sort_keys=True))  # also for readers without the lock
            self.entries, self._changed, self._dropped = entries, set(), {}
        except OSError as exc:
            if not self._save_failed:  # once: every later save fails the same way
                log.warning("cannot save %s (%s); it is kept in memory", self.path, exc)
            self._save_failed = True

    @contextlib.contextmanager
    def _locked(self):
        """Holds the file's lock (a `.lock` beside it) so that saves of processes running at once follow
        each other."""
        if fcntl is None:
            yield
            return
        with open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


def finite_numbers(value, low: float = 0.0, high: float = math.inf) -> bool:
    """A JSON object of finite numbers in [low, high): what calibration entries hold."""
    return isinstance(value, dict) and all(is_number(x) and low <= x < high for x in value.values())


def calibration_folder() -> Path | None:
    """Where calibration files are kept: TRIFORCE_CALIBRATION if it names a folder, None (memory only) if it
    is 0, else $TRIFORCE_HOME/calibration."""
    from ..models.folders import triforce_home

    chosen = os.environ.get("TRIFORCE_CALIBRATION")
    if chosen == "0":
        return None
    if chosen:
        return Path(chosen)
    try:
        return triforce_home() / "calibration"
    except UserError as exc:  # (no home: measured again in every process, as with a folder not writable)
        if not _SAID_NO_HOME:
            _SAID_NO_HOME.append(True)
            log.warning("calibration kept in memory only: %s", exc)
        return None


_SAID_NO_HOME: list[bool] = []
