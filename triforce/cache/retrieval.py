"""RetrievalKVCache: a fixed budget of KV chunks taken from the target's full cache (TriForce, sec. 4.1).

Per layer and per KV head, the cache holds the chunks whose mean key best matches the query (see
kernels/retrieval.py), chunk 0 always. Its tokens are all committed tokens' KV from the full cache (the
*source*; copied, except where a layer reads a local source's buffer in place), never this tier's own
speculative KV: after the target commits, `sync` drops the speculative entries and takes the committed
tokens from the source, so generations longer than the budget stay correct.

Selection policies:
- `static` (the paper): chunks chosen once by `rebuild` with the query of the source's last token (after
  a target check, the last it kept: `FullKVCache.last_query`, not a rejected proposal's); tokens committed
  since are appended as a tail; rebuilt when the tail reaches `refresh_every` tokens or on request
  (the tier asks when acceptance drops).
- `dynamic` (Quest-style): chunks re-chosen at every forward, from the query of the forward's *first*
  token against the mean keys, which are kept up to date at each sync; the extra cost is reading the
  means, about 1/chunk_size of the keys.
Both read the source's chunk means (cache/chunk_means.py), which average each chunk once, when it
completes: a rebuild costs what it selects and the chunks added since the last one, not the context; a
static rebuild over a local source copies only the chunks its choice changed into the last one's buffers
(refill_chunks: SmolLM2 + yarn:4 at 16K, 72 -> 16 ms a rebuild after 4 new tokens on the 2-core AVX2
EPYC, `benchmarks/retrieval_fidelity.py --rebuild-timing`).

Why the first token only (exactness): a forward's row i reports the distribution of position p_0 + i + 1,
and speculative verification assumes that distribution does not depend on the proposals it checks,
the tokens at positions > p_0 + i. The first token is never one of them (the engine feeds the last
accepted token before any proposal), so a choice made from its query depends only on the prefix every
row shares. Choosing from all rows (the sum of their queries) let the proposal at position j change
the chunks that judge it: the tier then sampled from a distribution other than the one it reported.
The static policy is exact for the same reason: its choice is fixed between target checks.
The first `full_layers` layers see the whole source (the paper's acceptance table bypasses two layers): a local
source's own buffers, read in place by either policy.

The source is a `KVSource`: `LocalKVSource` wraps a FullKVCache in this process; the distributed
coordinator's remote source asks the worker group, which runs `retrieve_from_full` on its shards and
sends back the chosen KV (static policy only: the dynamic one reads the mean keys at every step).
"""
from __future__ import annotations

import torch

from ..kernels.retrieval import chunk_token_ids, gather_tokens, refill_chunks, select_chunks
from ..step import Step
from .base import CacheCapacityError, KVCache, LayerBuffers, move_slots
from .full import FullKVCache

POLICIES = ("static", "dynamic")


def retrieval_token_ids(chosen: torch.Tensor, chunk_size: int, complete: int, end: int) -> torch.Tensor:
    """[Hkv, T]: the tokens of the chosen chunks [Hkv, k], then every token from the end of the last
    complete chunk up to `end` (the tail, and in the dynamic policy this tier's own tokens)."""
    recent = torch.arange(complete * chunk_size, end, device=chosen.device)
    return torch.cat((chunk_token_ids(chosen, chunk_size), recent.expand(chosen.shape[0], -1)), dim=1)


def selects_chunks(length: int, budget: int, chunk_size: int) -> bool:
    """Whether a static choice over `length` tokens selects chunks (and reads the last query): a sequence
    that fits the budget and a chunk keeps everything."""
    return length > budget + chunk_size


def choose_chunks(full: FullKVCache, budget: int, chunk_size: int, full_layers: int,
                  queries: torch.Tensor | None = None) -> torch.Tensor | None:
    """The static policy's choice for the layers from `full_layers` on: the chunks [L - full_layers, Hkv,
    budget // chunk_size] whose mean key best matches the full cache's latest query, every layer's in one
    selection. None where every layer keeps the whole cache (a sequence that fits the budget).

    queries: [L, Hq, D], the latest query of every query head of the cache's KV heads, when the cache
    does not hold them all: a tensor-parallel rank whose KV head is replicated on other ranks holds
    only its own query heads, but a KV head's chunks are scored with all of its group's."""
    if not selects_chunks(full.length, budget, chunk_size) or full_layers >= full.keys.shape[0]:
        return None
    queries = torch.stack(full.last_query[full_layers:]) if queries is None else queries[full_layers:]
    return select_chunks(queries.unsqueeze(-2), full.chunk_means(chunk_size)[full_layers:], budget // chunk_size)


def retrieve_from_full(full: FullKVCache, budget: int, chunk_size: int, full_layers: int,
                       queries: torch.Tensor | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, (keys, values) [Hkv, T, D] of the chunks `choose_chunks` chose, then the tail; the whole
    cache where it chose none (what a worker group sends the coordinator's retrieval cache)."""
    total = full.length
    chosen = choose_chunks(full, budget, chunk_size, full_layers, queries)
    out = []
    for layer in range(full.keys.shape[0]):
        if chosen is None or layer < full_layers:
            out.append((full.keys[layer, :, :total], full.values[layer, :, :total]))
        else:
            ids = retrieval_token_ids(chosen[layer - full_layers], chunk_size, total // chunk_size, total)
            out.append(gather_tokens(ids, full.keys[layer], full.values[layer]))
    return out


class LocalKVSource:
    """The target's full cache in this process, as the retrieval cache reads it."""

    def __init__(self, full: FullKVCache):
        self.full = full
        self.capacity = full.capacity
        self.num_layers, self.num_kv_heads, _, self.head_dim = full.keys.shape
        self.dtype, self.device = full.keys.dtype, full.keys.device

    @property
    def length(self) -> int:
        return self.full.length

    def retrieve(self, budget: int, chunk_size: int, full_layers: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """What a worker group's source sends (the retrieval cache of this process takes `choose`)."""
        return retrieve_from_full(self.full, budget, chunk_size, full_layers)

    def choose(self, budget: int, chunk_size: int, full_layers: int) -> torch.Tensor | None:
        return choose_chunks(self.full, budget, chunk_size, full_layers)

    def committed(self, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values [L, Hkv, stop - start, D] of committed positions [start, stop)."""
        return self.full.keys[:, :, start:stop], self.full.values[:, :, start:stop]


class RetrievalKVCache(KVCache):
    def __init__(self, source, budget: int, chunk_size: int, policy: str = "static",
                 full_layers: int = 0, refresh_every: int = 1024, max_speculative: int = 64):
        if policy not in POLICIES:
            raise ValueError(f"retrieval policy must be one of {POLICIES}, not {policy!r}")
        if chunk_size < 1 or budget < 2 * chunk_size or budget % chunk_size:
            raise ValueError(f"budget ({budget}) must be a multiple of the chunk size ({chunk_size}), at least "
                             "two chunks (the first and the latest are always kept)")
        if policy == "dynamic" and not isinstance(source, LocalKVSource):
            raise ValueError("the dynamic retrieval policy needs the target's full cache in this process")
        self.source, self.budget, self.chunk_size, self.policy = source, budget, chunk_size, policy
        self.full_layers, self.refresh_every, self.max_speculative = full_layers, refresh_every, max_speculative
        self.num_layers = source.num_layers
        # Speculative (uncommitted) entries of this tier: static keeps them in its per-layer buffer,
        # right after the committed part; dynamic, and static in a layer it reads in place, writes them
        # into the source's free slots past its length, which the target overwrites with its own KV when
        # it checks the same positions.
        self.synced = 0  # committed tokens absorbed from the source
        self.spec_len = 0
        self.rebuilds = 0
        self._n = 0
        # static: per-layer buffers [Hkv, cap, D] = [retrieved | tail since build | speculative]
        self._buf_k: list[torch.Tensor] = []
        self._buf_v: list[torch.Tensor] = []
        self._retrieved: list[int] = []
        # local source: the chunks [L - full_layers, Hkv, k] that _chosen_kv's slots hold (its keys, values)
        self._held: torch.Tensor | None = None
        self._chosen_kv: tuple[torch.Tensor, torch.Tensor] | None = None
        self._built_at = 0
        # dynamic: the mean keys of the source's complete chunks at the last sync, [L, Hkv, C, D]
        self._means: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return self.synced + self.spec_len

    # --- building from the source -------------------------------------------------------------
    def rebuild(self) -> None:
        """Static policy: choose chunks afresh with the source's latest query. A layer that keeps the whole
        source in this process (the first `full_layers`; every layer while the context fits the budget)
        reads the source's own buffer, its speculative tokens in the free slots past the source's length
        as the dynamic policy's: copied, it cost a copy of the whole context per rebuild, and held one.
        A local source's chosen chunks go into the buffers of the last rebuild, over the chunks no longer
        chosen (refill_chunks): at 16K a rebuild had allocated and filled every layer's buffer afresh, 72 ms
        of SmolLM2, a target step's time."""
        if isinstance(self.source, LocalKVSource):
            self._refill(self.source.choose(self.budget, self.chunk_size, self.full_layers))
        else:
            self._fill(self.source.retrieve(self.budget, self.chunk_size, self.full_layers))
        self._built_at = self.synced = self.source.length
        self.spec_len = 0
        self.rebuilds += 1

    def _fill(self, retrieved: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Buffers that begin with the retrieved keys and values of each layer (a worker group's choice)."""
        self._buf_k, self._buf_v, self._retrieved = [], [], []
        for keys, values in retrieved:
            buf_k = keys.new_empty(keys.shape[0], keys.shape[1] + self.refresh_every + self.max_speculative,
                                   keys.shape[2])
            buf_v = torch.empty_like(buf_k)
            buf_k[:, : keys.shape[1]], buf_v[:, : keys.shape[1]] = keys, values
            self._buf_k.append(buf_k)
            self._buf_v.append(buf_v)
            self._retrieved.append(keys.shape[1])

    def _refill(self, chosen: torch.Tensor | None) -> None:
        """The local source's buffer read in place by the layers without a choice (`chosen` [L - full_layers,
        Hkv, k], None: every layer), by the others one buffer [L - full_layers, Hkv, cap, D] each for keys and
        values: the chosen chunks, a chunk's room for the tail (the tokens past the last complete chunk) and
        the tokens until the next rebuild; the last rebuild's, where it holds chunks of this budget and the
        source has not shrunk since (every chunk it holds is still the cache's)."""
        full, total, chunk = self.source.full, self.source.length, self.chunk_size
        whole = full.keys.shape[0] if chosen is None else self.full_layers
        self._buf_k, self._buf_v = list(full.keys[:whole]), list(full.values[:whole])
        self._retrieved = [total] * whole
        if chosen is None:
            self._held = self._chosen_kv = None
            return
        slots, tail = chosen.shape[-1] * chunk, total - total // chunk * chunk
        if self._held is None or self._held.shape != chosen.shape or total < self._built_at:
            self._held = None
            shape = (*chosen.shape[:2], slots + chunk + self.refresh_every + self.max_speculative, full.keys.shape[-1])
            self._chosen_kv = (full.keys.new_empty(shape), full.values.new_empty(shape))
        sources = (full.keys[whole:], full.values[whole:])
        self._held = refill_chunks(self._chosen_kv, self._held, chosen, sources, chunk).view(chosen.shape)
        for buffer, source in zip(self._chosen_kv, sources):
            buffer[:, :, slots:slots + tail] = source[:, :, total - tail:total]
        self._buf_k += list(self._chosen_kv[0])
        self._buf_v += list(self._chosen_kv[1])
        self._retrieved += [slots + tail] * chosen.shape[0]

    def _source_buffer(self, layer: int, keys: torch.Tensor) -> bool:
        """Whether `keys` is the local source's own buffer of `layer` (a view of it, which begins where that
        buffer does): a static choice of the whole source, read in place, not chunks gathered into a copy. By
        storage and offset: an empty view's data_ptr is 0 (a source that holds no token, as after a prompt of
        one), and every layer was taken for a copy of refresh_every tokens that no memory check counted."""
        if not isinstance(self.source, LocalKVSource):
            return False
        own = self.source.full.keys[layer]
        return keys.untyped_storage().data_ptr() == own.untyped_storage().data_ptr() and \
            keys.storage_offset() == own.storage_offset()

    def sync(self) -> None:
        """Drop speculative entries; absorb the tokens the source committed since the last sync."""
        self.spec_len = 0
        total = self.source.length
        if self.policy == "dynamic":
            self._means = self.source.full.chunk_means(self.chunk_size)
            self.synced = total
            return
        if not self._buf_k or total - self._built_at > self.refresh_every:
            self.rebuild()
            return
        if total > self.synced:
            keys, values = self.source.committed(self.synced, total)  # [L, Hkv, n, D]
            for layer in range(self.num_layers):
                if self._source_buffer(layer, self._buf_k[layer]):  # (the source's own buffer holds them)
                    continue
                a = self._retrieved[layer] + self.synced - self._built_at
                b = a + total - self.synced
                self._buf_k[layer][:, a:b], self._buf_v[layer][:, a:b] = keys[layer], values[layer]
        self.synced = total

    # --- the KVCache protocol -------------------------------------------------------------------
    def begin(self, step: Step) -> None:
        n = step.n
        if not (self._buf_k if self.policy == "static" else self._means is not None):
            # (dynamic: its tokens would go to the source's slots from 0 on, over the target's own KV)
            raise RuntimeError("retrieval cache used before its first sync with the source")
        if self.spec_len + n > self.max_speculative:
            raise CacheCapacityError(f"retrieval cache holds {self.max_speculative} speculative tokens; "
                                     f"{self.spec_len} + {n} requested")
        if self.length + n > self.source.capacity:
            raise CacheCapacityError(f"the target's cache holds {self.source.capacity} tokens; "
                                     f"{self.length} + {n} requested")
        self._n = n

    def append(self, layer, q, k, v):
        lo, hi = self.spec_len, self.spec_len + self._n
        if self.policy == "static":
            at, end = self._static_offset(layer), self._static_offset(layer) + self._n
            buf_k, buf_v = self._buf_k[layer], self._buf_v[layer]
            buf_k[:, at:end], buf_v[:, at:end] = k, v
            return buf_k[:, :end], buf_v[:, :end]
        src_k, src_v = self.source.full.keys[layer], self.source.full.values[layer]  # [Hkv, capacity, D]
        src_k[:, self.synced + lo: self.synced + hi], src_v[:, self.synced + lo: self.synced + hi] = k, v
        end = self.synced + hi
        if layer < self.full_layers or self.synced <= self.budget + self.chunk_size:
            return src_k[:, :end], src_v[:, :end]
        # The first row's query only: see the module docstring (a later row may be a proposal).
        means = self._means[layer]
        chosen = select_chunks(q[:, :1], means, self.budget // self.chunk_size)
        token_ids = retrieval_token_ids(chosen, self.chunk_size, means.shape[1], end)
        return gather_tokens(token_ids, src_k, src_v)

    def _static_offset(self, layer: int) -> int:
        """Where the forward in progress writes its tokens in a static buffer: after the retrieved
        chunks, the tokens committed since the build and the speculative ones before it."""
        return self._retrieved[layer] + self.synced - self._built_at + self.spec_len

    def layer_buffers(self) -> LayerBuffers | None:
        if self.policy != "static":
            return None
        offsets = [self._static_offset(layer) for layer in range(self.num_layers)]
        return LayerBuffers(self._buf_k, self._buf_v, offsets, None)

    def end(self) -> None:
        self.spec_len += self._n
        self._n = 0

    def rollback(self, n: int) -> None:
        self._check_rollback(n, self.spec_len)  # committed tokens are the source's, never rolled back
        self.spec_len -= n

    def _move(self, src: list[int], dst: list[int]) -> None:
        """Speculative entries only (rollback refuses to reach committed ones): in the static buffers past
        the committed part, in the dynamic policy (and a static layer read in place) in the source's free
        slots. Those slots are shared: once
        the target has run past `synced` it has written its own KV there, keeps its own path, and this
        cache's entries are gone until the next sync, so there is nothing of this cache's to move."""
        if self.policy == "dynamic":
            if self.source.length <= self.synced:
                move_slots((self.source.full.keys, self.source.full.values), src, dst, dim=2)
            return
        for layer in range(self.num_layers):
            if self._source_buffer(layer, self._buf_k[layer]) and self.source.length > self.synced:
                continue  # (the source's slots, where the target has written its own)
            shift = self._retrieved[layer] - self._built_at  # buffer index of a sequence index
            move_slots((self._buf_k[layer], self._buf_v[layer]), [i + shift for i in src], [i + shift for i in dst],
                       dim=1)

    def reset(self) -> None:
        self.synced = self.spec_len = self._built_at = 0
        self._means = None
        self._buf_k, self._buf_v, self._retrieved = [], [], []
        self._held = self._chosen_kv = None
