"""What a coordinator and worker group cannot run, refused before any process starts (`--workers`) or, under
torchrun by hand, by every rank before the rendezvous: settings, a model the workers cannot split, too
few GPUs."""
from __future__ import annotations

import torch

from ..config import check_prefix_cache, runs_tier
from ..errors import UserError
from ..models.config import ModelConfig, ModelLoadError
from ..models.hub import resolve_model
from ..models.loader import resolve_device
from ..models.parallel import TensorParallel


def _shards(cfg, size: int) -> bool:
    """Whether `size` tensor-parallel ranks can split the model (TensorParallel.check)."""
    try:
        TensorParallel(0, size).check(cfg)
    except ModelLoadError:
        return False
    return True


MAX_WORKER_TIMEOUT = 1_000_000  # seconds


def check_distributed_settings(args) -> None:
    """What a worker group cannot serve, refused before any process starts."""
    workers, device = getattr(args, "workers", 0), getattr(args, "worker_device", None)
    if workers < 0:
        raise UserError(f"--workers must be >= 0 (got {workers})")
    if device not in (None, "cpu", "cuda"):
        raise UserError(f"--worker-device must be cpu or cuda (got {device!r}); each worker takes cuda:LOCAL_RANK")
    timeout, port = getattr(args, "worker_timeout", 30.0), getattr(args, "control_port", None)
    if not 0 < timeout <= MAX_WORKER_TIMEOUT:  # (past it ZeroMQ's heartbeat options, in ms, overflow an int:
        # the leader's OverflowError traceback after loading its shard)
        raise UserError(f"--worker-timeout must be a number of seconds > 0 and at most {MAX_WORKER_TIMEOUT:,} "
                        f"(about 11 days; got {timeout})")
    if port is not None and not 1 <= port <= 65535:
        raise UserError(f"--control-port must be a port in 1-65535 (got {port})")
    from .cli import settings_named_by_flags

    with settings_named_by_flags():  # (the ranks' LLM gets no prefix store: the workers keep the prompts)
        check_prefix_cache(getattr(args, "prefix_cache_gb", 0), getattr(args, "enable_prefix_caching", None) is not False)
    if workers > 0:  # once here, not an error from every rank
        check_split(args, workers, f"--workers {workers}")
    if getattr(args, "control_host", None) == "auto" and args.control_bind in ("127.0.0.1", "localhost", "::1"):
        raise UserError("--control-host auto dials the leader's host name, and the leader listens on loopback "
                        "(--control-bind 127.0.0.1, the default): bind it to 0.0.0.0 or an interface")
    if args.retrieval_policy == "dynamic" and runs_tier(args.mode, "retrieval"):
        raise UserError("--retrieval-policy dynamic reads the target's full cache at every step, so it needs "
                        "it in the coordinator's process: it cannot run with --workers (use static)")


def check_split(args, workers: int, named: str) -> None:
    """A UserError where `workers` tensor-parallel ranks cannot split the target, naming the sizes that do."""
    if getattr(args, "model", None) is None:
        return
    cfg = ModelConfig.from_folder(resolve_model(args.model, getattr(args, "revision", None)))
    if not _shards(cfg, workers):
        fits = [w for w in range(1, cfg.num_heads + 1) if _shards(cfg, w)]
        raise UserError(f"{named}: the target's {cfg.num_heads} attention heads, {cfg.num_kv_heads} KV heads and "
                        f"MLP width {cfg.intermediate_size} do not split {workers} ways; the workers may be "
                        f"{', '.join(map(str, fits))} for this model")


def check_gpus(args, processes: int, coordinator_here: bool = True) -> None:
    """With CUDA workers each of a node's `processes` ranks takes cuda:LOCAL_RANK (the coordinator cuda:0, a
    worker r cuda:r): a UserError where the node has fewer GPUs (a rank's set_device failed, and the others
    waited for it in the rendezvous). On the coordinator's node, its --device too: one the node has, not a
    worker's (it was found wanting once every worker had loaded)."""
    device = resolve_device(getattr(args, "device", None)) if coordinator_here else None
    if worker_choice(args) != "cuda":
        return
    gpus = torch.cuda.device_count()
    if processes > gpus:
        raise UserError(f"{processes} processes on this node take a GPU each (the coordinator cuda:0, worker r "
                        f"cuda:r) and it has {gpus}: run fewer workers ({max(gpus - 1, 0)} here), or "
                        f"--worker-device cpu")
    if device is not None and device.type == "cuda" and 0 < (device.index or 0) < processes:
        raise UserError(f"--device {args.device}: worker {device.index} takes that GPU (worker r takes cuda:r), "
                        f"and the coordinator beside it ran out of memory or slowly; give it cuda:0")


def worker_choice(args) -> str:
    """--worker-device, or by default cuda where this process sees a GPU, else cpu."""
    return args.worker_device or ("cuda" if torch.cuda.is_available() else "cpu")
