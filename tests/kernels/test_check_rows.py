"""A model on the CPU kernels gives a check of k tokens what k one-token steps give, bit for bit, in
bfloat16 and in float32, and each node of a token tree what steps along its path give, so greedy
speculative decoding cannot part from plain decoding at a near-tie (benchmarks/check_rows.py measures
it on SmolLM2)."""
from pathlib import Path

import pytest
import torch

from triforce.cache.full import FullKVCache
from triforce.kernels.linear import KERNEL_MAX_ROWS, pieced_max_rows
from triforce.models.loader import load_model
from triforce.step import Step, ancestor_mask

from checkpoints import write_tiny_checkpoint

CONTEXT = 1020  # the checks' keys straddle the attention kernel's split at 1024


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """Kernel-sized: head dim 64, hidden 256 (K a multiple of 32), 2 KV heads for 4 query heads."""
    return write_tiny_checkpoint(tmp_path_factory.mktemp("rows"), vocab_size=96, hidden_size=256, num_heads=4,
                                 num_kv_heads=2, num_layers=2, max_position_embeddings=2048)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("k", [2, 5, 8, 13, KERNEL_MAX_ROWS, 40])
def test_a_check_gives_each_token_what_one_token_steps_give(level, folder, k, dtype):
    """At every level (AVX2, AVX512-BF16, AMX tiles, which take steps too; the float32 kernels are AVX2
    at every level), up to the most rows the linear kernel takes there (40: bfloat16 at the avx2 and amx
    levels; float32 at every level)."""
    if k > pieced_max_rows(getattr(torch, dtype)):
        pytest.skip(f"past the linear kernel's rows at {level} in {dtype}: torch's product")
    model = load_model(folder, dtype)
    if dtype == "bfloat16":
        assert model.fused_layers.max_rows >= k  # the fused loop's kernels
    ids = torch.randint(3, 96, (CONTEXT + k,), generator=torch.Generator().manual_seed(k))
    caches = [FullKVCache(model.config, CONTEXT + k, model.dtype, "cpu") for _ in range(2)]
    for cache in caches:
        model(Step.chain(ids[:CONTEXT], 0), cache, logits_for="none")
    steps = torch.cat([model(ids[CONTEXT + i:CONTEXT + i + 1], caches[0]) for i in range(k)])
    check = model(ids[CONTEXT:], caches[1])
    assert torch.equal(check, steps)
    assert torch.equal(caches[0].keys[:, :, :CONTEXT + k], caches[1].keys[:, :, :CONTEXT + k])


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_a_batch_check_gives_each_sequence_what_its_steps_give(level, folder, dtype):
    """Nine sequences' checks of 13 tokens in one forward (117 rows: past what the bfloat16 kernel takes in
    one call at the avx2 and avx512 levels, so in pieces of 96 and 24 there; in one call at amx and in
    float32) give each token what one-token steps alone give, bit for bit: the output head too (its
    logits of more than 64 rows were torch's float32 product), and every layer (past the kernel's rows
    torch's product gave a batch member other logits than its solo run: in float32 past 24, in bfloat16 at
    the avx512 level past 24 until the pieces)."""
    batch, k = 9, 13
    if batch * k > pieced_max_rows(getattr(torch, dtype)):
        pytest.skip(f"past the linear kernel's rows at {level}: torch's product")
    model = load_model(folder, dtype)
    ids = [torch.randint(3, 96, (CONTEXT + k,), generator=torch.Generator().manual_seed(s)) for s in range(batch)]
    caches = [FullKVCache(model.config, CONTEXT + k, model.dtype, "cpu") for _ in range(2 * batch)]
    for s in range(batch):
        for cache in caches[2 * s:2 * s + 2]:
            model(Step.chain(ids[s][:CONTEXT], 0), cache, logits_for="none")
    checks = model.forward_batch([Step.chain(i[CONTEXT:], CONTEXT) for i in ids], caches[1::2])
    for s in range(batch):
        steps = torch.cat([model(ids[s][CONTEXT + i:CONTEXT + i + 1], caches[2 * s]) for i in range(k)])
        assert torch.equal(checks[s], steps), s


REAL_KEYS = Path(__file__).parent / "data" / "smollm2_layer15_head1_1024.pt"


def test_a_steps_attention_equals_a_checks_first_row_over_real_keys(level):
    """SmolLM2's layer 15, KV head 1, at 1,024 keys of *Emma* in bfloat16 (its 3 query heads' queries of two
    new tokens, the cache's keys and values: docs/avx2.md, *A step's rows and a check's*): the first token's
    attention alone (3 rows) equals its row in a check of two (6 rows) bit for bit. Random keys passed
    where these did not: at the avx2 level a step's 3 rows read the cache's bfloat16 keys and values in
    registers and a check's rows the block's widened copy, two inlined copies of the range pass, and GCC
    fused a scalar a * b + c into one FMA in one of them and not in the other (until the kernels were
    built with -ffp-contract=off): one query head's output parted by an ulp, and greedy `draft` mode parted
    from `ar`."""
    from triforce.kernels.attention import attention

    data = torch.load(REAL_KEYS)
    q, k, v, scale = data["q"], data["k"], data["v"], data["scale"]
    step = attention(q[:, :1], k[:, :-1], v[:, :-1], scale)
    check = attention(q, k, v, scale)
    assert torch.equal(step[:, 0], check[:, 0])


TREE = [-1, 0, 1, 2, 1, 4, 5, 6, 0, 8, 9, 3, 11, 12, 13, 14, 7]  # leaves 10, 15, 16; paths of 4, 9, 7


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("context", [CONTEXT, 504])
def test_a_tree_check_gives_each_node_what_steps_along_its_path_give(level, folder, dtype, context):
    """Each node's logits, and the keys and values its path keeps (keep_path), equal those of one-token
    steps along the path; the paths straddle 512 or 1024 at other nodes than the tree's own layout."""
    model = load_model(folder, dtype)
    n = len(TREE)
    ids = torch.randint(3, 96, (context + n,), generator=torch.Generator().manual_seed(context))
    stepped, kept = (FullKVCache(model.config, context + n, model.dtype, "cpu") for _ in range(2))
    for cache in (stepped, kept):
        model(Step.chain(ids[:context], 0), cache, logits_for="none")
    mask = ancestor_mask(TREE)
    for leaf in (10, 15, 16):
        kept.truncate(context)
        tree = model(Step.tree(ids[context:], TREE, context), kept)
        path = [j for j in range(n) if mask[leaf, j]]
        stepped.truncate(context)
        steps = torch.cat([model(ids[context + j:context + j + 1], stepped) for j in path])
        assert torch.equal(tree[path], steps), leaf
        kept.keep_path(context, path)
        end = context + len(path)
        assert torch.equal(kept.keys[:, :, :end], stepped.keys[:, :, :end])
        assert torch.equal(kept.values[:, :, :end], stepped.values[:, :, :end])
