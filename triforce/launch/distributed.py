"""The torchrun entry of the distributed pipeline: rank 0 is the coordinator (tiers 1 and 2, the
retrieval cache, every random draw), ranks 1..N-1 are one tensor-parallel worker group holding the
target and its full KV cache sharded (NCCL on CUDA, gloo on CPU).

    torchrun --nproc-per-node 3 -m triforce.launch.distributed --prompt-file F [generate flags]
    triforce generate --workers 2 --prompt-file F ...        # the same, torchrun started for you

Only the group's rank 0 (global rank 1) talks to the coordinator, over ZeroMQ at --control-port on
--control-bind (loopback by default; name an interface for multi-node runs and point --control-host
at it). Recipes for one GPU node, two RTX 4090s and Slurm are in the README.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

import torch
import torch.distributed as dist

from ..errors import UserError


def launch_with_torchrun(args) -> int:
    """`triforce generate --workers W`: re-run this command under torchrun with W + 1 processes."""
    argv, skip = [], False
    for i, a in enumerate(args.argv):  # drop the subcommand and --workers W
        if skip:
            skip = False
            continue
        if a == "--workers":
            skip = True
            continue
        if a.startswith("--workers=") or (i == 0 and a == "generate"):
            continue
        argv.append(a)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.workers + 1}",
           "-m", "triforce.launch.distributed", *argv]
    return subprocess.call(cmd)


def _worker_device(args, local_rank: int) -> str:
    choice = args.worker_device or ("cuda" if torch.cuda.is_available() else "cpu")
    return f"cuda:{local_rank}" if choice == "cuda" else choice


def main(argv: list[str] | None = None) -> int:
    from .cli import add_generate_args

    parser = argparse.ArgumentParser(prog="python -m triforce.launch.distributed", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_generate_args(parser)
    args = parser.parse_args(argv)
    try:
        rank, world, local_rank = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    except KeyError:
        print("triforce: error: run this under torchrun (or use triforce generate --workers W)", file=sys.stderr)
        return 2
    if world < 2:
        print("triforce: error: needs at least 2 processes: the coordinator and one worker", file=sys.stderr)
        return 2
    cuda = torch.cuda.is_available() and _worker_device(args, local_rank) != "cpu"
    dist.init_process_group("cpu:gloo,cuda:nccl" if cuda else "gloo")
    try:
        workers = dist.new_group(list(range(1, world)))  # every rank takes part in creating it
        control = dist.new_group(backend="gloo")  # CPU barriers
        if args.control_host == "auto":
            args.control_host = _leader_host(rank, control)
        return _coordinate(args, world, control) if rank == 0 else _work(args, rank, world, local_rank,
                                                                         workers, control)
    finally:
        dist.destroy_process_group()


def _leader_host(rank: int, control) -> str:
    """The worker leader's (global rank 1) host name, told to every rank: for multi-node runs where the
    scheduler decides which node it lands on."""
    import socket

    buf = torch.zeros(256, dtype=torch.uint8)
    if rank == 1:
        name = socket.getfqdn().encode()[:256]
        buf[: len(name)] = torch.tensor(list(name), dtype=torch.uint8)
    dist.broadcast(buf, src=1, group=control)
    return bytes(buf[buf != 0].tolist()).decode()


def _resolve_once(spec, rank: int, control):
    """Rank 0 fetches or converts a model first; the others then find it ready."""
    from ..models.hub import resolve_model

    path = resolve_model(spec) if rank == 0 else None
    dist.barrier(group=control)
    return path if rank == 0 else resolve_model(spec)


def _work(args, rank, world, local_rank, workers, control) -> int:
    from ..models.parallel import TensorParallel
    from ..workers.group import run_worker

    path = _resolve_once(args.model, rank, control)
    tp = TensorParallel(rank - 1, world - 1, workers if world > 2 else None)
    endpoint = f"tcp://{args.control_bind}:{args.control_port}" if rank == 1 else None
    try:
        run_worker(path, args.dtype, _worker_device(args, local_rank), tp, endpoint, 512)
    except UserError as exc:
        print(f"triforce: error (worker {rank}): {exc}", file=sys.stderr)
        return 2
    return 0


def _coordinate(args, world, control) -> int:
    from ..api import LLM
    from ..coordinator.remote import ControlChannel, model_identity
    from .cli import engine_settings, run_generation

    path = _resolve_once(args.model, 0, control)
    channel = ControlChannel(f"tcp://{args.control_host}:{args.control_port}", args.worker_timeout)
    try:
        channel.handshake(model_identity(path), world - 1)
        llm = LLM(args.model, args.draft, args.mode, args.dtype, args.device, workers=channel,
                  **engine_settings(args))
        return run_generation(args, llm)
    except UserError as exc:
        print(f"triforce: error: {exc}", file=sys.stderr)
        return 2
    finally:
        if not channel.broken:
            channel.request("shutdown")
        channel.close()


if __name__ == "__main__":
    sys.exit(main())
