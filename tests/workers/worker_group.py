"""A worker group for tests: spawned processes (ranks 1..N of a gloo world, as under torchrun) serving a
model folder, and this process as their coordinator (rank 0) with a ControlChannel and the bulk link."""
import multiprocessing
import time

import torch
import torch.distributed as dist
from servers import free_port

from triforce.coordinator.remote import ControlChannel, model_identity
from triforce.launch.distributed import GroupTimeouts, init_groups
from triforce.models.parallel import TensorParallel
from triforce.workers.bulk import BulkLink
from triforce.workers.protocol import MAX_MESSAGE_BYTES


def _worker(rank: int, size: int, init: str, folder: str, endpoint: str, timeouts: GroupTimeouts,
            max_bytes: int, prefill_chunk: int, prefix_bytes: int, max_sequences: int | None) -> None:
    """Worker `rank` of `size`: global rank rank + 1, as under torchrun (the coordinator is rank 0)."""
    import triforce.workers.worker as worker
    from triforce.workers.group import run_worker

    if max_sequences is not None:
        worker.MAX_SEQUENCES = max_sequences
    torch.set_num_threads(1)
    groups = init_groups(rank + 1, size + 1, rank, False, timeouts, init)
    try:
        run_worker(folder, "float32", "cpu", TensorParallel(rank, size, groups.workers), endpoint,
                   BulkLink(groups.link, peer=0) if rank == 0 else None, prefill_chunk, max_bytes,
                   heartbeat_s=timeouts.heartbeat_s, coordinator_timeout_s=timeouts.link_s,
                   prefix_bytes=prefix_bytes)
    finally:
        dist.destroy_process_group()


def free_endpoint() -> str:
    return f"tcp://127.0.0.1:{free_port()}"


class Group:
    """`size` worker processes serving `folder`, with this process as the coordinator (rank 0) of their
    world; shut down (or killed) on exit. `group_timeout_s`: the worker group's collective timeout;
    `prefill_chunk` and `prefix_bytes` (its prefix store per rank) as run_worker's; `max_sequences`: how
    many sequences it holds at once (worker.MAX_SEQUENCES)."""

    def __init__(self, folder, size, tmp_path, timeout_s=60.0, max_bytes=MAX_MESSAGE_BYTES, group_timeout_s=300.0,
                 prefill_chunk=512, prefix_bytes=0, max_sequences=None):
        self.endpoint = free_endpoint()
        ctx = multiprocessing.get_context("spawn")
        init = f"file://{tmp_path}/rendezvous-{time.monotonic_ns()}"
        timeouts = GroupTimeouts(link_s=timeout_s, workers_s=group_timeout_s, startup_s=60)
        self.procs = [ctx.Process(target=_worker, args=(r, size, init, str(folder), self.endpoint, timeouts,
                                                         max_bytes, prefill_chunk, prefix_bytes, max_sequences),
                                 daemon=True) for r in range(size)]
        for p in self.procs:
            p.start()
        self.channel = None
        groups = init_groups(0, size + 1, 0, False, timeouts, init)
        try:
            self.channel = ControlChannel(self.endpoint, timeout_s, BulkLink(groups.link, peer=1), max_bytes)
            self.channel.handshake(model_identity(folder), size)
        except BaseException:
            self.close()
            raise

    def close(self):
        if self.channel is not None:
            if not self.channel.broken:
                self.channel.request("shutdown")
            self.channel.close()
        for p in self.procs:
            p.join(10)
            if p.is_alive():
                p.kill()
        dist.destroy_process_group()
