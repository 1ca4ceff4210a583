"""Start one rank of the worker group: load this rank's shard of the target and serve requests."""
from __future__ import annotations

from pathlib import Path

from ..config import PREFILL_CHUNK
from ..engine_args import MEMORY_SHARE
from ..errors import UserError
from ..coordinator.channel import model_identity
from ..models.config import ModelConfig
from ..models.loader import load_model
from ..models.parallel import TensorParallel
from .bulk import BulkLink
from .protocol import MAX_MESSAGE_BYTES
from .loop import DEFAULT_COORDINATOR_TIMEOUT_S, serve
from .worker import VerifierWorker, out_of_memory, prefix_bound


def run_worker(model_path: str | Path, dtype: str, device: str, tp: TensorParallel, endpoint: str | None,
               link: BulkLink | None, prefill_chunk: int = PREFILL_CHUNK, max_bytes: int = MAX_MESSAGE_BYTES,
               heartbeat_s: float | None = None,
               coordinator_timeout_s: float = DEFAULT_COORDINATOR_TIMEOUT_S, rope_scaling: str | None = None,
               prefix_bytes: int = 0, memory_share: float = MEMORY_SHARE) -> None:
    """Returns after the coordinator's shutdown request; raises CoordinatorLost (worker.py) on every rank
    when the coordinator went away without one. `endpoint` (bound) and `link` (to the coordinator) are
    the group's rank 0's only. `prefix_bytes`: each rank's bound on the recent prompts' KV it keeps;
    `memory_share`: of the memory free, what sequences' caches may take (--gpu-memory-utilization)."""
    # (a CPU model's kernels are built or loaded with it, while the coordinator's handshake waits for the load,
    # not in the first request, which waits 60 s: on a fresh 2-core machine two ranks building them took longer)
    try:
        model = load_model(model_path, dtype, device, tp if tp.size > 1 else None, rope_scaling)
    except Exception as exc:
        if not out_of_memory(exc):
            raise
        raise UserError(f"out of memory as it loaded its shard of the target on {device}: more workers, or a "
                        f"smaller --dtype") from None  # (its own line, not a traceback: docs/distributed.md)
    kv_heads = ModelConfig.from_folder(Path(model_path)).num_kv_heads
    worker = VerifierWorker(model, tp, model_identity(Path(model_path), rope_scaling), kv_heads, prefill_chunk,
                            prefix_bound(prefix_bytes, model.device, tp), memory_share)
    serve(worker, endpoint if tp.rank == 0 else None, link if tp.rank == 0 else None, max_bytes, heartbeat_s,
          coordinator_timeout_s)
