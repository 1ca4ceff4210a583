"""The tensor-parallel verifier: one worker group holding the target sharded and its full KV cache.

Only the group's rank 0 (the leader) talks to the coordinator, over a ZeroMQ REP socket (loop.py). It
decodes and checks each request (protocol.py; its arguments against the cache: checks.py) before anything
is broadcast, so a bad request gets an error reply and no rank enters a collective for it; a good one is
broadcast to the group as msgpack bytes (never pickled), every rank executes it (`execute`: the model's
forward holds the collectives), and the leader replies. Logits travel back as raw tensor frames; KV (refresh, kv) over
the bulk link to the coordinator (bulk.py), after a reply that describes it.

The group holds several sequences at once, each with its own full KV cache, named by the number the
coordinator gave it. With a prefix store (`prefix_bytes`), each rank keeps the KV of its heads for recent
prompts' blocks (cache/prefixes.py; a block is one prefill chunk): a prompt prefilled one whole block per
request (the coordinator's chunks) restores each block the store holds instead of forwarding it, except
a block that ends the prompt (`final`), whose forward leaves the last query the retrieval choice reads.
Every rank holds as many KV heads as the others and sees the same requests in the same order, so their
stores restore, keep and evict alike and every rank forwards (enters the collectives) or none does.

Requests: handshake, start (a new sequence: an empty cache), end (free it), prefill, verify (one forward
of several sequences together, each a chain or a speculation tree run with its ancestor mask: the
weights are read once for all of them), commit (keep the accepted path, dropping the rest), refresh (the
static retrieval choice made on each rank's KV heads), kv (committed KV of a range), save_query and
restore_query (the last query a refresh reads, around forwards rolled back whole), stats, shutdown.
"""
from __future__ import annotations

import logging

import torch
import torch.distributed as dist

from ..cache.full import FullKVCache
from ..cache.prefixes import BlockNames, PrefixStore
from ..cache.retrieval import retrieve_from_full, selects_chunks
from ..config import PREFILL_CHUNK
from ..engine_args import MEMORY_SHARE
from ..coordinator.costs import machine_key
from ..memory import available_bytes, release_freed
from ..models.llama import LlamaModel
from ..models.parallel import TensorParallel
from ..step import Step
from .checks import LeaderChecks, NeverFits, NoRoom, RequestError, sharing_memory
from .protocol import PROTOCOL_VERSION

log = logging.getLogger(__name__)


class CoordinatorLost(RuntimeError):
    """The coordinator went away without a shutdown request; raised on every rank of the group."""


def prefix_bound(asked: int, device: torch.device, tp: TensorParallel) -> int:
    """Each rank's prefix store bound: `asked`, at most half the memory free on its device now, shared on a
    CPU among the group's ranks on its host (the in-process store's rule, request_memory.py); the least over
    the ranks, so that every rank's store keeps the same blocks. (Uncapped, a group's default of 1 GiB per
    rank on a host with less free left the leader no room for any sequence: every request was refused.)"""
    if asked <= 0:  # (`asked` is every rank's: all return here, or all reduce below)
        return 0
    free = available_bytes(device)
    bound = asked if free is None else min(asked, free // (2 * sharing_memory(tp, device)))
    if tp.size > 1:  # every rank calls this as the group starts, whatever it found free
        least = torch.tensor([bound], dtype=torch.int64, device=device)
        dist.all_reduce(least, op=dist.ReduceOp.MIN, group=tp.group)
        bound = int(least.item())
    if bound < asked and tp.rank == 0:
        log.warning("prefix store bounded to %.2f GiB per rank, half the memory free (%.2f GiB asked)",
                    bound / 2**30, asked / 2**30)
    return bound


def out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` is an allocation that failed for want of memory (a GPU's, or the CPU allocator's)."""
    return isinstance(exc, (torch.OutOfMemoryError, MemoryError)) or "can't allocate memory" in str(exc)


class VerifierWorker(LeaderChecks):
    def __init__(self, model: LlamaModel, tp: TensorParallel, model_id: str, kv_heads: int,
                 prefill_chunk: int = PREFILL_CHUNK, prefix_bytes: int = 0, memory_share: float = MEMORY_SHARE):
        """kv_heads: the whole model's KV heads (model.config counts this rank's). prefix_bytes: this rank's
        bound on the prompt KV it keeps for reuse (0: none). memory_share: of the memory free, what the
        sequences' caches may take (--gpu-memory-utilization)."""
        self.model, self.tp, self.model_id, self.prefill_chunk = model, tp, model_id, prefill_chunk
        self.memory_share = memory_share
        self.replicas = max(1, tp.size // kv_heads)  # ranks holding the same KV head
        self.caches: dict[int, FullKVCache] = {}
        self.prefixes = PrefixStore(prefix_bytes, prefill_chunk) if prefix_bytes > 0 else None
        self.prompts: dict[int, BlockNames] = {}  # per sequence while it was prefilled in whole blocks only
        self.saved_queries: dict[int, tuple] = {}  # per sequence: its cache's query state, from save_query
        # per sequence: where its last verify started (a commit keeps at least that much), and that verify's
        # parents until a commit or a prefill cuts its tree (None since)
        self.verified: dict[int, tuple[int, list[int] | None]] = {}
        self.forwards: dict[int, list[int]] = {}  # per sequence: the token counts of its forwards, from start
        self.counts = {"requests": 0, "errors": 0, "verified_tokens": 0, "prefilled_tokens": 0, "heartbeats": 0}

    # --- execution: every rank -----------------------------------------------------------------
    def execute(self, kind: str, body: dict) -> tuple[dict, list[torch.Tensor]]:
        model = self.model
        if kind == "handshake":
            return {"model": self.model_id, "tp_size": self.tp.size, "protocol": PROTOCOL_VERSION,
                    "vocab_size": model.config.vocab_size, "dtype": str(model.dtype).removeprefix("torch."),
                    "machine": machine_key(str(model.device)),
                    "prefix_bytes": self.prefixes.max_bytes if self.prefixes is not None else 0,
                    "prefill_chunk": self.prefill_chunk}, []
        if kind == "start":
            self.caches[body["seq"]] = self._allocated_everywhere(body["capacity"])
            self.forwards[body["seq"]] = body["forwards"]
            if self.prefixes is not None:
                self.prompts[body["seq"]] = BlockNames()
            return {}, []
        if kind == "end":
            del self.caches[body["seq"]]
            for held in (self.prompts, self.saved_queries, self.verified, self.forwards):
                held.pop(body["seq"], None)
            if model.device.type == "cpu":  # its cache, back to the system now (glibc kept it: the leader's checks
                release_freed(every_s=0)  # read less free memory as the hours went by; at most once a second,
            return {}, []  # a batch's sequences ending together kept all but the first's)
        if kind == "verify":
            for seq, start, parents in zip(body["seqs"], body["starts"], body["parents"]):
                self.prompts.pop(seq, None)
                self.verified[seq] = (start, parents)
            steps = [Step.tree(tokens, parents, start, model.device)
                     for tokens, parents, start in zip(body["tokens"], body["parents"], body["starts"])]
            caches = [self.caches[seq] for seq in body["seqs"]]
            logits = model.forward_batch(steps, caches)
            self.counts["verified_tokens"] += sum(step.n for step in steps)
            # (the leader's reply carries them: the other ranks copied [n, V] to the host for nothing)
            return {"lengths": [c.length for c in caches]}, [torch.cat(logits).cpu()] if self.tp.rank == 0 else []
        if kind == "stats":
            return {**self.counts, "sequences": len(self.caches)}, []
        if kind == "shutdown":
            return {}, []
        cache = self.caches[body["seq"]]
        if kind in ("prefill", "commit") and body["seq"] in self.verified:  # the tree is cut
            self.verified[body["seq"]] = (self.verified[body["seq"]][0], None)
        if kind == "prefill":
            reused = self._prefill(body["seq"], cache, body["tokens"], body["final"])
            self.counts["prefilled_tokens"] += len(body["tokens"]) - reused
            return {"length": cache.length, "reused": reused}, []
        if kind == "commit":
            cache.keep_path(body["start"], body["path"])
            return {"length": cache.length}, []
        if kind == "save_query":
            self.saved_queries[body["seq"]] = cache.query_state()
            return {}, []
        if kind == "restore_query":
            cache.restore_query_state(self.saved_queries.pop(body["seq"]))
            return {}, []
        if kind == "kv":
            keys = cache.keys[:, :, body["start"]:body["stop"]]
            values = cache.values[:, :, body["start"]:body["stop"]]
            return {}, self._gather_heads([keys, values], head_dim=1)
        if kind == "refresh":
            # (gathered only where the choice reads them: a cache no forward has run yet holds none)
            selects = selects_chunks(cache.length, body["budget"], body["chunk_size"])
            queries = self._kv_group_queries(cache) if self.replicas > 1 and selects else None
            chosen = retrieve_from_full(cache, body["budget"], body["chunk_size"], body["full_layers"], queries)
            # Layers differ in token count (full layers keep everything): one tensor per layer and kind.
            flat = [t for pair in chosen for t in pair]
            return {"length": cache.length}, self._gather_heads(flat, head_dim=0)
        raise RequestError(f"unhandled request {kind!r}")

    def _allocated_everywhere(self, capacity: int) -> FullKVCache:
        """This rank's cache of `capacity` tokens, once every rank has allocated its own; a refusal on every
        rank alike (NoRoom, or NeverFits where the group holds no other sequence) where some rank could not.
        The leader checks the memory of its own device only: a rank on a fuller or smaller GPU failed its
        allocation alone, and the group ended."""
        cache, failure = None, None
        try:
            cache = FullKVCache(self.model.config, capacity, self.model.dtype, self.model.device)
        except Exception as exc:  # noqa: BLE001 (every rank learns how each fared before any raises)
            failure = exc
        # 1: allocated; 0: out of memory; -1: failed otherwise (a bug: the group ends, every rank alike, where
        # the leader waited in the all-reduce for a rank that had raised, and its coordinator timed out)
        state = torch.tensor([1 if failure is None else 0 if out_of_memory(failure) else -1], dtype=torch.int64,
                             device=self.model.device)
        if self.tp.size > 1:
            dist.all_reduce(state, op=dist.ReduceOp.MIN, group=self.tp.group)
        if state.item() == 1:
            return cache
        cache = None  # (freed on the ranks that allocated it)
        where = f"this rank ({type(failure).__name__})" if failure is not None else "another rank of the group"
        if state.item() < 0:
            raise RuntimeError(f"a cache of {capacity} tokens failed on {where}") from failure
        refusal = NoRoom if self.caches else NeverFits  # (every rank holds the same sequences)
        raise refusal(f"a cache of {capacity} tokens could not be allocated on {where}")

    def _prefill(self, seq: int, cache: FullKVCache, tokens: list[int], final: bool) -> int:
        """Forwards `tokens`, or restores them from the prefix store (see the module's docstring); returns
        how many were restored."""
        prompt = self.prompts.pop(seq, None)  # tracked only with a prefix store
        whole_block = prompt is not None and len(tokens) == self.prefill_chunk and \
            cache.length == len(prompt.names) * self.prefill_chunk
        if whole_block:
            self.prompts[seq] = prompt
            prompt.add(tokens)
            if not final and self.prefixes.restore_block(prompt.names, len(prompt.names) - 1, cache):
                return len(tokens)
        for i in range(0, len(tokens), self.prefill_chunk):
            self.model(Step.chain(tokens[i:i + self.prefill_chunk], cache.length, self.model.device), cache,
                       logits_for="none")
        if whole_block:
            self.prefixes.store_block(prompt.names, len(prompt.names) - 1, cache)
        return 0

    def _kv_group_queries(self, cache: FullKVCache) -> torch.Tensor:
        """[L, Hq of the group, D]: the latest query of every query head sharing this rank's replicated KV
        head, gathered from its replicas in head order, so the chunks are scored as in one process."""
        mine = torch.stack(cache.last_query).contiguous()  # [L, Hq local, D]
        parts = [torch.empty_like(mine) for _ in range(self.tp.size)]
        dist.all_gather(parts, mine, group=self.tp.group)
        first = self.tp.rank // self.replicas * self.replicas  # replicas of a KV head are consecutive ranks
        return torch.cat(parts[first:first + self.replicas], dim=1)

    def _gather_heads(self, tensors: list[torch.Tensor], head_dim: int) -> list[torch.Tensor]:
        """Each rank's KV heads -> all KV heads, on the leader (replicated heads counted once)."""
        if self.tp.size == 1:
            return [t.contiguous().cpu() for t in tensors]
        out = []
        for t in tensors:
            t = t.contiguous()
            parts = [torch.empty_like(t) for _ in range(self.tp.size)] if self.tp.rank == 0 else None
            dist.gather(t, parts, dst=dist.get_global_rank(self.tp.group, 0), group=self.tp.group)
            if self.tp.rank == 0:
                distinct = parts[:: self.replicas]
                out.append(torch.cat(distinct, dim=head_dim).cpu())
        return out
