"""`triforce` and `python -m triforce`: launch/cli.py's main, with its imports inside the Ctrl-C handling (torch
takes a second or more to load, and a Ctrl-C then printed an import's traceback)."""
import sys


def main() -> int:
    try:
        from .launch.cli import main as run_command

        return run_command()
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
