"""PrefixStore: the target's full KV cache of recently prefilled prompts, kept so that a later prompt that
begins the same way (many questions about one long document) skips prefilling what they share.

The store holds blocks of `block` tokens (the prefill chunk), each named by a hash of every token from the
start of the prompt through the block, as vLLM's automatic prefix caching does: two prompts share the
blocks of their common beginning, held once. A prompt reuses its leading blocks that are stored, so a
warm prefill runs the same chunks, at the same positions, over the same cache contents as a cold one,
and gives the same keys and values bit for bit; the output is the cold run's. At least one prompt token
is always prefilled (the forward that leaves the query the retrieval cache's first choice is scored with).

Bounded by `max_bytes`: a prompt stores as many of its leading blocks as the bound holds, and the least
recently used blocks of other prompts make room. A use touches a prompt's blocks from the last to the
first, so its first block is its most recent and eviction takes deep blocks before the blocks they
extend (a block whose predecessor is gone can never be reached again).

Prompts of one batch share blocks too: a sequence that is prefilling a block the store will keep claims
it, and another sequence that needs the same block waits (LocalVerifier.prefill_steps yields a `Wait`)
until it is stored, then restores it: several questions about one document arriving together prefill
the document once. A claim whose owner went away is dropped once no forward of that owner is in the batch.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict

import torch

from .full import FullKVCache


class BlockNames:
    """The names of a prompt's blocks as they come, for a prefill that arrives in pieces (a worker
    group's): each name hashes every token from the start of the prompt through its block."""

    def __init__(self):
        self.names: list[bytes] = []
        self._hash = hashlib.sha256()

    def add(self, block_tokens: list[int]) -> bytes:
        self._hash.update(torch.tensor(block_tokens, dtype=torch.int64).numpy().tobytes())
        self.names.append(self._hash.copy().digest())
        return self.names[-1]


class PrefixStore:
    """Used from one thread at a time (LLM.generate's, or the server's scheduler thread)."""

    def __init__(self, max_bytes: int, block: int):
        if block < 1:
            raise ValueError("prefix blocks need at least one token")
        self.max_bytes, self.block = max_bytes, block
        self.blocks: OrderedDict[bytes, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()  # LRU first
        self.bytes = 0
        self.claims: dict[bytes, object] = {}  # block name -> the sequence prefilling it now

    def room(self) -> int:
        """Bytes the store may still take."""
        return max(0, self.max_bytes - self.bytes)

    def names(self, tokens: list[int], count: int) -> list[bytes]:
        """The names of the first `count` blocks of `tokens`: a hash chain over the blocks."""
        chain = BlockNames()
        for i in range(count):
            chain.add(tokens[i * self.block:(i + 1) * self.block])
        return chain.names

    def reusable_blocks(self, tokens: list[int]) -> int:
        """How many blocks of a prompt's prefill (`tokens`) may be restored: every whole block but the one
        holding its last token, which is always prefilled (none of an empty prefill)."""
        return max(0, len(tokens) - 1) // self.block

    def kept_blocks(self, cache: FullKVCache) -> int:
        """How many leading blocks of a prompt the bound holds."""
        return self.blocks_held(cache.block_bytes(1))

    def blocks_held(self, token_bytes: int) -> int:
        """How many blocks the bound holds, at `token_bytes` of keys and values per token."""
        return self.max_bytes // (self.block * token_bytes)

    def restore_block(self, names: list[bytes], i: int, cache: FullKVCache) -> bool:
        """Writes block i (`names` are the prompt's) into `cache`, which holds the blocks before it, when
        the store has it."""
        if names[i] not in self.blocks:
            return False
        self._touch(names[:i + 1])
        cache.write(i * self.block, *self.blocks[names[i]])
        return True

    def store_block(self, names: list[bytes], i: int, cache: FullKVCache) -> None:
        """Keeps block i of a prompt (`names`: its blocks' names) from `cache`, unless the bound cannot hold
        blocks 0..i together; the least recently used blocks of other prompts make room."""
        if i >= self.kept_blocks(cache):
            return
        size = cache.block_bytes(self.block)
        self._touch(names[:i])  # this prompt's blocks are not the ones evicted below
        if names[i] not in self.blocks:
            while self.bytes + size > self.max_bytes:  # never this prompt's: blocks 0..i fit
                self.blocks.popitem(last=False)
                self.bytes -= size
            self.blocks[names[i]] = cache.read(i * self.block, self.block)
            self.bytes += size
        self._touch(names[:i + 1])

    def claim(self, name: bytes, owner: object) -> bool:
        """`owner` is about to prefill the block `name`: True when no other sequence is (it now holds it)."""
        return self.claims.setdefault(name, owner) is owner

    def release(self, owner: object) -> None:
        """`owner` prefills nothing any more."""
        self.claims = {name: o for name, o in self.claims.items() if o is not owner}

    def drop_claim(self, name: bytes) -> None:
        """Forgets who prefills block `name` (its owner went away without releasing it)."""
        self.claims.pop(name, None)

    def _touch(self, names: list[bytes]) -> None:
        """Marks the blocks most recently used, the first block most of all."""
        for name in reversed(names):
            if name in self.blocks:
                self.blocks.move_to_end(name)
