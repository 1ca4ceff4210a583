"""The retrieval cache's CPU kernels (csrc/retrieval_bf16.cpp) against the torch code of kernels/retrieval.py: chunk
    means bit for bit, chunk copies byte for byte."""
import pytest
import torch

from triforce.kernels import retrieval
from triforce.kernels.cpu import cpu_kernels


def torch_means(keys: torch.Tensor, chunk_size: int, monkeypatch) -> torch.Tensor:
    with monkeypatch.context() as patch:
        patch.setattr(retrieval, "cpu_kernels", lambda: None)
        return retrieval.chunk_mean_keys(keys, chunk_size)


@pytest.mark.parametrize("chunk_size", [8, 3, 16, 1])  # 3: a division that is not a power of two
def test_chunk_means_equal_the_torch_loop(level, monkeypatch, chunk_size):
    """A cache's keys as the retrieval cache passes them, its first S of a larger capacity (rows apart), with
    large, tiny and cancelling values, infinities and a NaN; the sums round alike at every position."""
    cache = (8 * torch.randn(4, 3, 40 * chunk_size + 24, 64)).bfloat16()
    cache[0, 0, :chunk_size] = torch.tensor([3e38, -3e38]).repeat(32 * chunk_size).view(chunk_size, 64).bfloat16()
    cache[1, 2, 5, :4] = torch.tensor([float("inf"), -float("inf"), float("nan"), 1e-38])
    cache[2, 1, 2 * chunk_size:3 * chunk_size] = 1e-3 * cache[2, 1, 2 * chunk_size:3 * chunk_size]
    keys = cache[:, :, : 40 * chunk_size]
    assert not keys.is_contiguous()
    want = torch_means(keys, chunk_size, monkeypatch)
    got = retrieval.chunk_mean_keys(keys, chunk_size)
    assert got.shape == (4, 3, 40, 64)
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.nan_to_num().view(torch.int16), want.nan_to_num().view(torch.int16))


def test_chunk_means_of_unviewable_keys_and_one_row(level, monkeypatch):
    """Keys whose rows are not contiguous (a transposed view) are copied first; a single [S, D] works too."""
    keys = (4 * torch.randn(64, 2, 48)).bfloat16().transpose(0, 1)  # [2, 64, 48], stride(-2) != D
    assert torch.equal(retrieval.chunk_mean_keys(keys, 8), torch_means(keys, 8, monkeypatch))
    assert torch.equal(retrieval.chunk_mean_keys(keys[0], 4), torch_means(keys[0], 4, monkeypatch))


def test_chunk_means_kernel_refuses_bad_input(level):
    ext = cpu_kernels()
    with pytest.raises(RuntimeError, match="multiple of the chunk size"):
        ext.chunk_means_bf16(torch.zeros(2, 10, 64, dtype=torch.bfloat16), 8)
    with pytest.raises(RuntimeError, match="bfloat16"):
        ext.chunk_means_bf16(torch.zeros(2, 16, 64), 8)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_refill_chunks_copies_as_the_torch_path(level, monkeypatch, dtype):
    """refill_chunks through the kernel's chunk copies against its torch indexing: a first fill and a later
    one that keeps some chunks where they are; every slot and the rest of the buffers alike."""
    sources = tuple(torch.randn(2, 3, 96, 16).to(dtype) for _ in range(2))
    first = torch.stack([torch.randperm(12)[:5] for _ in range(6)]).view(2, 3, 5)
    later = torch.stack([torch.cat([row[:2], torch.tensor([c for c in range(12) if c not in row][:3])])
                         for row in first.view(6, 5)]).view(2, 3, 5)
    results = []
    for kernels in (False, True):
        with monkeypatch.context() as patch:
            if not kernels:
                patch.setattr(retrieval, "cpu_kernels", lambda: None)
            buffers = tuple(torch.full((2, 3, 50, 16), 7.0, dtype=dtype) for _ in range(2))
            held = retrieval.refill_chunks(buffers, None, first, sources, 8)
            held = retrieval.refill_chunks(buffers, held, later, sources, 8)
            results.append((held, buffers))
    (held_torch, want), (held_kernel, got) = results
    assert torch.equal(held_kernel, held_torch)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    slots = held_kernel.view(2, 3, 5, 1, 1) * 8 + torch.arange(8).view(1, 1, 1, 8, 1)  # the chunks' keys, by slot
    expect = sources[0].gather(2, slots.reshape(2, 3, 40, 1).expand(-1, -1, -1, 16))
    assert torch.equal(got[0][:, :, :40], expect)


def test_copy_chunks_refuses_a_chunk_out_of_range(level):
    dst, src = torch.zeros(2, 16, 4), torch.zeros(2, 24, 4)
    ids = [torch.tensor([1]), torch.tensor([2]), torch.tensor([0])]  # slot 2 of 8 rows ends past 16
    with pytest.raises(RuntimeError, match="out of range"):
        cpu_kernels().copy_chunks(dst, src, *ids, 8)
