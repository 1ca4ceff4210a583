"""A proposing tier's int8 twin of a model (models/quantized.py): the retrieval tier's, the draft's."""
import pytest
import torch

from triforce.cache.full import FullKVCache
from triforce.coordinator.priors import weights_key
from triforce.errors import UserError
from triforce.kernels.int8 import Int8Weight
from triforce.models import quantized
from triforce.models.loader import load_model
from triforce.models.quantized import MATRICES, Int8Head, int8_twin, twin_bytes


def logits(model, tokens):
    return model(tokens, FullKVCache(model.config, tokens.numel(), model.dtype, "cpu"))


@pytest.mark.parametrize("arch", ["llama2", "qwen2"])  # qwen2: q, k, v biases
def test_the_twin_computes_the_model_with_its_matrices_dequantized(tiny_dir, arch, int8_kernels):
    """float32: the twin's logits are those of the model whose four layer matrices and output head are
    replaced by their int8 values times their scales (and nothing else: norms, biases, embeddings, even where
    the head shares them), and differ from the model's own; the model itself is left as it was and shares
    its other tensors with the twin."""
    folder = tiny_dir(f"int8-{arch}", arch=arch, seed=3, hidden_size=64, scale=10)
    model = load_model(folder)
    tokens = torch.randint(3, 96, (40,), generator=torch.Generator().manual_seed(0))
    before = logits(model, tokens)
    key = weights_key(model)  # (cached on the model: the twin, whose head differs, has its own)
    twin = int8_twin(model)
    assert weights_key(twin) != key == weights_key(model)
    assert twin.quantized == "int8" and model.quantized is None
    reference = load_model(folder)
    with torch.no_grad():
        for layer, twin_layer in zip(reference.layers, twin.layers):
            for name in MATRICES:
                weight = getattr(twin_layer, name).weight
                assert isinstance(weight, Int8Weight)
                getattr(layer, name).weight.copy_(weight.dequantized(torch.float32))
        assert isinstance(twin.lm_head, Int8Head)  # (a head of its own: the embeddings stay as they were)
        reference.lm_head.weight = torch.nn.Parameter(twin.lm_head.weight.dequantized(torch.float32))
    got = logits(twin, tokens)
    torch.testing.assert_close(got, logits(reference, tokens), atol=1e-4, rtol=1e-4)
    assert (got - before).abs().max() > 1e-3  # the quantization shows: the test can tell the twin apart
    assert torch.equal(logits(model, tokens), before)
    assert twin.embed_tokens is model.embed_tokens and twin.norm is model.norm and twin.rope is model.rope
    assert int8_twin(model, head=False).lm_head is model.lm_head
    for layer, twin_layer in zip(model.layers, twin.layers):
        assert twin_layer.input_norm is layer.input_norm and twin_layer.qkv_proj.bias is layer.qkv_proj.bias
        assert isinstance(layer.qkv_proj.weight, torch.nn.Parameter)  # the model's own layers are untouched
    assert twin_bytes(model) == twin.lm_head.weight.nbytes + sum(
        getattr(layer, name).weight.nbytes for layer in twin.layers for name in MATRICES)


def test_the_twin_in_bfloat16_proposes_close_to_the_model(tiny_dir, int8_kernels):
    """bfloat16, through the CPU kernels where they are (the fused layer loop too): the twin's most likely
    token is mostly the model's."""
    model = load_model(tiny_dir("int8-llama2", arch="llama2", seed=3, hidden_size=64, scale=10), "bfloat16")
    twin = int8_twin(model)
    tokens = torch.randint(3, 96, (60,), generator=torch.Generator().manual_seed(1))
    want, got = logits(model, tokens), logits(twin, tokens)
    assert not torch.equal(want, got)
    assert (want.argmax(-1) == got.argmax(-1)).float().mean() > 0.8


def test_a_twin_that_cannot_run_well_is_refused(tiny_dir, monkeypatch):
    """Where memory is short, on a GPU, without the CPU kernels, in float16 and for a matrix whose columns the
    kernel does not take (the reference product would widen every matrix at every call: slower than the
    model's own weights), the twin is refused with what to do (the kernels stand in where they are not the
    case: each refusal is asked apart from the others)."""
    monkeypatch.setattr(quantized, "cpu_kernels", lambda: object())
    model = load_model(tiny_dir("int8-llama2", arch="llama2", seed=3, hidden_size=64, scale=10))
    with monkeypatch.context() as m:
        m.setattr(quantized, "available_bytes", lambda device: twin_bytes(model) - 1)
        with pytest.raises(UserError, match="--draft-weights int8 needs .* more memory"):
            int8_twin(model, "draft")
    with monkeypatch.context() as m:
        m.setattr(type(model), "device", property(lambda self: torch.device("cuda")))
        with pytest.raises(UserError, match="--retrieval-weights int8 runs on a CPU"):
            int8_twin(model)
    with monkeypatch.context() as m:
        m.setattr(quantized, "cpu_kernels", lambda: None)
        with pytest.raises(UserError, match="needs the CPU kernels .* no kernels"):
            int8_twin(model)
    with pytest.raises(UserError, match="torch.float16"):
        int8_twin(load_model(tiny_dir("int8-llama2", arch="llama2", seed=3, hidden_size=64, scale=10), "float16"))
    narrow = load_model(tiny_dir("int8-narrow", arch="llama2", seed=3, hidden_size=40, num_heads=4, num_kv_heads=2))
    with pytest.raises(UserError, match=r"multiple of 16 columns \(the kernel.s\), and layer 0's qkv_proj is"):
        int8_twin(narrow)
