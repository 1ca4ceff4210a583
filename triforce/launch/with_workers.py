"""`triforce generate|serve|batch --workers W`: the command run again under torchrun with W + 1 processes
(distributed.py is each rank's entry; torchrun.py the torchrun it starts)."""
from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import threading

from ..errors import UserError
from ..files import user_path
from ..models.loader import resolve_device
from .distributed import end_with_parent
from .distributed_checks import check_distributed_settings, check_gpus
from .generate import not_a_file
from ..workers.protocol import tcp_endpoint


LOWEST_PORT = 10000  # where free_port looks, up to the kernel's ephemeral range
INPUT_FLAGS = (("prompt_file", "--prompt-file"), ("input", "--input"))  # generate's prompt, batch's requests


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on `host` now, for the control channel (the tests' and benchmarks' servers use it too):
    one below the kernel's ephemeral range where it can tell. The group's leader binds it only once the
    model has loaded, minutes later, and meanwhile torchrun's rendezvous and gloo open connections whose
    local ports come from that range; a port from it could be one of theirs by then (the run then died
    asking for a --control-port the user never gave)."""
    try:
        socket.getaddrinfo(host, None, socket.AF_INET)
    except (socket.gaierror, UnicodeError):  # ZeroMQ's "*", an IPv6 address: probed on loopback
        host = "127.0.0.1"
    low = ephemeral_ports()[0]
    for port in random.sample(range(LOWEST_PORT, low), min(64, max(0, low - LOWEST_PORT))):
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:  # taken (or not ours to take)
                continue
            return port
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def ephemeral_ports(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> tuple[int, int]:
    """The ports the kernel gives connections of their own (Linux's; elsewhere, and by default, IANA's)."""
    try:
        with open(path) as f:
            low, high = map(int, f.read().split())
        return low, high
    except (OSError, ValueError):
        return 49152, 65535


def check_port_free(host: str, port: int) -> None:
    """A UserError where --control-port is taken on --control-bind now: the worker leader binds it only once
    its shard has loaded (minutes, for a large model), and the run then ended with this error."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(None if host == "*" else host, port,
                                                             type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except (socket.gaierror, UnicodeError):  # a name this cannot read: the leader's bind says what it is
        return
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # (as ZeroMQ binds: a closed run's port is free)
        try:
            probe.bind(address)
        except OSError as exc:
            raise UserError(f"cannot listen on {tcp_endpoint(host, port)}: {exc.strerror} (another worker group "
                            f"there? pick another --control-port)") from None


def process_environment(processes: int, env=os.environ) -> dict:
    """torchrun's processes' environment: torchrun gives each one OpenMP thread unless OMP_NUM_THREADS is
    set, which leaves a CPU run's coordinator (tiers 1 and 2) and CPU workers one core each however many
    the machine has; so unless the user set it, each process gets an even share of this process's cores."""
    env = dict(env)
    if "OMP_NUM_THREADS" not in env:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        env["OMP_NUM_THREADS"] = str(max(1, cores // processes))
    return env


def launch_with_torchrun(args) -> int:
    """`triforce generate|serve|batch --workers W`: re-run this command under torchrun with W + 1 processes."""
    check_distributed_settings(args)
    if args.worker_device == "cuda":  # the workers run here (by hand, on several nodes, only theirs need one)
        resolve_device("cuda")
    check_gpus(args, args.workers + 1)
    argv, skip = [], False
    for a in args.argv:  # drop --workers W
        if skip:
            skip = False
            continue
        if a == "--workers":
            skip = True
            continue
        if not a.startswith("--workers="):
            argv.append(a)
    if args.control_port is None:  # one machine: a free port, so that a second group does not collide
        argv += ["--control-port", str(free_port(args.control_bind))]
    else:
        check_port_free(args.control_bind, args.control_port)
    piped = piped_input(args)
    if piped is None:
        return run_torchrun(args, argv, stdin=None)
    flag, path = piped
    try:
        stdin = open(user_path(path), "rb")
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc}") from None
    with stdin:
        return run_torchrun(args, [*argv, flag, "-"], stdin)  # (argparse keeps a flag's last value)


def piped_input(args) -> tuple[str, str] | None:
    """The command's input flag and path (generate's --prompt-file, batch's --input) where the path is a pipe
    other than standard input (`<(cmd)`'s /dev/fd/N, a FIFO), else None. The launcher opens it for
    torchrun's standard input, which rank 0 reads as `-`: a descriptor of this process is not one of rank
    0's (torchrun closes them), and rank 0 opening /dev/fd/N found "No such file or directory"."""
    for name, flag in INPUT_FLAGS:
        path = getattr(args, name, None)
        if path is not None and path != "-" and not_a_file(path):
            return flag, path
    return None


def exit_status(returncode: int) -> int:
    """A child's return code as this process's exit status: a signal's death (-N) as a shell reports it, 128 + N
    (sys.exit(-9) exits 247)."""
    return 128 - returncode if returncode < 0 else returncode


def run_torchrun(args, argv: list[str], stdin) -> int:
    """torchrun with W + 1 ranks of the command `argv`, its standard input `stdin` (None: this one's)."""
    cmd = [sys.executable, "-m", "triforce.launch.torchrun", "--standalone", f"--nproc-per-node={args.workers + 1}",
           "-m", "triforce.launch.distributed", *argv]
    if threading.current_thread() is not threading.main_thread():  # no signal handlers here: torchrun stays in
        return exit_status(subprocess.Popen(cmd, env=process_environment(args.workers + 1),  # in our process
                                            preexec_fn=end_with_parent, stdin=stdin).wait())  # group
    # torchrun in a session of its own, which gets the first signal through this process: a Ctrl-C (to the
    # terminal's process group), a SIGINT to this process alone (`kill -INT`, `timeout -s INT`, a service
    # manager), SIGTERM (`kill`, a job manager) or SIGHUP (the terminal gone) reaches torchrun, which passes
    # it on to the ranks, so none serves on orphaned. (With torchrun in this process group, a SIGINT to this
    # process alone reached no rank, and the group served on.) Later ones are not passed on: a second one
    # while torchrun shut down sometimes broke its cleanup into a traceback.
    started, pending = [], []  # a signal before torchrun has started waits for it

    def forward(signum, frame) -> None:
        sent = signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM
        if started and not pending:
            started[0].send_signal(sent)
        pending.append(sent)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        torchrun = subprocess.Popen(cmd, env=process_environment(args.workers + 1), start_new_session=True,
                                    preexec_fn=end_with_parent, stdin=stdin)
        started.append(torchrun)
        if pending:
            torchrun.send_signal(pending[0])
        return exit_status(torchrun.wait())
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
