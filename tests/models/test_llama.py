"""Our model's logits against transformers on the same checkpoint (float32, max abs diff <= 1e-4), and its
forwards past its own positions (the rope table)."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from checkpoints import ARCHITECTURES
from triforce.cache.full import FullKVCache
from triforce.errors import UserError
from triforce.models.config import (ROPE_SCALING_KINDS, ModelConfig, ModelLoadError, parse_rope_scaling,
                                    rope_scaling_spec)
from triforce.models.loader import load_model


def hf_logits(folder, ids):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(ids[None]).logits[0]


def our_logits(model, ids, split):
    """Feeds ids in two forwards (prefill, then the rest) to exercise the cache path too."""
    cache = FullKVCache(model.config, len(ids), model.dtype, "cpu")
    return torch.cat([model(ids[:split], cache), model(ids[split:], cache)])


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
@pytest.mark.parametrize("tie", [False, True])
def test_logits_match_transformers(tiny_dir, arch, tie):
    folder = tiny_dir(f"{arch}-tie{tie}", arch=arch, tie=tie, seed=3)
    ids = torch.randint(0, 96, (300,))  # past the llama3/yarn original context, so scaling matters
    ours = our_logits(load_model(folder), ids, split=217)
    assert (ours - hf_logits(folder, ids)).abs().max().item() <= 1e-4


@pytest.mark.parametrize("kind", ROPE_SCALING_KINDS)
def test_rope_scaling_flag_matches_transformers(tiny_dir, kind):
    """--rope-scaling KIND:2 on a model of 128 positions against transformers with the same rope_parameters,
    over 256 tokens: past the original length, and exactly the scaled length, where transformers' dynamic
    NTK (recomputed per forward from the longest position) equals ours (computed once for that length)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = tiny_dir("llama2-p128", arch="llama2", seed=6, max_position_embeddings=128)
    model = load_model(folder, rope_scaling=f"{kind}:2")
    assert model.config.max_positions == 256
    params = {"rope_type": kind, "factor": 2.0, "original_max_position_embeddings": 128, "rope_theta": 10000.0}
    if kind == "llama3":
        params.update(low_freq_factor=1.0, high_freq_factor=4.0)
    config = AutoConfig.from_pretrained(folder)
    config.rope_parameters = params
    config.max_position_embeddings = 128 if kind == "dynamic" else 256  # dynamic's original length
    hf = AutoModelForCausalLM.from_pretrained(folder, config=config, dtype=torch.float32).eval()
    ids = torch.randint(0, 96, (256,))
    with torch.no_grad():
        want = hf(ids[None]).logits[0]
    ours = our_logits(model, ids, split=200)
    assert (ours - want).abs().max().item() <= 1e-4
    unscaled = our_logits(load_model(folder), ids[:128], split=100)  # scaling changed the model
    assert (ours[:128] - unscaled).abs().max().item() > 1e-3


def test_rope_scaling_refuses_bad_specs_and_scaled_models(tiny_dir):
    folder = tiny_dir("llama2-p128", arch="llama2", seed=6, max_position_embeddings=128)
    for spec in ("yarn", "yarn:1", "yarn:x", "ntk:2", ":2", "yarn:inf", "yarn:1e6", "linear:65"):  # a table of 1e6 x 128
        with pytest.raises(UserError, match="KIND:FACTOR"):
            load_model(folder, rope_scaling=spec)
    with pytest.raises(ModelLoadError, match="already scales RoPE"):
        load_model(tiny_dir("llama3-tieFalse", arch="llama3", tie=False, seed=3), rope_scaling="yarn:2")


def test_a_rope_scaling_is_recorded_as_parsed():
    """Recorded in --json and passed on as written back: every digit kept (six digits made 1.0000001 a
    factor 1, refused when read again, and 1.23456789 another factor than the workers')."""
    for spec, recorded in ((" YaRN:2.0", "yarn:2"), ("linear:1.0000001", "linear:1.0000001"),
                           ("llama3:1.23456789", "llama3:1.23456789"), ("dynamic:8", "dynamic:8")):
        assert rope_scaling_spec(spec) == recorded and parse_rope_scaling(recorded) == parse_rope_scaling(spec)
    with pytest.raises(UserError, match="KIND:FACTOR"):
        rope_scaling_spec("")


def test_a_cpu_model_has_its_kernels_when_it_loads(tiny_dir, monkeypatch):
    """Built (a fresh install: a minute or more) or loaded with the weights, not in the first forward: a
    float32 model's server answered /health first, and its first request waited on the build."""
    import triforce.models.llama as llama_module

    asked = []
    monkeypatch.setattr(llama_module, "cpu_kernels", lambda: asked.append(True))
    load_model(tiny_dir("llama2-kernels"), "float32")
    assert asked


def test_a_step_must_continue_its_cache(tiny_dir):
    """A step from 5 over an empty cache wrote its keys at slots 0-1, rotated at positions 5-6, and every later
    forward attended over them, with no error, for a direct caller (a benchmark, a test; a worker's leader
    refuses such a request itself, workers/checks.py). Checked before any cache is touched."""
    from triforce.step import Step

    model = load_model(tiny_dir("llama2-kernels"), "float32")
    cache = FullKVCache(model.config, 16, model.dtype, "cpu")
    with pytest.raises(ValueError, match="a step from 5, but its cache holds 0 tokens"):
        model(Step.chain([1, 2], 5), cache)
    assert cache.length == 0
    model(Step.chain([1, 2], 0), cache)
    with pytest.raises(ValueError, match="a step from 1, but its cache holds 2 tokens"):
        model.forward_batch([Step.chain([3], 2), Step.chain([3], 1)], [cache, cache])
    assert cache.length == 2


def test_sharded_checkpoint_loads_like_single_file(tiny_dir, tmp_path):
    folder = tiny_dir("llama2-shard", arch="llama2", seed=4)
    tensors = load_file(str(folder / "model.safetensors"))
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, part in halves.items():
        save_file({n: tensors[n] for n in part}, str(tmp_path / file))
    weight_map = {n: file for file, part in halves.items() for n in part}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    ids = torch.randint(0, 96, (20,))
    assert torch.equal(our_logits(load_model(tmp_path), ids, 10), our_logits(load_model(folder), ids, 10))
    for bad in ('{"weight_map": ["model-00001-of-00002.safetensors"]}', b'{"weight_map": "\xff"}'):  # tracebacks
        index = tmp_path / "model.safetensors.index.json"
        index.write_text(bad) if isinstance(bad, str) else index.write_bytes(bad)
        with pytest.raises(ModelLoadError, match="unreadable shard index"):
            load_model(tmp_path)


def test_a_folder_loads_its_model_safetensors_beside_other_safetensors(tiny_dir, tmp_path):
    """As transformers reads a folder without an index: model.safetensors, not an adapter's file beside it
    (whose tensors were refused as ones this architecture does not use)."""
    folder = tiny_dir("llama2-shard", arch="llama2", seed=4)
    for name in ("model.safetensors", "config.json"):
        (tmp_path / name).symlink_to(folder / name)
    save_file({"base_model.model.lora_A.weight": torch.zeros(4, 64)}, str(tmp_path / "adapter_model.safetensors"))
    ids = torch.randint(0, 96, (20,))
    assert torch.equal(our_logits(load_model(tmp_path), ids, 10), our_logits(load_model(folder), ids, 10))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_low_precision_close_to_float32(tiny_dir, dtype):
    folder = tiny_dir("llama2-lp", arch="llama2", seed=5)
    ids = torch.randint(0, 96, (40,))
    ref = our_logits(load_model(folder), ids, 20)
    low = our_logits(load_model(folder, dtype), ids, 20)
    assert (low - ref).abs().max().item() < 0.05 * ref.abs().max().item()


def test_a_config_reads_as_transformers_reads_it_where_keys_are_missing(tiny_dir, tmp_path):
    """YaRN without original_max_position_embeddings (transformers takes max_position_embeddings: it was a
    KeyError traceback), Mistral without sliding_window (transformers' 4096), a config that is not UTF-8 (a
    UnicodeDecodeError traceback)."""
    from transformers import AutoModelForCausalLM

    folder = tiny_dir("llama2-p128", arch="llama2", seed=6, max_position_embeddings=128)
    for file in folder.iterdir():
        (tmp_path / file.name).symlink_to(file)
    (tmp_path / "config.json").unlink()
    config = json.loads((folder / "config.json").read_text())
    legacy = {k: v for k, v in config.items() if k != "rope_parameters"}  # as transformers 4 wrote configs
    (tmp_path / "config.json").write_text(json.dumps({**legacy, "rope_theta": 10000.0,
                                                      "rope_scaling": {"type": "yarn", "factor": 2.0}}))
    model = load_model(tmp_path)
    assert model.config.rope_scaling["original_max_position_embeddings"] == 128
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    ids = torch.randint(0, 96, (120,))
    with torch.no_grad():
        want = hf(ids[None]).logits[0]
    assert (our_logits(model, ids, split=100) - want).abs().max().item() <= 1e-4
    mistral = {k: v for k, v in config.items() if k != "sliding_window"}
    assert ModelConfig.from_hf_dict({**mistral, "model_type": "mistral"}).sliding_window == 4096
    (tmp_path / "config.json").unlink()
    (tmp_path / "config.json").write_bytes(b'{"model_type": "ll\xe2ma"}')
    with pytest.raises(ModelLoadError, match="unreadable config"):
        load_model(tmp_path)


def test_a_config_is_read_as_transformers_reads_it_or_refused_in_a_line():
    """Dynamic NTK with original_max_position_embeddings (transformers ignores the key: it stretched every
    position), a sliding_window on Llama (which has none) or on Qwen2 past its layers (it capped the
    positions), Llama's attention_bias (on o_proj too: refused as the tensors loaded, by another name),
    an incomplete rope_scaling (a KeyError traceback as the model loaded)."""
    base = {"model_type": "llama", "vocab_size": 96, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 4096}
    dynamic = ModelConfig.from_hf_dict({**base, "rope_scaling": {
        "rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 2048}})
    assert dynamic.rope_scaling == {"rope_type": "dynamic", "factor": 2.0}
    assert ModelConfig.from_hf_dict({**base, "sliding_window": 512}).max_positions == 4096
    # positions a config leaves out are transformers' default for its type (2048 for every type, before)
    bare = {k: v for k, v in base.items() if k != "max_position_embeddings"}
    assert [ModelConfig.from_hf_dict({**bare, "model_type": t}).max_position_embeddings
            for t in ("llama", "mistral", "qwen2")] == [2048, 131072, 32768]
    qwen = {**base, "model_type": "qwen2", "use_sliding_window": True, "sliding_window": 512}
    assert ModelConfig.from_hf_dict({**qwen, "max_window_layers": 2}).max_positions == 4096
    assert ModelConfig.from_hf_dict({**qwen, "max_window_layers": 1}).max_positions == 512  # banded: refused past it
    # layer_types, where given, name the banded layers (a later one banded was run unbanded past 512)
    assert ModelConfig.from_hf_dict({**qwen, "max_window_layers": 2,
                                     "layer_types": ["full_attention", "sliding_attention"]}).max_positions == 512
    assert ModelConfig.from_hf_dict({**qwen, "max_window_layers": 1,
                                     "layer_types": ["full_attention"] * 2}).max_positions == 4096
    # rope_scaling beside a transformers 5 config's rope_parameters (Qwen2.5's card adds yarn so): its kind
    # wins, rope_theta stays (the default rope_type was read, and the yarn dropped without a word)
    both = ModelConfig.from_hf_dict({**base, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
                                     "rope_scaling": {"type": "yarn", "factor": 4.0,
                                                      "original_max_position_embeddings": 4096}})
    assert (both.rope_type, both.rope_theta, both.max_positions) == ("yarn", 1e6, 16384)
    legacy = ModelConfig.from_hf_dict({**base, "rope_scaling": {"type": "linear", "factor": 2.0}})
    assert legacy.rope_scaling == {"type": "linear", "factor": 2.0}  # as written (it keys the priors)
    unnamed = ModelConfig.from_hf_dict({**base, "rope_scaling": {"rope_type": None, "type": "yarn", "factor": 2.0}})
    assert unnamed.rope_type == "yarn"  # (a null rope_type read as default dropped the yarn)
    # as a run's record writes it (the record said none where the config scaled RoPE itself)
    assert (both.rope_spec, legacy.rope_spec, unnamed.rope_spec) == ("yarn:4", "linear:2", "yarn:2")
    assert ModelConfig.from_hf_dict(base).rope_spec is None
    assert ModelConfig.from_hf_dict(base).with_rope_scaling("yarn:2.5").rope_spec == "yarn:2.5"
    for extra, message in (({"attention_bias": True}, "attention_bias"), ({"mlp_bias": True}, "mlp_bias"),
                           ({"rope_scaling": {"rope_type": "linear"}}, "'linear' lacks factor"),
                           ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "lacks low_freq_factor"),
                           ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),  # (the whole head rotated)
                           # (a TypeError in rope.py as the model was built; a ZeroDivisionError traceback)
                           ({"rope_scaling": {"rope_type": "dynamic", "factor": None}}, "factor must be a positive"),
                           ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": "1",
                                              "high_freq_factor": 4.0}}, "low_freq_factor must be a number"),
                           ({"rope_scaling": {"rope_type": "linear", "factor": 0}}, "factor must be a positive"),
                           ({"num_attention_heads": 0}, "sizes must be positive .*num_attention_heads 0"),
                           ({"num_key_value_heads": -2}, "num_key_value_heads -2"),
                           ({"num_hidden_layers": -1}, "num_hidden_layers -1"),
                           ({"quantization_config": {"quant_method": "gptq", "bits": 4}},  # (named its scales
                            "a gptq quantized checkpoint")):  # as extra tensors, its weights as missing)
        with pytest.raises(ModelLoadError, match=message):
            ModelConfig.from_hf_dict({**base, **extra})
    assert ModelConfig.from_hf_dict({**base, "model_type": "qwen2"}).attention_bias  # Qwen2's q, k, v bias
    # transformers' Qwen2 has that bias whatever attention_bias says, and bands at 4096 where a config turns
    # the window on without a size (no window here, silently, past 4096 tokens)
    assert ModelConfig.from_hf_dict({**base, "model_type": "qwen2", "attention_bias": False}).attention_bias
    unsized = {k: v for k, v in qwen.items() if k != "sliding_window"}
    assert ModelConfig.from_hf_dict({**unsized, "max_window_layers": 1}).max_positions == 4096
    assert ModelConfig.from_hf_dict({**unsized, "max_window_layers": 1, "max_position_embeddings": 8192}
                                    ).sliding_window == 4096


def test_a_configs_own_linear_or_yarn_scaling_stretches_its_positions_as_vllm_counts_them():
    """Qwen2.5's card adds yarn x4 of 32,768 to reach 131,072 tokens, max_position_embeddings left at
    32,768: the positions were capped there (and --rope-scaling refused: the config scales already). A
    config that wrote the stretched count keeps it; dynamic NTK and llama3 keep theirs as written."""
    base = {"model_type": "qwen2", "vocab_size": 96, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 32768}
    yarn = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    assert ModelConfig.from_hf_dict({**base, "rope_scaling": yarn}).max_positions == 131072
    assert ModelConfig.from_hf_dict({**base, "max_position_embeddings": 131072, "rope_scaling": yarn}).max_positions \
        == 131072
    assert ModelConfig.from_hf_dict({**base, "rope_scaling": {"rope_type": "linear", "factor": 4.0}}).max_positions \
        == 131072  # vicuna-16k's kind: 4,096 x 4
    assert ModelConfig.from_hf_dict({**base, "rope_scaling": {"rope_type": "dynamic", "factor": 4.0}}).max_positions \
        == 32768
    assert ModelConfig.from_hf_dict({**base, "rope_scaling": {"rope_type": "linear", "factor": 1e9}}).max_positions \
        == 32768 * 64  # a table of every position is made as it loads: bounded as --rope-scaling is


def test_missing_tensor_is_a_clear_error(tiny_dir, tmp_path):
    folder = tiny_dir("llama2-broken", arch="llama2", seed=6)
    tensors = load_file(str(folder / "model.safetensors"))
    tensors.pop("model.layers.1.mlp.up_proj.weight")
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    with pytest.raises(ModelLoadError, match="up_proj"):
        load_model(tmp_path)


def test_unsupported_architecture_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "vocab_size": 10}))
    with pytest.raises(ModelLoadError, match="gpt2"):
        load_model(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps([{"model_type": "llama"}]))
    with pytest.raises(ModelLoadError, match="holds a list"):
        load_model(tmp_path)


@pytest.mark.parametrize("act, loads", [("gelu", False), ("relu", False), ("silu", True), ("swish", True)])
def test_only_a_silu_gate_loads(tiny_dir, tmp_path, act, loads):
    """A Llama config with another hidden_act loaded and ran SiLU: log-probabilities off by up to 0.96."""
    folder = tiny_dir("llama2-act", arch="llama2", seed=6)
    config = json.loads((folder / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "hidden_act": act}))
    (tmp_path / "model.safetensors").symlink_to(folder / "model.safetensors")
    if loads:
        assert load_model(tmp_path).config.num_layers == config["num_hidden_layers"]
    else:
        with pytest.raises(ModelLoadError, match=f"hidden_act '{act}'"):
            load_model(tmp_path)


@pytest.mark.slow
def test_smollm2_logits_match_transformers(smollm2_dir):
    from triforce.models.config import ModelConfig

    cfg = ModelConfig.from_folder(smollm2_dir)
    assert (cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.vocab_size) == (30, 9, 3, 49152)
    ids = torch.randint(0, cfg.vocab_size, (256,), generator=torch.Generator().manual_seed(0))
    ours = our_logits(load_model(smollm2_dir), ids, 200)
    assert (ours - hf_logits(smollm2_dir, ids)).abs().max().item() <= 1e-4


@pytest.mark.parametrize("dtype, value", [("float32", float("nan")), ("float16", 1e6)])
def test_weights_that_are_not_finite_are_refused(tiny_dir, tmp_path, dtype, value):
    """Damaged bytes (NaN) ran and answered token 0 again and again; 1e6 is past float16's range."""
    folder = tiny_dir("llama2-act", arch="llama2", seed=6)
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["model.layers.1.mlp.up_proj.weight"][3, 5] = value
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    with pytest.raises(ModelLoadError, match="up_proj.*NaN or infinite"):
        load_model(tmp_path, dtype)
    tensors["model.layers.1.mlp.up_proj.weight"].fill_(60.0)  # finite in float16, though its sum is not
    save_file(tensors, str(tmp_path / "model.safetensors"))
    assert load_model(tmp_path, dtype).config.num_layers == 2


def test_a_dtype_load_model_does_not_know_is_refused_by_name(tiny_dir):
    """load_model(folder, "half") raised a KeyError: 'half' (the CLI has its own choices; the API callers not)."""
    with pytest.raises(ModelLoadError, match="dtype must be one of auto, float32, bfloat16, float16 .got 'half'"):
        load_model(tiny_dir("llama2-act", arch="llama2", seed=6), "half")


def test_the_rope_table_is_the_same_computed_a_few_positions_at_a_time(monkeypatch):
    """The table is computed in pieces of ROWS_AT_ONCE positions (a whole one's float32 temporaries took as
    much again as the table); every row equals the whole computation's, bit for bit, grown or not."""
    from triforce.models import rope as rope_module
    from triforce.models.rope import RotaryEmbedding

    cfg = ModelConfig(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1,
                      num_heads=2, num_kv_heads=1, head_dim=16, max_position_embeddings=100,
                      rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 25})
    whole = RotaryEmbedding(cfg)
    monkeypatch.setattr(rope_module, "ROWS_AT_ONCE", 7)
    pieces = RotaryEmbedding(cfg)
    assert torch.equal(pieces.cos, whole.cos) and torch.equal(pieces.sin, whole.sin) and len(whole.cos) > 7
    pieces.reach(len(whole.cos) + 30)
    monkeypatch.setattr(rope_module, "ROWS_AT_ONCE", 1 << 16)
    whole.reach(len(whole.cos) + 30)
    assert torch.equal(pieces.cos, whole.cos) and torch.equal(pieces.sin, whole.sin)


def test_a_forward_that_ends_on_the_rope_tables_last_row_does_not_grow_it(tiny_dir):
    """The table covers the model's positions and a margin up front, and grows only for positions past it
    (a CUDA graph holds its address): a step whose last token sits on its last row grew it (reached one row
    too far)."""
    from triforce.cache.full import FullKVCache

    model = load_model(tiny_dir("short-positions", max_position_embeddings=64))
    rows = len(model.rope.cos)
    cache = FullKVCache(model.config, rows, model.dtype, "cpu")
    model(torch.randint(3, 60, (rows - 1,)), cache, logits_for="none")
    table = model.rope.cos
    model(torch.tensor([5]), cache, logits_for="none")  # position rows - 1: the table's last row
    assert model.rope.cos is table and len(model.rope.cos) == rows


def test_a_forward_past_the_models_positions_reaches_the_rope_table_before_a_streaming_cache_begins(tiny_dir):
    """A draft runs past its own positions over a streaming cache. After a skip, the first forward's window
    starts at its own first token, and the cache turns its sinks by that position (less the sinks) as it
    begins: the forward makes the rope table reach its positions before any cache begins. Its logits equal
    those of the same forward over a table extended beforehand."""
    from triforce.cache.streaming import StreamingKVCache
    from triforce.models.rope import POSITION_MARGIN

    folder = tiny_dir("short-positions", max_position_embeddings=64)
    logits = []
    for extend_first in (False, True):
        model = load_model(folder)
        table = len(model.rope.cos)
        assert table == 64 + POSITION_MARGIN
        if extend_first:
            model.rope.reach(3 * table)
        cache = StreamingKVCache(model.config, 2, 8, 4, model.rope, model.dtype, "cpu")
        model(torch.tensor([1, 2, 3, 4]), cache, logits_for="none")
        cache.skip(2 * table)
        logits.append(model(torch.tensor([5, 6, 7]), cache))
    torch.testing.assert_close(logits[0], logits[1], rtol=0, atol=0)
