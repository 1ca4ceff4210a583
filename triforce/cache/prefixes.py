"""PrefixStore: the target's full KV cache of recently prefilled prompts, kept so that a later prompt that
begins the same way (many questions about one long document) skips prefilling what they share.

The store holds blocks of `block` tokens (the prefill chunk), each named by a hash of every token from the
start of the prompt through the block, as vLLM's automatic prefix caching does: two prompts share the
blocks of their common beginning, held once. A prompt reuses its leading blocks that are stored, so a
warm prefill runs the same chunks, at the same positions, over the same cache contents as a cold one,
and gives the same keys and values bit for bit; the output is the cold run's. At least one prompt token
is always prefilled (the forward that leaves the last prompt token's query for the retrieval cache).

Bounded by `max_bytes`: a prompt stores as many of its leading blocks as the bound holds, and the least
recently used blocks of other prompts make room. A use touches a prompt's blocks from the last to the
first, so its first block is its most recent and eviction takes deep blocks before the blocks they
extend (a block whose predecessor is gone can never be reached again).
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict

import torch

from .full import FullKVCache


class PrefixStore:
    """Used from one thread at a time (LLM.generate's, or the server's scheduler thread)."""

    def __init__(self, max_bytes: int, block: int):
        if block < 1:
            raise ValueError("prefix blocks need at least one token")
        self.max_bytes, self.block = max_bytes, block
        self.blocks: OrderedDict[bytes, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()  # LRU first
        self.bytes = 0

    def room(self) -> int:
        """Bytes the store may still take."""
        return max(0, self.max_bytes - self.bytes)

    def _names(self, tokens: list[int], count: int) -> list[bytes]:
        """The names of the first `count` blocks of `tokens`: a hash chain over the blocks."""
        names, h = [], hashlib.sha256()
        for i in range(count):
            h.update(torch.tensor(tokens[i * self.block:(i + 1) * self.block], dtype=torch.int64).numpy().tobytes())
            names.append(h.copy().digest())
        return names

    def restore(self, tokens: list[int], cache: FullKVCache) -> int:
        """Writes the stored blocks that `tokens` begins with into the empty `cache`; -> tokens restored."""
        names = self._names(tokens, (len(tokens) - 1) // self.block)
        found = 0
        while found < len(names) and names[found] in self.blocks:
            found += 1
        self._touch(names[:found])
        for i in range(found):
            keys, values = self.blocks[names[i]]
            cache.write(i * self.block, keys, values)
        return found * self.block

    def store(self, tokens: list[int], cache: FullKVCache) -> None:
        """Keeps the leading complete blocks of `tokens` whose keys and values `cache` holds, as many as the
        bound holds; the least recently used blocks of other prompts make room."""
        size = cache.block_bytes(self.block)
        count = min(min(len(tokens), cache.length) // self.block, self.max_bytes // size)
        names = self._names(tokens, count)
        self._touch(names)  # this prompt's stored blocks are not the ones evicted below
        for i, name in enumerate(names):
            if name in self.blocks:
                continue
            while self.bytes + size > self.max_bytes:  # never this prompt's: count blocks fit
                self.blocks.popitem(last=False)
                self.bytes -= size
            self.blocks[name] = cache.read(i * self.block, self.block)
            self.bytes += size
        self._touch(names)

    def _touch(self, names: list[bytes]) -> None:
        """Marks the blocks most recently used, the first block most of all."""
        for name in reversed(names):
            if name in self.blocks:
                self.blocks.move_to_end(name)
