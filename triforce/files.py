"""Files written whole or not at all; users' text files read alike."""
from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable
from pathlib import Path

from .errors import UserError

UNREADABLE = frozenset({errno.EIO, errno.ENXIO, errno.ESTALE})  # a system that cannot read a file, not damage


def written_whole(path: Path, write: Callable[[Path], None], durable: bool = False) -> None:
    """Runs `write(partial)` on a partial file of this process's, then renames it over `path`: a reader, or
    a process writing the same file at once, sees the old file or the new one, never half of one (a torn
    file failed every later run). `durable`: synced before the rename, so that it holds after the host
    crashes too (a renamed file could be empty then: a train-draft checkpoint was hours of training; files
    that can be made again, as calibrations, which requests save as they end, skip the wait). A write that
    fails leaves no partial file behind."""
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    try:
        write(partial)
        if durable:
            descriptor = os.open(partial, os.O_RDONLY)
            try:
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
        partial.replace(path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def write_whole(path: Path, text: str) -> None:
    """`text` into `path`, whole or not at all (`written_whole`)."""
    written_whole(path, lambda partial: partial.write_text(text))


def user_path(path: str | os.PathLike) -> Path:
    """`path` with a leading ~ or ~user expanded, as a shell does; left as written where it names no home
    (a user who does not exist, or no HOME: pathlib raised RuntimeError, a traceback past every caller's
    OSError), so that it is then a file that is not there."""
    try:
        return Path(path).expanduser()
    except RuntimeError:
        return Path(path)


def read_user_text(path: str | Path) -> str:
    """A user's text file (a prompt, a document to benchmark or train on, a schema, a grammar, a template):
    UTF-8 with or without a byte-order mark (Windows editors write one; kept, it was a character of the text,
    and tokens of the prompt). OSError or UnicodeDecodeError where it cannot be read, the latter naming its
    line (a byte's position alone did not find it in a batch file of thousands of lines)."""
    try:
        return user_path(path).read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:  # (its position counts from the file's last chunk read: no line in it)
        data = user_path(path).read_bytes()
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = data.count(b"\n", 0, exc.start) + 1
            exc.reason += f" (line {line})"
            raise exc from None
        raise


def read_standard_input(what: str) -> str:
    """Standard input's text (`-` for a file flag), UTF-8 with or without a byte-order mark; on a terminal,
    first a word that it is read (a pipe or a file says nothing), which a user waiting on the model missed."""
    if sys.stdin.isatty():
        print(f"triforce: reading {what} from standard input; end with Ctrl-D", file=sys.stderr)
    return sys.stdin.buffer.read().decode("utf-8-sig")


def load_cached(path: Path):
    """What `save_whole` wrote to `path` (torch.load, weights only), or None where there is no such file or
    it cannot be read: a host that failed before the file reached the disk can leave it empty or cut (the
    rename is not synced), and every later run failed on it with a traceback. A damaged file is said and
    removed, to be made again; one the system cannot read (no permission, an I/O error, a stale network
    handle) is a UserError, and kept (a draft's checkpoint of hours was removed so)."""
    if not path.is_file():
        return None
    import torch  # (here: the command line's --help and flags do without it)

    try:
        return torch.load(path, weights_only=True)
    except OSError as exc:
        if isinstance(exc, PermissionError) or exc.errno in UNREADABLE:
            raise UserError(f"cannot read {path} ({exc.strerror or exc})") from None
        damaged = exc  # torch's reader says EINVAL of a file cut short or ending in zeros
    except Exception as exc:  # (pickle, zip and torch raise many types for a damaged file)
        damaged = exc
    print(f"triforce: cannot read {path} ({type(damaged).__name__}: {damaged}); it is made again", file=sys.stderr)
    path.unlink(missing_ok=True)
    return None


def save_whole(path: Path, obj) -> None:
    """`torch.save(obj)` into `path`, whole or not at all, and synced (`written_whole`: checkpoints and cached
    data that took long to make)."""
    import torch

    written_whole(path, lambda partial: torch.save(obj, partial), durable=True)
