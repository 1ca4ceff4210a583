"""`triforce` and `python -m triforce`: launch/cli.py's main, with its imports (and torch's, but for --help)
inside the Ctrl-C handling."""
import _thread
import contextlib
import importlib
import signal
import sys
import threading

AGAIN_AFTER_S = 0.01  # a Ctrl-C that a finalizer swallowed is delivered again this much later
_swallowed: list[bool] = []  # whether one was


def main() -> int:
    sys.unraisablehook = _interrupt_again
    try:
        with _ctrl_c_held():
            from .launch.cli import main as run_command
            if sys.argv[1:] and not {"-h", "--help"} & set(sys.argv[1:]):  # what a command runs on (torch);
                # help, and the usage that no command gets, need none
                importlib.import_module(".api", __package__)
        code = run_command()
        return 130 if _swallowed else code
    except KeyboardInterrupt:
        return 130


def _interrupt_again(unraisable, default=sys.unraisablehook) -> None:
    """A Ctrl-C that lands in a finalizer (a __del__, a weakref callback, as a tensor or socket is freed) is
    an exception Python cannot raise there: it printed "Exception ignored in" and a traceback, and the command
    ran on to its end with status 0. Delivered again to the main thread a moment later (not at once: that
    raised it in this hook, as lost), where it ends the command, or where SIGINT has a handler of its own
    (the server's) runs it; and the command's status is 130 whatever comes of it. Other such exceptions
    are printed as Python prints them."""
    if issubclass(unraisable.exc_type, KeyboardInterrupt):
        _swallowed.append(True)
        again = threading.Timer(AGAIN_AFTER_S, _thread.interrupt_main, (signal.SIGINT,))
        again.daemon = True
        again.start()
        return
    default(unraisable)


@contextlib.contextmanager
def _ctrl_c_held():
    """SIGINT held back while the CLI imports torch (a second or two), and delivered after: a Ctrl-C there
    printed an import's traceback, aborted in torch's C++ (status -6), or was swallowed by an import that
    it left half made, and the command then failed on it ("cannot read the tokenizer": a RecursionError in
    transformers' imports)."""
    if not hasattr(signal, "pthread_sigmask"):  # (Windows)
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


if __name__ == "__main__":
    sys.exit(main())
