"""Random append / rollback / sync / rebuild sequences against naive references of each policy."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from triforce.cache.full import FullKVCache
from triforce.cache.retrieval import LocalKVSource, RetrievalKVCache
from triforce.cache.streaming import TURN_BLOCK, StreamingKVCache
from triforce.kernels.fused import rope
from triforce.models.config import ModelConfig
from triforce.models.rope import RotaryEmbedding
from triforce.step import Step

CFG = ModelConfig(model_type="llama", vocab_size=8, hidden_size=16, intermediate_size=8, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=4, max_position_embeddings=512)
ROPE = RotaryEmbedding(CFG)
HQ, HKV, D = CFG.num_heads, CFG.num_kv_heads, CFG.head_dim


def forward(cache, n, seed, parents=None, rope=ROPE):
    """One fake forward of n tokens (a chain, or the tree `parents`): random unrotated q, k, v per layer,
    q and k rotated at the step's positions as the model hands them over; returns what each layer saw
    (its rotated q, then the keys and values the cache gave back), the new unrotated q, k, v and the
    step's positions."""
    g = torch.Generator().manual_seed(seed)
    tokens = [0] * n
    step = Step.chain(tokens, cache.length) if parents is None else Step.tree(tokens, parents, cache.length)
    cache.begin(step)
    seen, new = [], []
    for layer in range(CFG.num_layers):
        q, k, v = torch.randn(HQ, n, D, generator=g), torch.randn(HKV, n, D, generator=g), torch.randn(HKV, n, D, generator=g)
        q_rotated = rope.rotate(q, step.positions)
        seen.append((q_rotated, *cache.append(layer, q_rotated, rope.rotate(k, step.positions), v)))
        new.append((q, k, v))
    cache.end()
    return seen, new, step.positions


def per_token(new, positions):
    """For each token of one forward: ([(k, v) per layer], position)."""
    return [([(new[layer][1][:, i], new[layer][2][:, i]) for layer in range(CFG.num_layers)], int(positions[i]))
            for i in range(len(positions))]


def tree_parents(raw):
    """Hypothesis integers -> a valid parent list (parents[i] in [-1, i))."""
    return [r % (i + 1) - 1 for i, r in enumerate(raw)]


def kept_path(raw, available):
    """Hypothesis integers -> an increasing path of distinct indices below `available`."""
    return sorted({r % available for r in raw}) if available else []


ops = st.lists(st.tuples(st.sampled_from(["append", "tree", "rollback", "keep"]), st.integers(1, 9),
                         st.lists(st.integers(0, 50), min_size=9, max_size=9)), min_size=1, max_size=40)


def apply_op(cache, history, op, n, raw, step, floor=0, offset=0):
    """Runs one op on the cache and on `history` (entries: ([(k, v) per layer], position)), whose entry i
    is the cache's entry offset + i. Returns the forward's (seen, new, positions) or None. `floor`: the
    oldest entry of `history` a rollback may reach."""
    if op == "rollback":
        n = max(0, min(n, len(history) - floor))
        cache.rollback(n)
        del history[len(history) - n:]
        return None
    if op == "keep":
        start = max(floor, len(history) - n)
        path = kept_path(raw, len(history) - start)
        cache.keep_path(offset + start, path)
        history[start:] = [history[start + p] for p in path]
        return None
    seen, new, positions = forward(cache, n, step, tree_parents(raw[:n]) if op == "tree" else None)
    history += per_token(new, positions)
    return seen, new, positions


@settings(max_examples=60, deadline=None)
@given(ops=ops)
def test_full_cache_matches_reference(ops):
    cache = FullKVCache(CFG, 400, torch.float32, "cpu")
    history = []  # per entry: ([(k, v) per layer] unrotated, position)
    for step, (op, n, raw) in enumerate(ops):
        out = apply_op(cache, history, op, n, raw, step)
        assert cache.length == len(history)
        if out is None:
            continue
        seen, new, positions = out
        stored = torch.tensor([pos for _, pos in history])
        for layer, (q, keys, values) in enumerate(seen):
            ks = torch.stack([t[layer][0] for t, _ in history], dim=1)
            vs = torch.stack([t[layer][1] for t, _ in history], dim=1)
            torch.testing.assert_close(keys, ROPE.rotate(ks, stored))
            torch.testing.assert_close(values, vs)


@settings(max_examples=60, deadline=None)
@given(ops=ops, chunk=st.integers(1, 6), every=st.integers(1, 3))
def test_full_cache_chunk_means_follow_appends_rollbacks_and_kept_paths(ops, chunk, every):
    """The incrementally kept chunk means (asked for every `every` ops) equal the means of the keys the
    cache holds at that moment, through rollbacks and tree paths moved into place."""
    cache = FullKVCache(CFG, 400, torch.float32, "cpu")
    history = []
    for step, (op, n, raw) in enumerate(ops):
        apply_op(cache, history, op, n, raw, step)
        if step % every == 0:
            complete = cache.length // chunk
            want = cache.keys[:, :, : complete * chunk].reshape(CFG.num_layers, HKV, complete, chunk, D).mean(3)
            torch.testing.assert_close(cache.chunk_means(chunk), want)


def test_chunk_means_of_a_long_prefix_are_averaged_a_block_at_a_time(monkeypatch):
    """The first means after a prefill cover the whole prompt: averaged in blocks of MEAN_BLOCK_BYTES of
    float32, not as one float32 copy of every layer's keys, and equal to the one-piece means."""
    import triforce.cache.chunk_means as chunk_means_module

    keys = torch.randn(3, 2, 100, 8).bfloat16()  # [L, Hkv, capacity, D]
    chunk, widest = 4, []
    real = chunk_means_module.chunk_mean_keys
    monkeypatch.setattr(chunk_means_module, "MEAN_BLOCK_BYTES", 3 * 2 * 8 * 4 * chunk * 3)  # three chunks
    monkeypatch.setattr(chunk_means_module, "chunk_mean_keys",
                        lambda k, size: widest.append(k.shape[2]) or real(k, size))
    means = chunk_means_module.ChunkMeans(keys, chunk)
    assert torch.equal(means.upto(90), real(keys[:, :, :88], chunk))  # 22 complete chunks
    assert torch.equal(means.upto(99), real(keys[:, :, :96], chunk))  # then two more
    assert max(widest) == 3 * chunk and sum(widest) == 96


@settings(max_examples=80, deadline=None)
@given(ops=ops, sinks=st.integers(0, 4), window=st.integers(1, 12))
def test_streaming_cache_matches_reference(ops, sinks, window):
    max_rollback = 9
    cache = StreamingKVCache(CFG, sinks, window, max_rollback, ROPE, torch.float32, "cpu")
    history, high_water = [], 0
    for step, (op, n, raw) in enumerate(ops):
        high_water = max(high_water, len(history))
        before = len(history)
        # The contract: never below max_rollback tokens under the longest the cache has been.
        out = apply_op(cache, history, op, n, raw, step, floor=max(0, high_water - max_rollback))
        assert cache.length == len(history)
        if out is None:
            continue
        seen, new, positions = out
        visible = list(range(min(before, sinks))) + list(range(max(sinks, before - window), before))
        visible += list(range(before, before + len(positions)))
        # Sinks keep their positions; once the window has slid past them, its first key follows them, and
        # the rest keep their offsets (before, every key keeps its own position)
        shift = history[before - window][1] - sinks if before - window > sinks else 0
        rotated = torch.tensor([history[t][1] - (shift if t >= sinks else 0) for t in visible])
        for layer, (q, keys, values) in enumerate(seen):
            ks = torch.stack([history[t][0][layer][0] for t in visible], dim=1)
            vs = torch.stack([history[t][0][layer][1] for t in visible], dim=1)
            # the attention scores of StreamingLLM's numbering (the cache rotates at other positions with
            # the same distances, which is all RoPE scores see)
            torch.testing.assert_close(scores(q, keys), scores(signed_rotate(new[layer][0], positions - shift),
                                                               signed_rotate(ks, rotated)))
            torch.testing.assert_close(values, vs)


def test_a_streaming_cache_turns_its_sinks_as_each_shift_alone():
    """The sinks a forward sees, turned for TURN_BLOCK shifts at once and kept, equal bit for bit the sinks
    turned by that forward's shift alone: across blocks, after rollbacks, and after the sinks change."""
    sinks, window = 3, 5
    cache = StreamingKVCache(CFG, sinks, window, 9, ROPE, torch.float32, "cpu")
    turned_by = set()
    for round_ in range(2):  # the second after a reset: other sinks
        for step, (n, back) in enumerate([(2, 0), (4, 0)] + [(3, 2), (1, 0), (5, 4), (2, 1)] * 12):
            before = cache.length
            seen = forward(cache, n, 100 * round_ + step)[0]
            if before - window > sinks:
                shift = torch.tensor(before - window - sinks)
                turned_by.add(int(shift))
                want = rope(cache.sink_k.reshape(-1, sinks, D), *ROPE.turn(shift.expand(sinks), torch.float32))
                got = torch.stack([keys[:, :sinks] for _, keys, _ in seen])
                assert torch.equal(got, want.view(CFG.num_layers, HKV, sinks, D))
            cache.rollback(back)
        cache.reset()
    assert max(turned_by) - min(turned_by) > 2 * TURN_BLOCK


def signed_rotate(x, positions):
    """ROPE.rotate at positions of either sign (StreamingLLM's numbering of a window that a tree's node at
    depth 1 begins puts a sibling at depth 0 below it)."""
    cos, sin = ROPE.cos[positions.abs()], ROPE.sin[positions.abs()] * positions.sign()[:, None]
    return rope(x, cos, sin)


def scores(q, keys):
    """q [Hq, n, D] . keys [Hkv, S, D] -> [Hq, n, S], each query head with its KV head."""
    return q @ keys.repeat_interleave(HQ // HKV, dim=0).transpose(1, 2)


YARN = CFG.with_rope_scaling("yarn:4")  # max_position_embeddings 512 -> 2048


@pytest.mark.parametrize("cfg", [CFG, YARN])  # yarn: cos and sin carry an attention scaling
def test_streaming_positions_of_a_chain_number_the_visible_keys(cfg):
    """The StreamingLLM rule for chains: visible keys at 0..m-1, sinks first, new queries last."""
    rope = RotaryEmbedding(cfg)
    cache = StreamingKVCache(cfg, 2, 5, 4, rope, torch.float32, "cpu")
    history = []
    for step in range(6):
        history += per_token(*forward(cache, 3, step, rope=rope)[1:])
    seen, new, positions = forward(cache, 3, 99, rope=rope)
    history += per_token(new, positions)
    q, keys, _ = seen[0]
    assert keys.shape[1] == 2 + 5 + 3
    visible = [0, 1] + list(range(13, 21))
    ks = torch.stack([history[t][0][0][0] for t in visible], dim=1)
    torch.testing.assert_close(scores(q, keys), scores(rope.rotate(new[0][0], torch.arange(7, 10)),
                                                       rope.rotate(ks, torch.arange(10))))


def naive_selection(queries, keys, chunk, count):
    """Per KV head: the `count` best chunks by summed query . mean-key, chunk 0 and the last forced."""
    complete = keys.shape[1] // chunk
    out = []
    for h in range(HKV):
        scores = []
        for c in range(complete):
            mean = keys[h, c * chunk:(c + 1) * chunk].mean(0)
            scores.append(sum(float(queries[g, r] @ mean) for g in range(h * 2, h * 2 + 2) for r in range(queries.shape[1])))
        scores[0] = scores[-1] = float("inf")
        out.append(sorted(sorted(range(complete), key=lambda c: -scores[c])[:count]))
    return out


retrieval_ops = st.lists(st.tuples(st.sampled_from(["commit", "speculate", "tree", "rollback", "keep", "rebuild"]),
                                   st.integers(1, 7), st.lists(st.integers(0, 50), min_size=7, max_size=7)),
                         min_size=1, max_size=25)


@settings(max_examples=60, deadline=None)
@given(ops=retrieval_ops, policy=st.sampled_from(["static", "dynamic"]), full_layers=st.integers(0, 1),
       prompt=st.integers(1, 90))
def test_retrieval_cache_matches_reference(ops, policy, full_layers, prompt):
    chunk, budget = 4, 16
    source = FullKVCache(CFG, 400, torch.float32, "cpu")
    cache = RetrievalKVCache(LocalKVSource(source), budget, chunk, policy, full_layers, refresh_every=10,
                             max_speculative=40)
    forward(source, prompt, 1000)
    cache.sync()
    state = {"built_at": 0, "rebuilds": 0}
    selections = {}
    speculative = []  # this tier's own entries since the last sync: ([(k, v) per layer], position)

    def note_rebuild():
        """After a (possible) static rebuild: what the cache must have chosen, recomputed naively."""
        if policy != "static" or cache.rebuilds == state["rebuilds"]:
            return
        state["rebuilds"], state["built_at"] = cache.rebuilds, cache.synced
        built = cache.synced
        for layer in range(CFG.num_layers):
            if layer < full_layers or built <= budget + chunk:
                selections[layer] = None
            else:
                q = source.last_query[layer].unsqueeze(1)
                keys = source.keys[layer, :, : built // chunk * chunk]
                selections[layer] = naive_selection(q, keys, chunk, budget // chunk)

    note_rebuild()
    for step, (op, n, raw) in enumerate(ops):
        if op == "commit":  # the target absorbs n tokens, then the retrieval cache syncs
            cache.rollback(cache.spec_len)
            forward(source, n, 2000 + step)
            cache.sync()
            speculative.clear()
            note_rebuild()
        elif op == "rebuild" and policy == "static":
            cache.rebuild()
            speculative.clear()
            note_rebuild()
        elif op in ("rollback", "keep"):
            apply_op(cache, speculative, op, n, raw, step, offset=cache.synced)  # this tier's own entries only
        elif op in ("speculate", "tree") and cache.spec_len + n <= cache.max_speculative:
            spec_before = cache.spec_len
            seen, new, positions = forward(cache, n, 3000 + step, tree_parents(raw[:n]) if op == "tree" else None)
            for layer, (q, keys, values) in enumerate(seen):
                committed = keys.shape[1] - spec_before - n
                if policy == "static":
                    sel, built = selections[layer], state["built_at"]
                else:
                    built = cache.synced
                    sel = None
                    if layer >= full_layers and built > budget + chunk:
                        complete = built // chunk
                        # The forward's first query only (exactness: later rows may be proposals).
                        sel = naive_selection(q[:, :1], source.keys[layer, :, : complete * chunk], chunk,
                                              budget // chunk)
                for h in range(HKV):
                    if sel is None:
                        tokens = list(range(cache.synced))
                    else:
                        tokens = [c * chunk + i for c in sel[h] for i in range(chunk)]
                        tokens += list(range(built // chunk * chunk, cache.synced))
                    assert committed == len(tokens)
                    # Chunks may come in any order (attention does not care): compare sorted by key.
                    got, want = keys[h, :committed], source.keys[layer, h, tokens]
                    got_order, want_order = got[:, 0].argsort(), want[:, 0].argsort()
                    torch.testing.assert_close(got[got_order], want[want_order])
                    torch.testing.assert_close(values[h, :committed][got_order],
                                               source.values[layer, h, tokens][want_order])
                if speculative:  # this tier's earlier entries, as kept and rolled back
                    ks = torch.stack([t[layer][0] for t, _ in speculative], dim=1)
                    stored = torch.tensor([pos for _, pos in speculative])
                    torch.testing.assert_close(keys[:, committed:committed + spec_before], ROPE.rotate(ks, stored))
                    torch.testing.assert_close(values[:, committed:committed + spec_before],
                                               torch.stack([t[layer][1] for t, _ in speculative], dim=1))
                torch.testing.assert_close(keys[:, committed + spec_before:], ROPE.rotate(new[layer][1], positions))
            speculative += per_token(new, positions)
        assert cache.length == cache.synced + cache.spec_len
        assert cache.spec_len == len(speculative)


def test_streaming_cache_refuses_a_rollback_deeper_than_it_keeps():
    cache = StreamingKVCache(CFG, 2, 4, 3, ROPE, torch.float32, "cpu")
    for step in range(12):
        forward(cache, 6, step)
    with pytest.raises(ValueError, match="cannot roll back"):
        cache.rollback(60)  # it keeps window + max_rollback = 7 recent tokens (a few more at most), not 60


@pytest.mark.parametrize("sinks, window, max_rollback", [(-1, 4, 3), (2, 0, 3), (0, 4, -2)])
def test_a_streaming_cache_refuses_sizes_it_cannot_keep(sinks, window, max_rollback):
    """A negative max_rollback kept fewer recent tokens than the window: a compaction dropped keys the window
    still showed (a step saw 3 of its 4), with no error."""
    with pytest.raises(ValueError, match="streaming cache needs"):
        StreamingKVCache(CFG, sinks, window, max_rollback, ROPE, torch.float32, "cpu")


def test_a_streaming_cache_bounds_a_prefills_first_chunk_at_its_sinks_only_where_it_will_skip():
    """`before_skip`: a prompt longer than the sinks and the window runs its sinks alone, then skips to the
    last window (a longer first chunk computed tokens the skip threw away); a shorter one runs whole."""
    cache = StreamingKVCache(CFG, 2, 4, 3, ROPE, torch.float32, "cpu")
    assert cache.before_skip(6) is None  # sinks + window: nothing to skip
    assert cache.before_skip(7) == 2
    forward(cache, 1, 0)
    assert cache.before_skip(20) == 1
    forward(cache, 1, 1)
    assert cache.before_skip(20) is None and cache.skippable(20) == 14


def test_a_streaming_cache_is_settled_except_between_a_skip_and_the_window_after_it():
    """`settled` (a cost measurement runs filler over a batchmate's cache and rolls it back) is false only
    where that rollback would fail: after a skip, before the window it skipped to is fed."""
    cache = StreamingKVCache(CFG, 2, 4, 3, ROPE, torch.float32, "cpu")
    assert cache.settled
    forward(cache, 1, 0)
    assert cache.settled  # fewer tokens than the window: nothing evicted
    for step in range(6):
        forward(cache, 3, step)
        assert cache.settled
    cache.skip(cache.skippable(cache.length + 20))
    assert not cache.settled
    with pytest.raises(ValueError, match="cannot roll back"):
        forward(cache, 1, 9)
        cache.rollback(1)
    cache = StreamingKVCache(CFG, 2, 4, 3, ROPE, torch.float32, "cpu")
    forward(cache, 3, 0)
    cache.skip(cache.skippable(cache.length + 20))
    forward(cache, 4, 1)  # the window after the skip
    assert cache.settled
    forward(cache, 2, 2)
    cache.rollback(2)  # what a measurement does


@pytest.mark.parametrize("policy", ["static", "dynamic"])
def test_retrieval_cache_refuses_a_forward_before_its_first_sync(policy):
    """Unsynced (new, or after reset) the dynamic policy wrote its tokens into the source's slots from 0
    on, over the target's committed KV; both policies refuse, and both work once synced."""
    source = FullKVCache(CFG, 400, torch.float32, "cpu")
    forward(source, 30, 1000)
    cache = RetrievalKVCache(LocalKVSource(source), 16, 4, policy, refresh_every=10, max_speculative=8)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="before its first sync"):
            cache.begin(Step.chain([1, 2], cache.length))
        cache.sync()
        cache.begin(Step.chain([1, 2], cache.length))
        cache.end()
        cache.reset()


def test_a_retrieval_cache_over_an_empty_source_reads_it_in_place():
    """A prompt of one token leaves the target's cache empty at the first rebuild: every layer that keeps the
    whole source reads the source's own buffer (an empty view's data_ptr is 0, and each was taken for a
    copy of refresh_every tokens that the memory check does not count), and what it reads after is the
    source's KV."""
    source = FullKVCache(CFG, 400, torch.float32, "cpu")
    cache = RetrievalKVCache(LocalKVSource(source), 16, 4, "static", refresh_every=10, max_speculative=8)
    cache.sync()
    assert all(k.data_ptr() == source.keys[layer].data_ptr() for layer, k in enumerate(cache._buf_k))
    forward(source, 5, 7)
    cache.sync()
    seen, _, _ = forward(cache, 2, 8)
    for layer, (_, keys, values) in enumerate(seen):
        assert keys[:, :5].equal(source.keys[layer, :, :5]) and values[:, :5].equal(source.values[layer, :, :5])
