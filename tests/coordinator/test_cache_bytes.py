"""hierarchy.cache_bytes, the memory check's estimate of one request's caches, against the bytes the caches
of a real request hold once it has run (every tier's tensors, each storage counted once)."""
import pytest
import torch

from triforce.cache.full import QUERY_ROWS
from triforce.config import EngineConfig
from triforce.sampling_params import SamplingParams
from triforce.coordinator.hierarchy import build_engine, cache_bytes
from triforce.models.loader import load_model
from triforce.models.rope import RotaryEmbedding


def held_bytes(objects) -> int:
    """Bytes of the tensors reachable from `objects` through attributes, lists and dicts (not the models'
    nor their RoPE tables, which every request shares)."""
    seen_objects, storages, total = set(), set(), 0
    stack = list(objects)
    while stack:
        obj = stack.pop()
        if id(obj) in seen_objects or isinstance(obj, (torch.nn.Module, RotaryEmbedding)):
            continue
        seen_objects.add(id(obj))
        if isinstance(obj, torch.Tensor):
            storage = obj.untyped_storage()
            if storage.data_ptr() not in storages:
                storages.add(storage.data_ptr())
                total += storage.nbytes()
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif hasattr(obj, "__dict__") and type(obj).__module__.startswith("triforce"):
            stack.extend(vars(obj).values())
    return total


# budget 512: a request whose 340 tokens fit the budget, which a static cache reads in place (it counted a
# copy of every layer but the `full_layers` and the chunk means: 1.6 times what such a request holds)
@pytest.mark.parametrize("mode,policy,budget", [("ar", "static", 32), ("draft", "static", 32), ("triforce", "static", 32),
                                                ("triforce", "dynamic", 32), ("auto", "static", 32),
                                                ("triforce", "static", 512), ("triforce", "dynamic", 512)])
def test_the_estimate_covers_what_a_request_holds(tiny_dir, mode, policy, budget):
    spec = dict(vocab_size=64, hidden_size=64, num_heads=4, num_kv_heads=2)
    target = load_model(tiny_dir("bytes-target", seed=60, num_layers=4, **spec))
    draft = load_model(tiny_dir("bytes-draft", seed=61, num_layers=1, **spec))
    cfg = EngineConfig(mode=mode, retrieval_policy=policy, budget=budget, chunk_size=8, full_layers=1, sinks=4,
                       window=32, refresh_every=16)
    prompt = torch.randint(0, 64, (300,), generator=torch.Generator().manual_seed(6)).tolist()
    engine = build_engine(cfg, target, draft if mode != "ar" else None, 300 + 40)
    engine.generate(prompt, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))
    held = held_bytes([tier.cache for tier in engine.ladder])
    estimate = cache_bytes(cfg, target.config, draft.config if mode != "ar" else None, 340, 4)
    full = target.config.kv_bytes_per_token(4) * 340
    assert held > (full if mode in ("ar", "auto") else 1.1 * full)  # the other tiers' caches are real bytes too
    if mode == "auto":  # which tiers ran depends on measured times: the estimate covers all of them
        assert estimate >= 0.95 * held, (held, estimate)
        return
    # all but small state (positions, RoPE angles), a few percent of this toy cache of 16-wide heads; the
    # estimate holds the target's queries of QUERY_ROWS rows (the fused loop's store, or the layer-by-layer
    # path's after a forward of as many rows), where this request's last forward left a few rows' only
    queries = 4 * 4 * QUERY_ROWS * 16 * 4
    assert 0.95 * held <= estimate - queries <= 1.1 * held, (held, estimate)
