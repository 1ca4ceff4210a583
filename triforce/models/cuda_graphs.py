"""A model's forwards of a few tokens over a full KV cache, replayed as CUDA graphs.

On a GPU a decode step of a small model waits on the host, not on the GPU: SmolLM2's took about 1,150
kernel launches and 17 ms a token on an H100 while its kernels ran 3.7 ms (benchmarks/gpu_profile.py,
docs/gpu.md). A CUDA graph launches a whole forward's kernels at once, but it replays fixed shapes
at fixed addresses, so `StaticForward` is the forward of n tokens written for that:

- its inputs are tensors filled before each run: token ids, positions, the cache length (the first slot
  the new keys and values go to) and the step's mask among its own tokens (a chain's is causal);
- every layer writes the rotated keys and values into the cache's buffers with `index_copy_` at those
  slots, and attends over the cache's whole capacity under a visibility mask built from them: every key
  before the first slot, the step's mask over the new ones, nothing after. That buys one graph per
  (cache buffers, n) that replays at every length, and costs reading the slots past the context: little
  where a cache is sized for its request (prompt + new tokens), as the engine sizes them; graphs per
  bucket of lengths would bound it otherwise.

`ForwardGraphs` is the policy: which forwards it takes (one sequence over a FullKVCache, at most
MAX_TOKENS new tokens whose mask reaches no earlier entries, no tensor parallelism, a whole vocabulary,
the cache in the model's dtype) and the StaticForwards it keeps (one per cache buffers and size, which
the next request's cache of the same size usually gets back from the allocator; the least recently used
go past MAX_GRAPHS). Every forward it takes runs the same static math, so a step's rounding never depends
on what ran before; a size is captured at its CAPTURE_AT-th forward (a short prompt's one-off prefill
runs uncaptured), and a capture that fails leaves that size uncaptured, with a warning. Models on CUDA get
one unless TRIFORCE_CUDA_GRAPHS=0. The graphs hold the addresses of the model's weights and rope tables,
which a model keeps once finalized (a forward grows the rope table only for positions past the model's
own, which a request over a full cache never reaches: requests are checked against them). Without capture the same StaticForward runs on any device: the tests
compare it with the model's own forward on the CPU.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Sequence

import torch

from ..cache.full import FullKVCache
from ..step import Step

MAX_TOKENS = 64  # a decode step and every check size the engine proposes (trees of up to 64 nodes)
MAX_GRAPHS = 64  # static forwards kept over all live caches; the least recently used goes first
CAPTURE_AT = 2  # a size's forward over the same buffers that is captured (the earlier ones run uncaptured)

log = logging.getLogger(__name__)


class _StaticCache:
    """What the model's layers see of a FullKVCache inside a StaticForward (the cache protocol's `append`):
    the new keys and values go to the step's slots, attention reads the whole buffers."""

    def __init__(self, queries: torch.Tensor):
        self.queries = queries.unbind(0)
        self.keys = self.values = self.slots = None  # set per run

    def append(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        self.keys[layer].index_copy_(1, self.slots, k)
        self.values[layer].index_copy_(1, self.slots, v)
        self.queries[layer].copy_(q)
        return self.keys[layer], self.values[layer]


def buffers_key(cache: FullKVCache, n: int) -> tuple:
    """What a StaticForward of n tokens is captured for: the cache's buffers (their addresses and shape),
    not the cache object. A request's cache dies with it, and the next request's of the same capacity
    usually gets the same memory back from the allocator: its graphs are then already captured."""
    return cache.keys.data_ptr(), cache.values.data_ptr(), tuple(cache.keys.shape), cache.keys.dtype, n


def static_forward_bytes(cfg, capacity: int, n: int, itemsize: int) -> int:
    """The buffers a StaticForward of n tokens over a cache of `capacity` holds (cfg: the model's config; its
    graph's memory pool, the forward's intermediates, is the allocator's and comes on top)."""
    return (4 * n * cfg.vocab_size  # logits, float32
            + cfg.num_layers * cfg.num_heads * n * cfg.head_dim * itemsize  # each layer's rotated queries
            + 8 * capacity  # key_index
            + 2 * n * n  # the step's mask and the causal one
            + 8 * (4 * n + 1))  # ids, positions, offsets, the new keys' slots; start


def forwards_bytes(cfg, capacity: int, sizes: Sequence[int], itemsize: int) -> int:
    """The buffers of StaticForwards of each token count in `sizes` over a cache of `capacity`."""
    return sum(static_forward_bytes(cfg, capacity, n, itemsize) for n in sizes)


class StaticForward:
    """One forward of n tokens over one pair of FullKVCache buffers, all of its shapes and addresses fixed.
    A captured graph holds no reference to the buffers: they go back to the allocator with their cache."""

    def __init__(self, model, cache: FullKVCache, n: int, capture: bool, pool=None, failed=None, stream=None):
        """capture: whether its CAPTURE_AT-th run captures a CUDA graph that later runs replay, on `stream`
        into `pool`; `failed(error)` is told where a capture fails."""
        cfg, device = model.config, model.device
        self.model, self.n = model, n
        self.ids = torch.zeros(n, dtype=torch.long, device=device)
        self.positions = torch.zeros(n, dtype=torch.long, device=device)
        self.start = torch.zeros(1, dtype=torch.long, device=device)  # the cache length before the step
        self.tail = torch.ones(n, n, dtype=torch.bool, device=device).tril()  # the step's mask
        self.causal = self.tail.clone()
        self.tail_is_causal = True  # a chain after a chain needs no copy into `tail`
        self.offsets = torch.arange(n, device=device)
        self.key_index = torch.arange(cache.capacity, device=device).unsqueeze(0)  # [1, capacity]
        self.view = _StaticCache(torch.zeros(cfg.num_layers, cfg.num_heads, n, cfg.head_dim, dtype=model.dtype,
                                             device=device))  # each layer's rotated queries, for last_query
        self.logits = torch.zeros(n, cfg.vocab_size, device=device)  # float32, written by every run
        self.capture, self.pool, self.stream, self.runs = capture, pool, stream, 0
        self.graph, self.failed = None, failed or (lambda error: None)

    def _run(self) -> None:
        n, model, view = self.n, self.model, self.view
        view.slots = self.start + self.offsets  # [n]
        cos, sin = model.rope.cos_sin(self.positions, model.dtype)
        visible = (self.key_index < self.start).repeat(n, 1)  # [n, capacity]: the keys before the step
        visible.index_copy_(1, view.slots, self.tail)
        x = model.embed_tokens(self.ids)
        for layer in model.layers:
            x = layer(x, [view], [visible], [n], cos, sin)
        self.logits.copy_(model.lm_head(model.norm(x)))

    def __call__(self, step: Step, cache: FullKVCache, want: str) -> torch.Tensor | None:
        """Runs `step` (n tokens, mask None or [n, n]) over `cache` as the model's forward would, and
        returns its logits as forward_batch does for `want` ('all', 'last', 'none')."""
        cache.begin(step)  # checks the room for n more, before anything is written
        self.ids.copy_(step.tokens, non_blocking=True)
        self.positions.copy_(step.positions, non_blocking=True)
        self.start.fill_(cache.length)
        if step.mask is not None or not self.tail_is_causal:
            self.tail.copy_(self.causal if step.mask is None else step.mask, non_blocking=True)
            self.tail_is_causal = step.mask is None
        self.runs += 1
        if self.graph is None:
            self.view.keys, self.view.values = cache.keys.unbind(0), cache.values.unbind(0)
            try:
                if self.capture and self.runs >= CAPTURE_AT:
                    self._capture()
                else:
                    self._run()
            finally:
                self.view.keys = self.view.values = None
        if self.graph is not None:
            self.graph.replay()  # a capture records the kernels without running them
        cache.written(self.view.queries)
        cache.end()
        if want == "none":
            return None
        return (self.logits if want == "all" else self.logits[-1:]).clone()  # the next run overwrites them

    def _capture(self) -> None:  # pragma: no cover - CUDA only
        # A first run on a side stream warms up what a graph cannot allocate while capturing (cuBLAS
        # workspaces, the caching allocator); it computes this step. The capture runs nothing: the caller
        # replays it (writing the same keys and values again). Errors from other threads' CUDA calls (a
        # server's) do not break a capture in thread_local mode.
        with torch.cuda.device(self.model.device):
            side = self.stream  # every capture's: a pool reuses a freed block only for the stream it was on
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self._run()
            torch.cuda.current_stream().wait_stream(side)
            graph, before = torch.cuda.CUDAGraph(), torch.cuda.current_stream()
            try:  # on a stream of this device's own (torch's default capture stream is made on the first
                # device that captures), put back whatever happens: torch's exit ends the capture before it
                # restores the stream, and a failed end left this thread on the capture stream
                with torch.cuda.graph(graph, pool=self.pool, stream=side, capture_error_mode="thread_local"):
                    self._run()
            except RuntimeError as error:
                self.capture = False  # the warm-up computed the step
                if not isinstance(error, torch.OutOfMemoryError):  # (memory short for now: this forward alone
                    self.failed(error)  # runs uncaptured) nor any other size from now on
                return
            finally:
                torch.cuda.set_stream(before)
            self.graph = graph


class ForwardGraphs:
    """A model's StaticForwards, one per (cache buffers, token count), and which forwards they take."""

    def __init__(self, model, capture: bool):
        self.model, self.capture = model, capture
        self.pool = torch.cuda.graph_pool_handle() if capture else None  # one memory pool for all graphs,
        # captured on one stream (a new stream for each, of torch's 32 in turn, kept the pool from reusing a
        # freed block of another's: up to 32 captures' temporaries held)
        self.stream = torch.cuda.Stream(model.device) if capture else None
        self._forwards: dict[tuple, StaticForward] = {}  # in order of last use

    @classmethod
    def for_model(cls, model) -> "ForwardGraphs | None":
        """Graphs for a model on CUDA (None elsewhere, for a rank's shard of a model, whose forwards meet the
        other ranks' in collectives, or with TRIFORCE_CUDA_GRAPHS=0)."""
        if model.device.type != "cuda" or model.tp is not None or os.environ.get("TRIFORCE_CUDA_GRAPHS", "1") == "0":
            return None
        return cls(model, capture=True)

    def takes(self, steps: Sequence[Step], caches: Sequence) -> bool:
        if len(steps) != 1 or type(caches[0]) is not FullKVCache:
            return False
        step, cache = steps[0], caches[0]
        return (step.n <= MAX_TOKENS and (step.mask is None or step.mask.shape[1] == step.n)
                and self.model.vocab is None and cache.keys.device == self.model.device
                and cache.keys.dtype == self.model.dtype)

    def __call__(self, steps: Sequence[Step], caches: Sequence, wants: Sequence[str]) -> list | None:
        """forward_batch's result for these steps, or None where the model must run its own forward."""
        if not self.takes(steps, caches):
            return None
        step, cache = steps[0], caches[0]
        key = buffers_key(cache, step.n)
        forward = self._forwards.pop(key, None)
        if forward is None:
            forward = StaticForward(self.model, cache, step.n, self.capture, self.pool, self._capture_failed,
                                    self.stream)
            while len(self._forwards) >= MAX_GRAPHS:
                self._forwards.pop(next(iter(self._forwards)))
        self._forwards[key] = forward
        return [forward(step, cache, wants[0])]

    def __len__(self) -> int:
        return len(self._forwards)

    def _capture_failed(self, error: Exception) -> None:  # pragma: no cover - CUDA only
        """A capture failed: a failure is the same at every size, and each failed one disturbed the
        allocator's capture state, so no forward of this model captures again (nor those made before)."""
        log.warning("CUDA graph capture of a forward failed (%s); this model's forwards run uncaptured", error)
        self.capture = False
        for forward in self._forwards.values():
            forward.capture = False

    def made(self, cache: FullKVCache) -> set[int]:
        """The token counts of the StaticForwards made over `cache`'s buffers so far (an earlier cache's
        there among them: the allocator hands its memory to the next)."""
        buffers = buffers_key(cache, 0)[:-1]
        return {key[-1] for key in self._forwards if key[:-1] == buffers}

    def held_bytes(self, cache: FullKVCache) -> int:
        """The buffers of the StaticForwards made over `cache`'s buffers so far."""
        return forwards_bytes(self.model.config, cache.capacity, sorted(self.made(cache)), self.model.dtype.itemsize)
