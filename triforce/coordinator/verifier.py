"""The Verifier seam: the target with its full KV cache, wherever it runs.

A verifier offers the tier interface (`prefill`, `forward` = verify a chain and return the target's
logits, `truncate` = keep the accepted path, `length`, `sync`) plus `kv_source()`, the full cache the
retrieval tier reads its chunks from. `LocalVerifier` runs in this process; the distributed issue adds
a remote one that speaks ZeroMQ to a tensor-parallel worker group. The engine never knows which.
"""
from __future__ import annotations

from collections.abc import Iterator
from functools import partial

from ..cache.full import FullKVCache
from ..cache.prefixes import PrefixStore
from ..cache.retrieval import LocalKVSource
from ..config import PREFILL_CHUNK
from ..models.llama import LlamaModel
from ..step import Step
from .runs import Wait
from .tiers import Tier


class Verifier(Tier):
    reused_tokens = 0  # prompt tokens restored from a prefix store instead of prefilled

    def kv_source(self):
        """What the retrieval cache reads: a LocalKVSource, or a remote source with the same methods."""
        raise NotImplementedError


class LocalVerifier(Verifier):
    def __init__(self, model: LlamaModel, capacity: int, prefill_chunk: int = PREFILL_CHUNK,
                 prefixes: PrefixStore | None = None):
        cache = FullKVCache(model.config, capacity, model.dtype, model.device)
        super().__init__("target", model, cache, prefill_chunk)
        # blocks are reused only where they are this verifier's prefill chunks (a bench sweep may change them)
        self.prefixes = prefixes if prefixes is not None and prefixes.block == prefill_chunk else None

    def prefill_steps(self, tokens: list[int], progress=None) -> Iterator[Step | Wait]:
        """Tier.prefill_steps block by block through the prefix store: a block it holds is restored; one
        that another sequence is prefilling now (its claim) is waited for, then restored; any other is
        prefilled under this verifier's claim and stored."""
        if self.prefixes is None or self.length:
            yield from super().prefill_steps(tokens, progress)
            return
        store, block = self.prefixes, self.prefill_chunk
        names = store.names(tokens, min(len(tokens) // block, store.kept_blocks(self.cache)))  # what it will keep
        reusable = min(len(names), store.reusable_blocks(tokens))
        try:
            i = 0
            while i < reusable:
                if store.restore_block(names, i, self.cache):
                    self.reused_tokens += block
                    if progress is not None:
                        progress.update(block)
                elif store.claim(names[i], self):
                    yield from super().prefill_steps(tokens[i * block:(i + 1) * block], progress)
                    store.store_block(names, i, self.cache)
                    store.release(self)
                else:
                    yield Wait(store.claims[names[i]], partial(store.drop_claim, names[i]))
                    continue
                i += 1
            yield from super().prefill_steps(tokens[reusable * block:], progress)
            for i in range(reusable, len(names)):  # a last whole block, the one that holds the last token
                store.store_block(names, i, self.cache)
        finally:
            store.release(self)

    def query_state(self) -> tuple:
        return self.cache.query_state()

    def restore_query_state(self, state: tuple) -> None:
        self.cache.restore_query_state(state)

    def kv_source(self) -> LocalKVSource:
        return LocalKVSource(self.cache)
