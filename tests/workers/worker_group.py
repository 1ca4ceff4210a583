"""A worker group for tests: processes (tests/processes.py; ranks 1..N of a gloo world, as under
torchrun) serving a model folder, and this process as their coordinator (rank 0) with a ControlChannel
and the bulk link."""
import os
import time

import torch
import torch.distributed as dist
import processes
from servers import free_port

from triforce.coordinator.channel import ControlChannel, model_identity
from triforce.launch.distributed import GroupTimeouts, init_groups
from triforce.models.parallel import TensorParallel
from triforce.workers.bulk import BulkLink
from triforce.workers.protocol import MAX_MESSAGE_BYTES


def _worker(rank: int, size: int, init: str, folder: str, endpoint: str, timeouts: GroupTimeouts,
            max_bytes: int, prefill_chunk: int, prefix_bytes: int, max_sequences: int | None,
            short_of_memory: tuple[int, int] | None) -> None:
    """Worker `rank` of `size`: global rank rank + 1, as under torchrun (the coordinator is rank 0)."""
    import triforce.workers.checks as checks
    import triforce.workers.worker as worker
    from triforce.workers.group import run_worker

    if max_sequences is not None:
        checks.MAX_SEQUENCES = max_sequences
    if short_of_memory is not None and short_of_memory[0] == rank:  # (a GPU fuller than the leader's)
        class ShortOfMemory(worker.FullKVCache):
            def __init__(self, config, capacity, *args, **kwargs):
                if capacity == 123:  # a bug rather than memory
                    raise ValueError(f"a test's rank {rank} fails a cache of 123 tokens")
                if capacity > short_of_memory[1]:
                    raise torch.OutOfMemoryError(f"CUDA out of memory (a test's rank {rank})")
                super().__init__(config, capacity, *args, **kwargs)

        worker.FullKVCache = ShortOfMemory
    torch.set_num_threads(1)
    groups = init_groups(rank + 1, size + 1, rank, False, timeouts, init)
    try:
        run_worker(folder, "float32", "cpu", TensorParallel(rank, size, groups.workers), endpoint,
                   BulkLink(groups.link, peer=0) if rank == 0 else None, prefill_chunk, max_bytes,
                   heartbeat_s=timeouts.heartbeat_s, coordinator_timeout_s=timeouts.link_s,
                   prefix_bytes=prefix_bytes)
    finally:
        dist.destroy_process_group()


START_ATTEMPTS = 3


def _listening_ports(pid: int) -> set[int]:
    """The TCP ports process `pid` listens on (Linux: its socket inodes in /proc/net/tcp, state LISTEN)."""
    try:
        inodes = {os.readlink(f"/proc/{pid}/fd/{fd}")[8:-1] for fd in os.listdir(f"/proc/{pid}/fd")}
    except OSError:  # it exited, or the fds changed while read
        return set()
    ports = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(name):
            continue
        with open(name) as table:
            for line in list(table)[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


class LeaderExited(RuntimeError):
    """The worker leader exited before it listened: most likely another test's connection took the port
    chosen for it (a free port stays free only until someone binds it)."""


def free_endpoint() -> str:
    return f"tcp://127.0.0.1:{free_port()}"


class Group:
    """`size` worker processes serving `folder`, with this process as the coordinator (rank 0) of their
    world; shut down (or killed) on exit. `group_timeout_s`: the worker group's collective timeout;
    `prefill_chunk` and `prefix_bytes` (its prefix store per rank) as run_worker's; `max_sequences`: how
    many sequences it holds at once (checks.MAX_SEQUENCES); `short_of_memory` (rank, tokens): that worker
    cannot allocate a cache of more tokens (and fails one of 123 tokens otherwise)."""

    def __init__(self, folder, size, tmp_path, timeout_s=60.0, max_bytes=MAX_MESSAGE_BYTES, group_timeout_s=300.0,
                 prefill_chunk=512, prefix_bytes=0, max_sequences=None, short_of_memory=None):
        for attempt in range(START_ATTEMPTS):
            try:
                self._start(folder, size, tmp_path, timeout_s, max_bytes, group_timeout_s, prefill_chunk,
                            prefix_bytes, max_sequences, short_of_memory)
                return
            except LeaderExited:
                if attempt == START_ATTEMPTS - 1:
                    raise

    def _start(self, folder, size, tmp_path, timeout_s, max_bytes, group_timeout_s, prefill_chunk, prefix_bytes,
               max_sequences, short_of_memory):
        self.endpoint = free_endpoint()
        ctx = processes.context()
        init = f"file://{tmp_path}/rendezvous-{time.monotonic_ns()}"
        timeouts = GroupTimeouts(link_s=timeout_s, workers_s=group_timeout_s, startup_s=60)
        self.procs = [ctx.Process(target=_worker, args=(r, size, init, str(folder), self.endpoint, timeouts,
                                                         max_bytes, prefill_chunk, prefix_bytes, max_sequences,
                                                         short_of_memory),
                                 daemon=True) for r in range(size)]
        for p in self.procs:
            p.start()
        self.channel = None
        groups = init_groups(0, size + 1, 0, False, timeouts, init)
        try:
            self._wait_listening()
            self.channel = ControlChannel(self.endpoint, timeout_s, BulkLink(groups.link, peer=1), max_bytes)
            self.channel.handshake(model_identity(folder), size)
        except BaseException:
            self.close()
            raise

    def _wait_listening(self, timeout_s: float = 300.0) -> None:
        """Until the leader listens on the endpoint; LeaderExited at once if it exited first (its bind
        failed), rather than the handshake's wait of minutes."""
        if not os.path.exists("/proc/net/tcp"):  # no /proc (not Linux): the handshake's wait alone
            return
        port, deadline = int(self.endpoint.rsplit(":", 1)[1]), time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            leader = self.procs[0]
            if leader.exitcode is not None:
                raise LeaderExited(f"the worker leader exited ({leader.exitcode}) before listening on {port} "
                                   f"(most likely another process took the port)")
            if port in _listening_ports(leader.pid):
                return
            time.sleep(0.05)
        raise TimeoutError(f"the worker leader did not listen on {port} within {timeout_s:g} s")

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
