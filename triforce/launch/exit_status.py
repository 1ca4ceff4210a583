"""How a command's run ends, in cli.py's main and on the torchrun coordinator (distributed.py): its exit
status, with one line on stderr for an error in the user's input (2) or an output that cannot be written (1),
and quiet where stdout's reader left (141)."""
from __future__ import annotations

import io
import os
import sys
from collections.abc import Callable

from ..errors import UserError


def exit_status(run: Callable[[], int]) -> int:
    """run()'s exit status, stdout guarded while it runs (GuardedOutput) and flushed here, where a reader gone
    or a disk full is caught, not at exit."""
    stdout, sys.stdout = sys.stdout, GuardedOutput(sys.stdout)
    try:
        code = run()
        sys.stdout.flush()
        return code
    except UserError as exc:
        print(f"triforce: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return reader_gone()
    except OutputFailed as exc:
        print(f"triforce: error: cannot write the output: {exc}", file=sys.stderr)
        _discard_stdout()
        return 1
    finally:
        sys.stdout = stdout


def reader_gone() -> int:
    """The exit status once stdout's reader has left (`| head`): quiet, as other commands are."""
    _discard_stdout()
    return 141  # 128 + SIGPIPE, what a shell reports for such a command


def _discard_stdout() -> None:
    """What stdout still holds goes nowhere: the flush at exit does not fail again."""
    if getattr(sys.stdout, "_stream", sys.stdout) is not None:  # (None: closed at the start, `>&-`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


class OutputFailed(Exception):
    """stdout cannot take what a command writes (`> /dev/full`, a disk full)."""


class GuardedOutput:
    """A command's sys.stdout, whose failures to write, other than a reader gone (BrokenPipeError), are
    OutputFailed: an OSError from elsewhere stays a traceback to report. Python's sys.stdout is None where
    the process started with it closed (`>&-`): writing fails, a flush has nothing to do."""

    def __init__(self, stream):
        self._stream = stream

    def __getattr__(self, name):
        return getattr(self._stream, name)

    def write(self, text: str) -> int:
        if self._stream is None:
            raise OutputFailed("standard output is closed")
        return self._guarded(self._stream.write, text)

    def flush(self) -> None:
        if self._stream is not None:
            self._guarded(self._stream.flush)

    def isatty(self) -> bool:
        return self._stream is not None and self._stream.isatty()

    def fileno(self) -> int:
        if self._stream is None:
            raise io.UnsupportedOperation("standard output is closed")
        return self._stream.fileno()

    @staticmethod
    def _guarded(call, *args):
        try:
            return call(*args)
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise OutputFailed(exc.strerror or str(exc)) from None
