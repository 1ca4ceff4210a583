"""StreamingKVCache: attention sinks plus a recent window (StreamingLLM, arXiv 2309.17453).

StreamingLLM numbers the keys by their place *inside the cache*: the sinks keep their positions
(0..sinks-1) and the window's first key sits right after them, the rest and the new queries following at
their offsets, so the model never sees a distance past sinks + window + n, however long the text grows.
RoPE scores depend only on the distance between a query's and a key's positions, so the same scores come
from rotating every window key and query at its own position in the text, once, and turning only the
sinks by the shift (the window's first position less `sinks`) in each forward once the window has slid
past them (before, every key sits at its own position already): keys are stored rotated
(the model rotates a forward's new queries and keys at their positions), and a forward turns the sinks,
not the window. Tree nodes keep their depths (siblings share a position).

Visible to a forward over n new tokens: the first `sinks` tokens, the last `window` tokens absorbed
before it, and the n new ones (a tree grown over several forwards counts its earlier levels' nodes,
siblings included, against the window). Rollback after the window has slid is exact because the store keeps
`window + max_rollback` recent tokens: tokens that left the window recently are still there to come
back. A rollback deeper than `max_rollback` raises rather than silently attending to a wrong window.

The fused layer loop (kernels/decoder.py) takes a forward of up to VIEW_ROWS tokens past the sinks
(`layer_buffers`), so that the draft's steps run as one kernel call instead of about 20 torch calls per
layer: it reads one buffer per layer, sinks then window, and writes the new tokens after them. That
buffer (the view) mirrors the store one slot up per sink, so a forward writes only the turned sinks into
the slots just before its window (those of entries that left it) and copies from the store only what
the view does not hold yet: entries a rollback brought back into the window, or all of it after the
layer loop or a compaction wrote the store alone; `end` copies the new tokens into the store. And on a
CPU the sinks are turned for TURN_BLOCK shifts at once, the shifts a draft's next forwards take. (Before,
each forward copied the whole window and turned the sinks: 0.26 ms of a 1.39 ms step of the shipped draft
alone, 1.54 of 4.73 ms at batch 8; now 0.13 and 0.69: `python benchmarks/streaming_ab.py --hooks`.)
"""
from __future__ import annotations

import torch

from ..kernels.fused import rope as rotate
from ..models.config import ModelConfig
from ..models.rope import RotaryEmbedding
from ..step import Step
from .base import KVCache, LayerBuffers

VIEW_ROWS = 64  # new tokens of a forward that the fused layer loop takes (chains, tree levels; not prefill chunks)
TURN_BLOCK = 16  # shifts whose turned sinks one rotation computes, on a CPU (the docstring)


class StreamingKVCache(KVCache):
    def __init__(self, cfg: ModelConfig, sinks: int, window: int, max_rollback: int, rope: RotaryEmbedding,
                 dtype: torch.dtype, device: torch.device | str):
        if sinks < 0 or window < 1 or max_rollback < 0:
            # (a negative max_rollback kept fewer tokens than the window through a compaction: wrong keys, silently)
            raise ValueError(f"streaming cache needs sinks >= 0, window >= 1 and max_rollback >= 0 (got {sinks}, "
                             f"{window}, {max_rollback})")
        self.sinks, self.window, self.max_rollback, self.rope = sinks, window, max_rollback, rope
        self._keep = window + max_rollback  # recent tokens that must survive a compaction
        shape = (cfg.num_layers, cfg.num_kv_heads, sinks, cfg.head_dim)
        self.sink_k = torch.zeros(shape, dtype=dtype, device=device)  # [L, Hkv, sinks, D] rotated at their positions
        self.sink_v = torch.zeros(shape, dtype=dtype, device=device)
        self.sink_pos = torch.zeros(sinks, dtype=torch.long, device=device)  # [sinks] positions
        self._alloc_recent(2 * self._keep)
        self.length = 0
        self._offset = 0  # sequence index of recent_k[:, :, 0]
        self._n = 0
        # The view: [L, Hkv, sinks + store size, D] keys, values, the store's entry i in slot sinks + i, all
        # from `_mirrored` on (none: None) as the store holds them
        self._view: tuple[torch.Tensor, torch.Tensor] | None = None
        self._mirrored: int | None = None
        self._fused = False  # the forward in progress writes into the view (layer_buffers), not the store
        self._turned: tuple[int, torch.Tensor] | None = None  # first shift, [L, Hkv, TURN_BLOCK, sinks, D]

    def _alloc_recent(self, size: int, keep: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> None:
        like = self.sink_k
        shape = (like.shape[0], like.shape[1], size, like.shape[3])
        new_k = torch.zeros(shape, dtype=like.dtype, device=like.device)  # [L, Hkv, size, D] rotated likewise
        new_v = torch.zeros_like(new_k)
        new_pos = torch.zeros(size, dtype=torch.long, device=like.device)  # [size] positions
        if keep is not None:
            n = keep[0].shape[2]
            new_k[:, :, :n], new_v[:, :, :n], new_pos[:n] = keep
        self.recent_k, self.recent_v, self.recent_pos = new_k, new_v, new_pos
        self._mirrored = None  # the entries moved

    def _recent_index(self, seq_index: int) -> int:
        return max(seq_index, self.sinks) - self._offset

    def begin(self, step: Step) -> None:
        n, start = step.n, self.length
        stored = self._recent_index(start)
        if stored + n > self.recent_k.shape[2]:
            # Compact: keep the last `window + max_rollback` tokens at the front of the store.
            keep_from = max(self.sinks, start - self._keep, self._offset)
            a = keep_from - self._offset
            kept = (self.recent_k[:, :, a:stored].clone(), self.recent_v[:, :, a:stored].clone(),
                    self.recent_pos[a:stored].clone())
            size = max(self.recent_k.shape[2], 2 * (stored - a + n))
            self._alloc_recent(size, kept)
            self._offset = keep_from
        if step.mask is not None and step.mask.shape[1] - n > self.window:
            raise ValueError(f"a step's mask reaches {step.mask.shape[1] - n} entries back, past the "
                             f"streaming window of {self.window}")
        self._n = n
        to_sink = max(0, min(n, self.sinks - start))
        if to_sink:
            self.sink_pos[start:start + to_sink] = step.positions[:to_sink]
            self._turned = None  # the sinks change
        a = self._recent_index(start + to_sink)
        self.recent_pos[a:a + n - to_sink] = step.positions[to_sink:]
        # The window: the last `window` tokens before the step, of those stored (none before a skip).
        first = max(self.sinks, start - self.window, self._offset)
        self._window = (self._recent_index(first), self._recent_index(start + n))
        # The sinks, turned by the shift (the window's first position less `sinks`) to sit right before the
        # window: [L, Hkv, sinks, D]. None while the window follows them: every key keeps its own position
        # (a tree's siblings in the first window slots sit lower than their slots, and turned the sinks).
        self._sinks_now = self.sink_k[:, :, :min(start + n, self.sinks)]
        if first > self.sinks > 0:
            self._sinks_now = self._turned_sinks(self.recent_pos[self._window[0]] - self.sinks)

    def _turned_sinks(self, shift: torch.Tensor) -> torch.Tensor:
        """The sinks turned by `shift` (a tensor: reading it would wait for a GPU): [L, Hkv, sinks, D]. On a
        CPU from a block of TURN_BLOCK shifts turned at once (row by row, so bit for bit as one by one)."""
        layers, heads, sinks, dim = self.sink_k.shape
        if self.sink_k.device.type != "cpu":
            by, block = shift.expand(sinks), 1
        else:
            shift = int(shift)
            if self._turned is not None and 0 <= shift - self._turned[0] < TURN_BLOCK:
                return self._turned[1][:, :, shift - self._turned[0]]
            by, block = torch.arange(shift, shift + TURN_BLOCK).repeat_interleave(sinks), TURN_BLOCK
        keys = self.sink_k.reshape(layers * heads, sinks, dim)
        keys = keys.repeat(1, block, 1) if block > 1 else keys
        turned = rotate(keys, *self.rope.turn(by, self.sink_k.dtype)).view(layers, heads, block, sinks, dim)
        if block > 1:
            self._turned = (shift, turned)
        return turned[:, :, 0]

    def append(self, layer, q, k, v):
        self._fused, self._mirrored = False, None  # the layer loop runs: it writes the store alone
        n, start = self._n, self.length
        to_sink = max(0, min(n, self.sinks - start))
        if to_sink:
            self.sink_k[layer, :, start:start + to_sink] = k[:, :to_sink]
            self.sink_v[layer, :, start:start + to_sink] = v[:, :to_sink]
        if n > to_sink:
            a = self._recent_index(start + to_sink)
            self.recent_k[layer, :, a:a + n - to_sink] = k[:, to_sink:]
            self.recent_v[layer, :, a:a + n - to_sink] = v[:, to_sink:]
        n_sink = min(start + n, self.sinks)
        window = slice(*self._window)
        keys = torch.cat((self._sinks_now[layer], self.recent_k[layer, :, window]), dim=1)
        values = torch.cat((self.sink_v[layer, :, :n_sink], self.recent_v[layer, :, window]), dim=1)
        return keys, values

    def layer_buffers(self) -> LayerBuffers | None:
        """For a forward of up to VIEW_ROWS tokens past the sinks: the view of every layer from the turned
        sinks on, then the window, for the new tokens to follow (`end` stores them; the docstring)."""
        n, start = self._n, self.length
        if n > VIEW_ROWS or start < self.sinks:
            return None
        first, end = self._window[0], self._window[1] - n  # the window before the new tokens (store indices)
        keys, values = self._mirror(first, end)
        slots = slice(first, first + self.sinks)  # those of the entries just before the window
        keys[:, :, slots], values[:, :, slots] = self._sinks_now, self.sink_v
        self._mirrored, self._fused = first, True
        return LayerBuffers(list(keys[:, :, first:]), list(values[:, :, first:]),
                            [self.sinks + end - first] * len(keys), None)

    def _mirror(self, first: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The view, holding the store's entries first..end-1 (copied where it did not hold them yet)."""
        layers, heads, size, dim = self.recent_k.shape
        if self._view is None or self._view[0].shape[2] != self.sinks + size:
            shape = (layers, heads, self.sinks + size, dim)
            self._view, self._mirrored = (self.recent_k.new_zeros(shape), self.recent_k.new_zeros(shape)), None
        keys, values = self._view
        held = end if self._mirrored is None else min(self._mirrored, end)
        if first < held:
            window = slice(self.sinks + first, self.sinks + held)
            keys[:, :, window], values[:, :, window] = self.recent_k[:, :, first:held], self.recent_v[:, :, first:held]
        return keys, values

    def end(self) -> None:
        if self._fused:  # the new tokens' rotated keys and values, from the view into the store
            n, (keys, values) = self._n, self._view
            a = self._recent_index(self.length)
            self.recent_k[:, :, a:a + n] = keys[:, :, self.sinks + a:self.sinks + a + n]
            self.recent_v[:, :, a:a + n] = values[:, :, self.sinks + a:self.sinks + a + n]
            self._fused = False
        super().end()

    def skippable(self, end: int) -> int:
        """How many of the next tokens need no KV when the cache is to hold the sequence up to `end`: those
        that would leave the window before the forward after `end` reads it (the sinks are always kept)."""
        return max(0, end - self.window - max(self.length, self.sinks)) if self.length >= self.sinks else 0

    def before_skip(self, end: int) -> int | None:
        """The sinks still missing, where the tokens after them would leave the window unread (a chunk that
        ran past the sinks computed tokens that the skip then threw away: a draft's prefill ran two chunks of
        its window where the sinks and one would do)."""
        return self.sinks - self.length if self.length < self.sinks < end - self.window else None

    def skip(self, n: int) -> None:
        """Counts the next n tokens as absorbed and already evicted, without computing them (a prefill of a
        long prompt needs only the sinks and the last window). Later tokens see the sinks and the tokens fed
        after the skip; a rollback into the skipped tokens raises."""
        if self.length < self.sinks or n < 0:
            raise ValueError(f"a streaming cache skips tokens past its {self.sinks} sinks only")
        self.length += n
        self._offset, self._mirrored = self.length, None  # the store starts afresh with the next token

    @property
    def settled(self) -> bool:
        return max(self.sinks, self.length - self.window) >= self._offset  # what a rollback to it needs

    def rollback(self, n: int) -> None:
        self._check_rollback(n, self.length)
        new_length = self.length - n
        if max(self.sinks, new_length - self.window) < self._offset:
            raise ValueError(f"streaming cache cannot roll back {n} tokens: it keeps {self.max_rollback} "
                             "evicted tokens for rollback")
        self.length = new_length

    def _move(self, src: list[int], dst: list[int]) -> None:
        for a, b in zip(src, dst):  # a few entries (a kept path); increasing, so none is overwritten unread
            (from_k, from_v, from_pos), i = self._slot(a)
            (to_k, to_v, to_pos), j = self._slot(b)
            to_k[:, :, j], to_v[:, :, j], to_pos[j] = from_k[:, :, i], from_v[:, :, i], from_pos[i]
            if to_k is self.sink_k:
                self._turned = None
            elif self._mirrored is not None and j >= self._mirrored:  # the view's copy of it
                self._view[0][:, :, self.sinks + j], self._view[1][:, :, self.sinks + j] = to_k[:, :, j], to_v[:, :, j]

    def _slot(self, seq_index: int):
        """(the store's keys, values and positions, index) of an entry."""
        if seq_index < self.sinks:
            return (self.sink_k, self.sink_v, self.sink_pos), seq_index
        return (self.recent_k, self.recent_v, self.recent_pos), self._recent_index(seq_index)

    def reset(self) -> None:
        self.length, self._offset, self._mirrored, self._turned = 0, 0, None, None
