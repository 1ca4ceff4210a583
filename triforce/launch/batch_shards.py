"""Which lines of `triforce batch`'s input a process answers: `--shard I/N`, else its place in a Slurm job
array, else in torchrun's ranks."""
from __future__ import annotations

import os

from ..errors import UserError


def shard_of(spec: str | None, env=os.environ) -> tuple[int, int]:
    """(I, N) from --shard I/N, else the Slurm array task (slurm_shard), else torchrun's rank, else (0, 1)."""
    named = "--shard"
    if spec is None:
        if "SLURM_ARRAY_TASK_ID" in env:
            return slurm_shard(env)
        if not by_rank(spec, env):
            return 0, 1
        spec, named = f"{env['RANK']}/{env['WORLD_SIZE']}", "RANK/WORLD_SIZE"
    try:
        index, count = (int(x) for x in spec.split("/"))
    except ValueError:
        raise UserError(f"{named} must be I/N (got {spec!r})") from None
    if not 0 <= index < count:
        raise UserError(f"{named} {spec}: I must be in 0..N-1")
    return index, count


def by_rank(spec: str | None, env=os.environ) -> bool:
    """Whether shard_of takes the shard from torchrun's rank."""
    return spec is None and "SLURM_ARRAY_TASK_ID" not in env and "RANK" in env and "WORLD_SIZE" in env


def rank_device(device: str | None, env=os.environ) -> str | None:
    """The device of one of torchrun's ranks, each answering its shard on a node's GPUs: the GPU of its
    LOCAL_RANK where `device` is CUDA's default (unset, or "cuda"; every rank loaded the model onto GPU 0),
    made this process's current GPU; `device` as given otherwise (cpu, a GPU named, no GPU here, or one
    given this process alone: CUDA_VISIBLE_DEVICES set, or one process on the node)."""
    import torch

    if device not in (None, "", "cuda") or "LOCAL_RANK" not in env or not torch.cuda.is_available():
        return device
    try:
        local = int(env["LOCAL_RANK"])
    except ValueError:
        raise UserError(f"LOCAL_RANK must be a number (got {env['LOCAL_RANK']!r})") from None
    count = torch.cuda.device_count()
    if count == 1 and (env.get("CUDA_VISIBLE_DEVICES") or env.get("LOCAL_WORLD_SIZE", "1") == "1"):
        return device  # a launcher that gives each process a GPU of its own (srun --gpus-per-task=1): that one
    if not 0 <= local < count:
        raise UserError(f"LOCAL_RANK {local}: this process sees {count} CUDA GPUs; run as many processes per "
                        "node as it has GPUs, or name one with --device")
    torch.cuda.set_device(local)
    return f"cuda:{local}"


SLURM_ARRAY = ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_MAX", "SLURM_ARRAY_TASK_STEP",
               "SLURM_ARRAY_TASK_COUNT")


def slurm_shard(env) -> tuple[int, int]:
    """(I, N) of a Slurm array task: its place in the array's tasks MIN, MIN + STEP, ..., MAX (from 0, as
    --array=1-8 or --array=0-14:2 number them too), of COUNT. An array that is not such a range of several
    tasks is refused: a task submitted again alone (--array=3, one task) or a list (--array=3,5) would take
    a shard of its own count, answering again what other tasks answer."""
    shown = ", ".join(f"{k}={env[k]}" for k in SLURM_ARRAY if k in env)
    try:
        task = int(env["SLURM_ARRAY_TASK_ID"])
        first, step, count = (int(env.get(f"SLURM_ARRAY_TASK_{k}", d)) for k, d in
                              (("MIN", "0"), ("STEP", "1"), ("COUNT", "1")))
        last = int(env.get("SLURM_ARRAY_TASK_MAX", first + (count - 1) * step))
    except ValueError:
        raise UserError(f"the Slurm array's variables ({shown}) are not numbers: pass --shard I/N") from None
    if count < 2 or step < 1 or last != first + (count - 1) * step or not (
            first <= task <= last and (task - first) % step == 0):
        raise UserError(f"a Slurm array task of {shown} cannot tell its shard of the input: it is not one of "
                        "a range of several tasks (a task submitted again alone, or a list of tasks, counts "
                        "only those); pass --shard I/N, its place I in the N tasks of the whole array (--shard "
                        "0/1: every line)")
    return (task - first) // step, count
