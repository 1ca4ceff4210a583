"""Diverse text already on the machine, with no download: the source code and documentation of the
Python standard library and the installed packages.

Files are picked deterministically (sorted paths, a hash decides the split), so the same installation
gives the same data. A whole top-level package (or standard-library module) is either trained on or held
out, so the held-out code is code the draft never saw.
"""
from __future__ import annotations

import hashlib
import random
import sysconfig
from collections.abc import Iterator
from pathlib import Path

SUFFIXES = (".py", ".md", ".rst", ".txt")
MIN_CHARS, MAX_CHARS = 1_000, 200_000  # file sizes read
PER_FILE_CHARS = 16_000  # taken from the start of a file, so that many files contribute
HELDOUT_BUCKETS = 10  # one package in ten is held out
# tests, caches, and other installations nested in a root (the standard library's own site-packages), and
# vendored copies of other packages (pip/_vendor/distlib trained on what distlib, held out, holds)
SKIPPED = {"test", "tests", "__pycache__", "site-packages", "dist-packages", "_vendor", "vendor", "_vendored"}
METADATA = (".dist-info", ".egg-info")  # licenses and records, not code or documentation
# which files are picked, as a cached selection's name holds it: rules changed, the selection is made again
SELECTION = (SUFFIXES, MIN_CHARS, MAX_CHARS, PER_FILE_CHARS, HELDOUT_BUCKETS, sorted(SKIPPED), METADATA)


def roots() -> list[Path]:
    """The standard library and the folders packages are installed in, each once."""
    paths = sysconfig.get_paths()
    found = []
    for key in ("stdlib", "purelib", "platlib"):
        p = Path(paths[key]).resolve()
        if p.is_dir() and p not in found:
            found.append(p)
    return found


def _package(root: Path, path: Path) -> str:
    return path.relative_to(root).parts[0]


def _heldout(package: str) -> bool:
    return int(hashlib.sha1(package.encode()).hexdigest(), 16) % HELDOUT_BUCKETS == 0


def _candidates(root: Path):
    for path in sorted(root.rglob("*")):
        parts = path.relative_to(root).parts
        if path.suffix not in SUFFIXES or any(p in SKIPPED or p.endswith(METADATA) for p in parts):
            continue
        try:
            size = path.stat().st_size
        except OSError:
            continue
        if MIN_CHARS <= size <= MAX_CHARS:
            yield path


def installed_texts(heldout: bool = False, seed: int = 0) -> Iterator[str]:
    """The start of each eligible file, in a seeded random order (so that many packages contribute),
    from the training packages or the held-out ones. Unreadable or non-UTF-8 files are skipped."""
    eligible = [p for root in roots() for p in _candidates(root) if _heldout(_package(root, p)) == heldout]
    random.Random(seed).shuffle(eligible)
    for path in eligible:
        try:
            yield path.read_text(encoding="utf-8")[:PER_FILE_CHARS]
        except (OSError, UnicodeDecodeError):
            continue
