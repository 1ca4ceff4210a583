"""The model folders under $TRIFORCE_HOME (default ~/.cache/triforce): where they go, made once however many
processes want one at a time (torchrun's ranks on a node, batch jobs started together, test workers take
turns on a lock file beside it: the first makes it, the rest find it), converted from a GGUF tensor by
tensor and published once it loads, readable by others (a shared home), and mended once where an earlier
triforce left them otherwise. hub.py decides which model a name means; this module makes its folder.
"""
from __future__ import annotations

import glob
import hashlib
import logging
import os
import shutil
import socket
import sys
import threading
import tempfile
from collections.abc import Callable
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: processes making one model at once are not kept apart
    fcntl = None

from .config import GENERATION_CONFIG, ModelLoadError

log = logging.getLogger(__name__)
READY = ".triforce-ready"  # written last: a folder without it is an interrupted conversion
MENDED = ".triforce-mended-4"  # a converted GGUF's folder given what earlier conversions left out (once)


def triforce_home() -> Path:
    """$TRIFORCE_HOME, else ~/.cache/triforce; a UserError (ModelLoadError) where neither names a folder:
    HOME unset, and a user without a home (a container run as an arbitrary id): Path.home() raised
    RuntimeError, a traceback past every caller's."""
    chosen = os.environ.get("TRIFORCE_HOME")
    if chosen:
        return Path(chosen)
    try:
        return Path.home() / ".cache" / "triforce"
    except RuntimeError:
        raise ModelLoadError("no home folder to keep models, calibrations and drafts' work in (HOME is unset, "
                             "and this user has none): set TRIFORCE_HOME to a folder this user can write") from None


def probe_writes(folder: Path) -> None:
    """Raises the OSError that a write in `folder` meets, by making a file there and dropping it (os.access
    says yes to root where writes fail: a read-only mount, /proc)."""
    with tempfile.TemporaryFile(dir=folder):
        pass


def writable_folder(folder: Path) -> Path:
    """`folder`, made if missing; a ModelLoadError naming it where it cannot be (a file in the way, a
    read-only file system, no permission), with where TRIFORCE_HOME points."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe_writes(folder)
    except OSError as exc:
        raise ModelLoadError(f"cannot write in {folder} ({exc.strerror or exc}); TRIFORCE_HOME "
                             f"({triforce_home()}) must name a folder this user can write") from None
    return folder


def made_once(dest: Path, make: Callable[[], None]) -> Path:
    """Model folder `dest`, made by `make` unless it is ready. Processes that want it at once take turns on
    a lock file beside it (released with its process, should that die): the first makes it, the others
    find it ready."""
    if not (dest / READY).is_file():
        if dest.exists() and not dest.is_dir():
            raise ModelLoadError(f"{dest} is a file where the model's folder goes: move it away")
        writable_folder(dest.parent)
        lock = os.open(dest.with_name(dest.name + ".lock"), os.O_RDONLY | os.O_CREAT, 0o666)
        try:
            if _take_turn(lock, dest):  # none other makes it now: what killed makers left goes
                for stale in dest.parent.glob(f"{glob.escape(dest.name)}.partial*"):
                    shutil.rmtree(stale, ignore_errors=True)
            if not (dest / READY).is_file():
                make()
        finally:
            os.close(lock)  # releases the lock
    return dest


def _take_turn(lock: int, dest: Path) -> bool:
    """Waits for the lock on file descriptor `lock`; where the file system cannot lock, goes on without
    (False)."""
    if fcntl is None:
        return False
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"triforce: waiting for another process making {dest}", file=sys.stderr)
        fcntl.flock(lock, fcntl.LOCK_EX)
    except OSError as exc:  # e.g. NFS or Lustre mounted without flock
        log.warning("cannot lock %s (%s): going on without", dest, exc)
        return False
    return True


def partial_path(path: Path) -> Path:
    """Where this process (this thread) writes `path` before publishing it: a name of its own, so that makers
    who could not take turns (a file system without locks) never write into, or delete, each other's."""
    return path.with_name(f"{path.name}.partial-{socket.gethostname()}-{os.getpid()}-{threading.get_ident()}")


def convert_gguf_cached(gguf: Path) -> Path:
    stat = gguf.stat()
    key = hashlib.sha1(f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    dest = triforce_home() / "models" / f"gguf-{gguf.stem}-{key}"
    folder = up_to_date(made_once(dest, lambda: convert_gguf(gguf, dest)))
    return mended_once(folder, lambda: _mend_from_gguf(gguf, folder))


def mended_once(folder: Path, mend: Callable[[], bool]) -> Path:
    """`folder`, given by `mend` what conversions before these left out, once (a marker): reading a GGUF's
    metadata took seconds, a tokenizer a sixth of one, at every resolve. `mend` says whether it is done."""
    if not (folder / MENDED).is_file() and mend():
        try:
            (folder / MENDED).touch()
        except OSError:  # another user's folder: looked at again next time
            pass
    return folder


def _mend_from_gguf(gguf: Path, folder: Path) -> bool:
    """What conversions before these carried wrongly, taken from the GGUF: its RoPE scaling (the positions
    ran unscaled), its pre-tokenizer, its control tokens outside the byte alphabet. Whether all were looked
    at."""
    from gguf import GGUFReader

    from .gguf_convert import field_value, mend_rope_scaling, write_generation_config
    from .gguf_tokenizer import special_tokens_mended

    try:
        reader = GGUFReader(gguf)
        if mend_rope_scaling(reader, folder):
            log.warning("%s: the RoPE scaling of %s added to its config (converted before it was carried)", folder,
                        gguf.name)
    except (OSError, ValueError, TypeError) as exc:  # another user's folder in a shared home, a scaling not
        # carried (ModelLoadError): it runs as it did
        log.warning("cannot add %s's RoPE scaling to %s (%s)", gguf.name, folder, exc)
        return False
    try:
        if special_tokens_mended(folder, reader):
            write_generation_config(folder)  # (the end of sequence's id, named by its text, moved)
            log.warning("%s: its tokenizer now matches the control tokens of %s written outside the byte alphabet "
                        "whole (converted before they were kept)", folder, gguf.name)
    except (OSError, ValueError) as exc:  # another user's folder in a shared home: it runs as it did
        log.warning("cannot mend %s's tokenizer (%s)", folder, exc)
        return False
    return mend_tokenizer(folder, lambda: field_value(reader, "tokenizer.ggml.pre"))


def mend_tokenizer(folder: Path, pre: Callable[[], str | None]) -> bool:
    """Gives a folder converted before conversions set it the pre-tokenizer of its GGUF (`pre()`, its name
    there; gguf_tokenizer.mend_pre_tokenizer); whether it could look."""
    from .gguf_tokenizer import mend_pre_tokenizer

    try:
        if mend_pre_tokenizer(folder, pre()):
            log.warning("%s: its tokenizer now splits digits as its GGUF says (converted before that was kept)",
                        folder)
    except (OSError, ValueError, TypeError) as exc:  # another user's folder in a shared home: it runs as it did
        log.warning("cannot mend %s's tokenizer (%s)", folder, exc)
        return False
    return True


def up_to_date(folder: Path) -> Path:
    """Converted `folder` as conversions leave it now (_finish_conversion): one converted before 2026-11-29
    lacked the generation_config.json that names where generation ends (its model ended at config.json's
    id only) and held weights only its owner could read. Mended here once; the generation_config, written
    last, marks it done."""
    if not (folder / GENERATION_CONFIG).is_file():
        try:
            _finish_conversion(folder)
        except OSError as exc:  # another user's folder in a shared home: the model still runs, as it did
            log.warning("cannot mend %s, converted by an earlier triforce (%s): generation ends at config.json's "
                        "end id only; its owner mends it by using it once", folder, exc)
    return folder


def _finish_conversion(folder: Path) -> None:
    """The last steps of a conversion: files others may read, then where generation ends."""
    from .gguf_convert import write_generation_config

    umask_modes(folder)
    write_generation_config(folder)


def umask_modes(folder: Path) -> None:
    """Gives the files in `folder` the mode new files get under this process's umask (0644 under 0022):
    safetensors writes its files 0600, so a model fetched into a shared TRIFORCE_HOME, or a draft written
    into a shared folder, was readable by its owner only."""
    mode = 0o666 & ~_umask()
    for path in folder.iterdir():
        if path.is_file() and not path.is_symlink():
            try:
                path.chmod(mode)
            except FileNotFoundError:  # another process's temporary file, renamed meanwhile
                pass


def _umask() -> int:
    """This process's umask: read where Linux shows it, since reading it with os.umask sets it for a moment
    (for every thread)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def convert_gguf(gguf: Path, dest: Path) -> None:
    """Dequantizes a Llama-family GGUF into a float32 safetensors HF folder at `dest` (gguf_convert.py),
    published once it loads with our loader."""
    from .gguf_convert import write_hf_folder
    from .loader import load_model

    print(f"triforce: converting {gguf.name} into {dest}", file=sys.stderr)
    tmp = partial_path(dest)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        write_hf_folder(gguf, tmp)
        load_model(tmp, "bfloat16")  # the check: it must load before it is published
        _finish_conversion(tmp)
        (tmp / READY).write_text(str(gguf.name))
        try:
            tmp.rename(dest)
        except OSError:  # a folder there: published meanwhile by a maker that could not take turns with this
            if (dest / READY).is_file():  # one (kept: a reader may be loading it), or an interrupted one
                shutil.rmtree(tmp, ignore_errors=True)
                return
            shutil.rmtree(dest, ignore_errors=True)
            tmp.rename(dest)
    except BaseException as exc:  # (a GB of partial folder left behind until the next run)
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError):  # a full disk, an old folder of another user's in the way: one line
            raise ModelLoadError(f"cannot convert {gguf.name} into {dest} ({exc.strerror or exc}"
                                 f"{': ' + str(exc.filename) if exc.filename else ''})") from exc
        raise
