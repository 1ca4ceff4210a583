"""The torchrun entry of the distributed pipeline: rank 0 is the coordinator (tiers 1 and 2, the
retrieval cache, every random draw), ranks 1..N-1 are one tensor-parallel worker group holding the
target and its full KV cache sharded (NCCL on CUDA, gloo on CPU). Rank 0 runs the command named first
(generate, the default; serve; batch) with the group as its verifier; the workers keep the recent prompts'
blocks for reuse (--prefix-cache-gb of serve and batch, on each worker).

    torchrun --nproc-per-node 4 -m triforce.launch.distributed [generate] --prompt-file F [generate flags]
    torchrun --nproc-per-node 4 -m triforce.launch.distributed serve [serve flags]
    triforce generate --workers 3 --prompt-file F ...        # the same, torchrun started for you
    triforce serve --workers 3 ...

(3 workers: SmolLM2, the default model, splits 1 or 3 ways; a world that does not split the model, or a
node with fewer GPUs than processes under CUDA, is refused by every rank before the rendezvous.)

Only the group's rank 0 (global rank 1) talks to the coordinator: control messages over ZeroMQ at
--control-port on --control-bind (loopback by default; name an interface for multi-node runs and point
--control-host at it), KV over a gloo group of ranks 0 and 1 (workers/bulk.py). Recipes for one GPU
node, two RTX 4090s and Slurm are in docs/distributed.md.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from ..config import PREFILL_CHUNK
from ..errors import UserError
from ..workers.protocol import tcp_endpoint
from .exit_status import exit_status
from .distributed_checks import check_distributed_settings, check_gpus, check_split, worker_choice


@dataclass(frozen=True)
class GroupTimeouts:
    """How long a rank waits for the others, per process group: finite, so that a dead or stuck rank is
    noticed (NCCL's watchdog, gloo's own), and long enough for what others legitimately wait out."""
    link_s: float  # a bulk transfer between coordinator and leader: the worker timeout, as its requests
    workers_s: float = 300.0  # a collective of the worker group; the first waits out the slowest shard load
    startup_s: float = 1800.0  # the rendezvous: the ranks take turns fetching or converting the model before it

    @classmethod
    def for_worker_timeout(cls, worker_timeout_s: float) -> "GroupTimeouts":
        """The worker group's ranks wait in a collective while the leader alone replies, and a bulk reply
        can hold it one stalled transfer long (the worker timeout; it then raises and the group ends): the
        group's timeout covers that twice over. A live coordinator takes a reply at the link's speed."""
        return cls(link_s=worker_timeout_s, workers_s=max(cls.workers_s, 2 * worker_timeout_s))

    @property
    def heartbeat_s(self) -> float:
        """How often an idle leader pings its group: several times per timeout, so one late ping is harmless."""
        return self.workers_s / 4


@dataclass(frozen=True)
class PipelineGroups:
    workers: object  # ranks 1..N-1, the tensor-parallel group; None with a single worker
    control: object  # every rank, gloo: startup barriers
    link: object  # ranks 0 and 1, gloo: the bulk KV between the coordinator and the worker leader


def init_groups(rank: int, world: int, local_rank: int, cuda: bool, timeouts: GroupTimeouts,
                init_method: str = "env://") -> PipelineGroups:
    """Every rank of the world calls this, in the same order: process groups are made collectively."""
    if cuda:
        # Before NCCL starts: a rank that has not chosen its GPU makes its communicator on GPU 0.
        torch.cuda.set_device(local_rank)
    dist.init_process_group("cpu:gloo,cuda:nccl" if cuda else "gloo", init_method=init_method, rank=rank,
                            world_size=world, timeout=timedelta(seconds=timeouts.startup_s))
    workers = dist.new_group(list(range(1, world)), timeout=timedelta(seconds=timeouts.workers_s))
    control = dist.new_group(backend="gloo")
    link = dist.new_group([0, 1], backend="gloo", timeout=timedelta(seconds=timeouts.link_s))
    return PipelineGroups(workers if world > 2 else None, control, link)


COMMANDS = ("generate", "serve", "batch")  # what rank 0 may run; the first argument, generate by default


PR_SET_PDEATHSIG = 1  # prctl(2)


def end_with_parent() -> None:
    """From now on this process gets SIGTERM when its parent dies, however it died (SIGKILL, the OOM killer:
    no signal of its own to pass on); Linux only, elsewhere nothing. torchrun's (of the `--workers`
    command) and each rank's (of torchrun), so that none serves on orphaned."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def control_port(args) -> int:
    from .flags import DEFAULT_CONTROL_PORT

    return DEFAULT_CONTROL_PORT if args.control_port is None else args.control_port


def _worker_device(args, local_rank: int) -> str:
    choice = worker_choice(args)
    return f"cuda:{local_rank}" if choice == "cuda" else choice


def parse_command(argv: list[str]) -> argparse.Namespace:
    """The command's flags, as `triforce COMMAND` parses them (generate when the first argument names none;
    serve's positional model as --model: the launching process refused two different ones)."""
    from .cli import build_parser
    from .flags import take_model_tag

    if not argv or argv[0] not in COMMANDS:
        argv = ["generate", *argv]
    args = build_parser().parse_args(argv)
    args.argv = argv
    take_model_tag(args)
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    end_with_parent()  # torchrun's end is this rank's, however torchrun ended
    try:
        args = parse_command(argv)
    except UserError as exc:  # (every rank alike: a traceback each)
        print(f"triforce: error: {exc}", file=sys.stderr)
        return 2
    try:
        rank, world, local_rank = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    except KeyError:
        print("triforce: error: run this under torchrun (or use triforce generate --workers W)", file=sys.stderr)
        return 2
    if world < 2:
        print("triforce: error: needs at least 2 processes: the coordinator and one worker", file=sys.stderr)
        return 2
    try:  # every rank checks alike and all end here, before any waits for another in the rendezvous
        check_distributed_settings(args)
        check_split(args, world - 1, f"{world} processes ({world - 1} workers)")
        check_gpus(args, int(os.environ.get("LOCAL_WORLD_SIZE", world)), os.environ.get("GROUP_RANK", "0") == "0")
    except UserError as exc:
        print(f"triforce: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # a Ctrl-C while the first run fetches or converts the model: its partial files
        return 130  # removed as it unwound, and no traceback per rank
    # torchrun passes a Ctrl-C on to every rank as SIGINT (each rank runs in a session of its own): a rank
    # ends at once, as SIGTERM ends it, rather than unwind mid-collective into a traceback per rank.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    cuda = torch.cuda.is_available() and _worker_device(args, local_rank) != "cpu"
    timeouts = GroupTimeouts.for_worker_timeout(args.worker_timeout)
    try:
        groups = init_groups(rank, world, local_rank, cuda, timeouts)
    except (RuntimeError, ValueError) as exc:  # (torch.distributed's DistError is a RuntimeError)
        print(f"triforce: error (rank {rank}): could not set up torch.distributed for {world} processes (the "
              f"rendezvous at MASTER_ADDR/MASTER_PORT, or this rank's device): {exc}", file=sys.stderr)
        return 2
    try:
        ended = _prechecked(args, rank, world, groups.control)
        if ended is not None:
            return ended
        if args.control_host == "auto":
            args.control_host = _leader_host(rank, groups.control)
        if rank == 0:
            return _coordinate(args, world, groups)
        return _work(args, rank, world, local_rank, groups, timeouts)
    finally:
        dist.destroy_process_group()


def _prechecked(args, rank: int, world: int, control) -> int | None:
    """The command's own checks (its input, its output, its port: what `triforce CMD --workers W` checks
    before torchrun starts), by rank 0 before any rank loads the model, and their outcome told every rank:
    the exit status where the run ends there (0: nothing to do; 2: an error rank 0 printed), else None.
    They run as the launching process runs them: a prompt or input from standard input is left for the
    command to read."""
    code, failure = torch.tensor([-1]), None
    if rank == 0 and getattr(args, "precheck", None) is not None:
        try:
            ended = args.precheck(argparse.Namespace(**{**vars(args), "workers": world - 1}))
            code[0] = ended if isinstance(ended, int) else -1
        except UserError as exc:
            print(f"triforce: error: {exc}", file=sys.stderr)
            code[0] = 2
        except BaseException as exc:  # (a bug: told too, or the other ranks waited in the broadcast)
            code[0], failure = 1, exc
    dist.broadcast(code, src=0, group=control)
    if failure is not None:
        raise failure
    return None if code.item() < 0 else code.item()


def _leader_host(rank: int, control) -> str:
    """The worker leader's (global rank 1) host name, told to every rank: for multi-node runs where the
    scheduler decides which node it lands on."""
    import socket

    buf = torch.zeros(256, dtype=torch.uint8)
    if rank == 1:
        name = socket.getfqdn()
        if name.split(".")[0] == "localhost":  # its name on an /etc/hosts line of 127.0.0.1 after localhost: the
            name = socket.gethostname()  # coordinator on another node dialled its own loopback
        name = name.encode()[:256]
        buf[: len(name)] = torch.tensor(list(name), dtype=torch.uint8)
    dist.broadcast(buf, src=1, group=control)
    return bytes(buf[buf != 0].tolist()).decode()


def _resolve_once(spec, rank: int, control, revision: str | None = None):
    """The model's folder, rank 0's first (every rank resolved it already as it checked the split, taking
    turns on the folder's lock: the first fetched or converted it, the others found it ready)."""
    from ..models.hub import resolve_model

    path = resolve_model(spec, revision) if rank == 0 else None
    dist.barrier(group=control)
    return path if rank == 0 else resolve_model(spec, revision)


def _work(args, rank, world, local_rank, groups: PipelineGroups, timeouts: GroupTimeouts) -> int:
    from ..models.parallel import TensorParallel
    from ..workers.bulk import BulkLink
    from ..workers.group import run_worker
    from ..workers.worker import CoordinatorLost

    tp = TensorParallel(rank - 1, world - 1, groups.workers)
    leader = rank == 1
    endpoint = tcp_endpoint(args.control_bind, control_port(args)) if leader else None
    link = BulkLink(groups.link, peer=0) if leader else None
    try:
        path = _resolve_once(args.model, rank, groups.control, args.revision)
        share = _memory_share(args)
        run_worker(path, args.dtype, _worker_device(args, local_rank), tp, endpoint, link, PREFILL_CHUNK,
                   heartbeat_s=timeouts.heartbeat_s, coordinator_timeout_s=timeouts.link_s,
                   rope_scaling=args.rope_scaling, prefix_bytes=_prefix_bytes(args),
                   memory_share=share)
    except CoordinatorLost:
        return 1  # the leader has logged why; every rank of the group exits alike
    except UserError as exc:
        print(f"triforce: error (worker {rank}): {exc}", file=sys.stderr)
        return 2
    return 0


def _memory_share(args) -> float:
    """--gpu-memory-utilization, checked as LLM checks it: the group's caches take that share of the free
    memory too (they took 0.9 of it, whatever the flag said)."""
    from ..engine_args import take_vllm_args

    share = getattr(args, "gpu_memory_utilization", None)
    return take_vllm_args({} if share is None else {"gpu_memory_utilization": share}).memory_share


def _prefix_bytes(args) -> int:
    """The bound of each worker's prefix store: --prefix-cache-gb, 0 under --no-enable-prefix-caching (vLLM's
    way to keep no prompts; the group kept its default GB, and the coordinator then refused to start)."""
    if getattr(args, "enable_prefix_caching", None) is False:
        return 0
    return int(getattr(args, "prefix_cache_gb", 0) * 2**30)


def _coordinate(args, world, groups: PipelineGroups) -> int:
    from ..coordinator.channel import ControlChannel, WorkerError, model_identity
    from ..workers.bulk import BulkLink

    import zmq

    try:
        path = _resolve_once(args.model, 0, groups.control, args.revision)
    except UserError as exc:
        print(f"triforce: error: {exc}", file=sys.stderr)
        return 2
    endpoint = tcp_endpoint(args.control_host, control_port(args))
    try:
        channel = ControlChannel(endpoint, args.worker_timeout, BulkLink(groups.link, peer=1))
    except zmq.ZMQError as exc:
        print(f"triforce: error: cannot reach the worker leader at {endpoint} (--control-host, --control-port): "
              f"{exc}", file=sys.stderr)
        return 2
    shaken = False  # a group that refused the handshake is another run's (a shared port): never shut it down

    def run() -> int:
        nonlocal shaken
        channel.handshake(model_identity(path, args.rope_scaling), world - 1)
        shaken = True
        args.worker_channel, args.workers = channel, 0  # the command's LLM verifies on the group
        return args.func(args)

    try:
        return exit_status(run)
    finally:
        try:
            if shaken and not channel.broken:  # a group that a signal ended too does not answer: do not wait long
                channel.request("shutdown", timeout_s=min(5.0, args.worker_timeout))
        except WorkerError:
            pass
        channel.close()


if __name__ == "__main__":
    sys.exit(main())
