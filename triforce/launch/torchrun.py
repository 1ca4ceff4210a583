"""torchrun for `triforce ... --workers W` (with_workers.launch_with_torchrun): `python -m
torch.distributed.run` with its arguments, but a failed rank ends the run with that rank's exit status
and a line of its own, not torchrun's multi-line failure report: the rank printed its one-line error (or
its traceback) already. A rank ended by a signal gets a line too, unless it is the SIGTERM with which
torchrun stops the others once one rank failed otherwise (with an error status, or another signal). A
SIGTERM or SIGINT (also a second one while the ranks shut down) ends it with status 128 + the signal,
without a traceback (nor one a finalizer raises as the process ends)."""
from __future__ import annotations

import logging
import signal
import sys

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import get_args_parser, run


def ignore_further_signals() -> None:
    """From here on SIGINT and SIGTERM do nothing: the process is ending anyway, and a signal that lands in
    the interpreter's exit (torch's atexit finalizers) would print a traceback instead."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)


def _quiet(unraisable) -> None:
    """An exception a finalizer raised as a signal ends the process (torch's rendezvous `_stop_thread`, its
    thread join cut short under load): not printed, where it was "Exception ignored in" and a traceback
    after the run had ended as asked."""


def main(argv: list[str] | None = None) -> int:
    # its "failed (exitcode: N) local_rank: R" line too; torchrun's other warnings (rendezvous) stay
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").setLevel(logging.CRITICAL)
    try:
        run(get_args_parser().parse_args(argv))
    except ChildFailedError as exc:
        failures = sorted(exc.failures.items())
        first_cause = any(f.exitcode != -signal.SIGTERM for _, f in failures)
        for rank, failure in failures:
            stopped_by_torchrun = first_cause and failure.exitcode == -signal.SIGTERM
            if failure.exitcode < 0 and not stopped_by_torchrun:  # no chance to say why itself
                print(f"triforce: error: rank {rank} was ended by signal {-failure.exitcode}", file=sys.stderr)
        return next((f.exitcode for _, f in failures if f.exitcode > 0), None) or _signal_status(failures)
    except SignalException as exc:  # SIGTERM or SIGINT: torchrun has passed it on to the ranks
        ignore_further_signals()  # one more (an impatient Ctrl-C) must not interrupt the exit into a traceback
        sys.unraisablehook = _quiet  # nor torch's rendezvous finalizers, cut short as the process ends
        return 128 + int(exc.sigval)
    return 0


def _signal_status(failures) -> int:
    """Ranks that signals ended: 128 + the first signal but torchrun's SIGTERM, as a shell reports a death by
    it (1 read to Slurm as an error of the run's own); 1 where none did."""
    killed = [-f.exitcode for _, f in failures if f.exitcode < 0]
    return 128 + next((k for k in killed if k != signal.SIGTERM), killed[0]) if killed else 1


if __name__ == "__main__":
    sys.exit(main())
