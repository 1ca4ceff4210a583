"""`triforce` and `python -m triforce`: launch/cli.py's main, with its imports (and torch's, but for --help)
inside the Ctrl-C handling."""
import contextlib
import importlib
import signal
import sys


def main() -> int:
    try:
        with _ctrl_c_held():
            from .launch.cli import main as run_command
            if sys.argv[1:] and not {"-h", "--help"} & set(sys.argv[1:]):  # what a command runs on (torch);
                # help, and the usage that no command gets, need none
                importlib.import_module(".api", __package__)
        return run_command()
    except KeyboardInterrupt:
        return 130


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
