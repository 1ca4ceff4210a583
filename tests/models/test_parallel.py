"""Tensor-parallel layer types and the sharded model against their single-process twins (gloo, CPU).
Each case starts `size` processes (tests/processes.py); a failed check in any of them fails the test."""
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import processes
from triforce.models.config import ModelLoadError
from triforce.models.parallel import RowParallelLinear, TensorParallel, VocabParallelEmbedding, VocabParallelHead


def _layer_types(rank: int, size: int, init: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=size)
    try:
        tp = TensorParallel(rank, size, dist.group.WORLD)
        g = torch.Generator().manual_seed(0)
        x, w = torch.randn(3, 12 * size, generator=g), torch.randn(10, 12 * size, generator=g)
        row = RowParallelLinear(12, 10, tp.group)
        row.weight.data = w[:, rank * 12:(rank + 1) * 12].clone()
        torch.testing.assert_close(row(x[:, rank * 12:(rank + 1) * 12]), x @ w.T)

        vocab, table = 11, torch.randn(11, 5, generator=g)  # 11 rows: uneven shards
        rows = tp.rows(vocab)
        emb = VocabParallelEmbedding(rows.stop - rows.start, 5, rows.start, tp.group)
        emb.weight.data = table[rows].clone()
        tokens = torch.tensor([0, 10, 4, 7, 4])
        torch.testing.assert_close(emb(tokens), table[tokens])
        head = VocabParallelHead(5, rows.stop - rows.start, vocab, tp.group, size)
        head.weight.data = table[rows].clone()
        h = torch.randn(2, 5, generator=g)
        torch.testing.assert_close(head(h), h @ table.T)
    finally:
        dist.destroy_process_group()


def _model(rank: int, size: int, init: str, folder: str, expected: torch.Tensor) -> None:
    from triforce.cache.full import FullKVCache
    from triforce.models.loader import load_model

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=size)
    try:
        model = load_model(folder, "float32", tp=TensorParallel(rank, size, dist.group.WORLD))
        cache = FullKVCache(model.config, 40, model.dtype, "cpu")
        assert cache.keys.shape[1] == model.config.num_kv_heads  # this rank's KV heads only
        ids = torch.arange(3, 33) % 96
        logits = torch.cat([model(ids[:20], cache), model(ids[20:], cache)])
        torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)
    finally:
        dist.destroy_process_group()


def start(fn, args: tuple, size: int) -> None:
    """fn(rank, *args) in `size` processes; raises where any of them failed."""
    processes.context()
    mp.start_processes(fn, args=args, nprocs=size, join=True, start_method=processes.START_METHOD)


@pytest.mark.parametrize("size", [2, 3])
def test_layer_types_equal_their_single_device_twins(tmp_path, size):
    start(_layer_types, (size, f"file://{tmp_path}/rendezvous"), size)


@pytest.mark.parametrize("heads,kv_heads,size", [(4, 2, 2), (6, 3, 3), (6, 1, 3), (8, 2, 4)])
def test_sharded_model_equals_the_whole_model(tiny_dir, tmp_path, heads, kv_heads, size):
    from triforce.cache.full import FullKVCache
    from triforce.models.loader import load_model

    folder = tiny_dir(f"tp-{heads}-{kv_heads}", hidden_size=48, num_heads=heads, num_kv_heads=kv_heads,
                      arch="qwen2", seed=60)  # qwen2: qkv bias and tied embeddings, the most to shard
    whole = load_model(folder)
    ids = torch.arange(3, 33) % 96
    cache = FullKVCache(whole.config, 40, whole.dtype, "cpu")
    expected = torch.cat([whole(ids[:20], cache), whole(ids[20:], cache)])
    start(_model, (size, f"file://{tmp_path}/rendezvous", str(folder), expected), size)


@pytest.mark.parametrize("heads,kv_heads,size", [(6, 3, 3), (6, 1, 3)])
def test_a_rank_reads_only_its_part_of_the_checkpoint(tiny_dir, monkeypatch, heads, kv_heads, size):
    """Each rank reads its slices of the checkpoint and no more (it read the whole and sliced it: the group
    held as many copies of the model as it has ranks): the norms whole, a replicated KV head once per rank
    that uses it, the rest a `size`-th."""
    import triforce.models.loader as loader

    folder = tiny_dir(f"tp-{heads}-{kv_heads}", hidden_size=48, num_heads=heads, num_kv_heads=kv_heads,
                      arch="qwen2", seed=60)
    read = []
    opened = loader.safe_open

    class Counting:
        def __init__(self, *args, **kwargs):
            self.f = opened(*args, **kwargs)

        def __enter__(self):
            self.f.__enter__()
            return self

        def __exit__(self, *exc):
            return self.f.__exit__(*exc)

        def keys(self):
            return self.f.keys()

        def get_tensor(self, name):
            read.append((name, self.f.get_tensor(name).numel()))
            return self.f.get_tensor(name)

        def get_slice(self, name):
            whole = self.f.get_slice(name)
            return type("Part", (), {"__getitem__": lambda _, index: read.append((name, whole[index].numel()))
                                     or whole[index], "get_shape": lambda _: whole.get_shape()})()

    monkeypatch.setattr(loader, "safe_open", Counting)
    whole = {name: t.numel() for name, t in load_model_state(folder).items()}
    for rank in range(size):
        read.clear()
        loader.load_model(folder, tp=TensorParallel(rank, size))
        got = dict(read)
        for name, numel in whole.items():
            if "norm" in name:
                assert got[name] == numel
            elif kv_heads < size and ("k_proj" in name or "v_proj" in name):
                assert got[name] == numel // kv_heads  # its one KV head
            elif "embed_tokens" in name or "lm_head" in name:
                assert got[name] <= -(-numel // size)
            else:
                assert got[name] == numel // size, name


def test_a_tensor_the_split_does_not_fit_is_named(tiny_dir, tmp_path):
    """A checkpoint tensor smaller than the config says, read by a rank: its name and shape, not a "corrupt
    file" (slicing the whole tensor and its error came later, as a shape mismatch)."""
    import json

    from safetensors.torch import save_file

    import triforce.models.loader as loader

    folder = tiny_dir("tp-6-3", hidden_size=48, num_heads=6, num_kv_heads=3, arch="qwen2", seed=60)
    state = load_model_state(folder)
    state["model.layers.0.self_attn.k_proj.weight"] = state["model.layers.0.self_attn.k_proj.weight"][:8]
    save_file(state, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(json.loads((folder / "config.json").read_text())))
    with pytest.raises(ModelLoadError, match="'layers.0.self_attn.k_proj.weight' has shape \\(8, 48\\)"):
        loader.load_model(tmp_path, tp=TensorParallel(2, 3))


def load_model_state(folder):
    from safetensors.torch import load_file

    return {k: v for path in sorted(folder.glob("*.safetensors")) for k, v in load_file(path).items()}


def test_sizes_that_do_not_divide_the_heads_are_refused(tiny_dir):
    from triforce.models.loader import load_model

    folder = tiny_dir("tp-6-3", hidden_size=48, num_heads=6, num_kv_heads=3, arch="qwen2", seed=60)
    with pytest.raises(ModelLoadError, match="must divide"):
        load_model(folder, tp=TensorParallel(0, 4))
