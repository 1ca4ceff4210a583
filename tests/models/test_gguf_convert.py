"""gguf_convert.py turns GGUF tensors into a Hugging Face checkpoint tensor by tensor: on tiny GGUF files this
test writes (llama, whose q/k rows llama.cpp reorders, and qwen2, with biases and without), every tensor
equals what transformers reads from the same file, shards included."""
import json
import logging

import numpy as np
import pytest
import safetensors.torch
import torch
from safetensors.torch import load_file

from triforce.models import gguf_convert
from triforce.models.config import ModelLoadError

gguf = pytest.importorskip("gguf")

HIDDEN, HEADS, KV_HEADS, FFN, VOCAB, LAYERS = 64, 4, 2, 96, 32, 2


def write_gguf(path, arch: str, tied: bool, tokens: list[str] | None = None, yarn: float | None = None,
               rope_freqs: np.ndarray | None = None, split_count: int | None = None, pre: str = "qwen2",
               merges: tuple[str, ...] = ("a b", "b c"), scale_linear: float | None = None) -> None:
    """A random Llama-family GGUF: F32 norms and biases, Q8_0 matrices (as most GGUFs quantize them); with
    `tokens` (VOCAB of them, the last three control tokens, the last the end of sequence), a byte-level BPE
    tokenizer as Qwen2's GGUFs carry one."""
    rng = np.random.default_rng(7)
    w = gguf.GGUFWriter(str(path), arch)
    if tokens:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(pre)
        w.add_token_list(tokens)
        w.add_token_types([gguf.TokenType.NORMAL] * (VOCAB - 3) + [gguf.TokenType.CONTROL] * 3)
        w.add_token_merges(list(merges))
        w.add_eos_token_id(VOCAB - 1)
    w.add_block_count(LAYERS)
    w.add_context_length(256)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(VOCAB)
    if split_count:  # as llama.cpp's gguf-split writes each part
        w.add_uint16("split.no", 0)
        w.add_uint16("split.count", split_count)
    if scale_linear:  # as older converters wrote a SuperHOT or LongChat model's: a factor, no type
        w.add_float32(f"{arch}.rope.scale_linear", scale_linear)
    if yarn:  # as llama.cpp's converter writes a Qwen2.5 128K model's: YaRN by `yarn` over 64 positions
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(yarn)
        w.add_rope_scaling_orig_ctx_len(64)

    def matrix(name, rows, cols):
        q = gguf.quants.quantize(rng.standard_normal((rows, cols)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
        w.add_tensor(name, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)

    def vector(name, n):
        w.add_tensor(name, rng.standard_normal(n).astype(np.float32))

    head = HIDDEN // HEADS
    if rope_freqs is not None:  # llama.cpp's llama3 scaling: divisors of the inverse frequencies, no metadata
        w.add_tensor("rope_freqs.weight", rope_freqs.astype(np.float32))
    matrix("token_embd.weight", VOCAB, HIDDEN)
    vector("output_norm.weight", HIDDEN)
    if not tied:
        matrix("output.weight", VOCAB, HIDDEN)
    for i in range(LAYERS):
        for name, rows in (("attn_q", HIDDEN), ("attn_k", KV_HEADS * head), ("attn_v", KV_HEADS * head)):
            matrix(f"blk.{i}.{name}.weight", rows, HIDDEN)
            if arch == "qwen2":
                vector(f"blk.{i}.{name}.bias", rows)
        matrix(f"blk.{i}.attn_output.weight", HIDDEN, HIDDEN)
        matrix(f"blk.{i}.ffn_gate.weight", FFN, HIDDEN)
        matrix(f"blk.{i}.ffn_up.weight", FFN, HIDDEN)
        matrix(f"blk.{i}.ffn_down.weight", HIDDEN, FFN)
        vector(f"blk.{i}.attn_norm.weight", HIDDEN)
        vector(f"blk.{i}.ffn_norm.weight", HIDDEN)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def transformers_tensors(path) -> dict:
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]


@pytest.mark.parametrize("arch,tied", [("llama", True), ("qwen2", False)])
def test_tensors_equal_what_transformers_reads(tmp_path, monkeypatch, arch, tied):
    path = tmp_path / f"{arch}.gguf"
    write_gguf(path, arch, tied)
    config = {"num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS}
    tensors = gguf_convert.gguf_tensors(gguf.GGUFReader(path), arch, config)
    monkeypatch.setattr(gguf_convert, "SHARD_BYTES", 4 * FFN * HIDDEN * 3)  # several shards
    out = tmp_path / "out"
    out.mkdir()
    events = []  # each tensor is made only while its shard is written
    made = [(name, nbytes, lambda name=name, make=make: events.append(name) or make())
            for name, nbytes, make in tensors]
    save = safetensors.torch.save_file
    monkeypatch.setattr(safetensors.torch, "save_file",
                        lambda shard, *args, **kw: events.append(set(shard)) or save(shard, *args, **kw))
    gguf_convert.write_shards(made, out)
    saves = [i for i, e in enumerate(events) if isinstance(e, set)]
    for start, end in zip([-1] + saves, saves):
        assert set(events[start + 1:end]) == events[end]
    files = sorted(out.glob("model-*.safetensors"))
    assert len(files) > 2 and (out / "model.safetensors.index.json").is_file()
    ours = {}
    for f in files:
        ours.update(load_file(f))
    theirs = transformers_tensors(path)
    assert set(ours) == set(theirs) and ("lm_head.weight" in ours) != tied
    for name, t in theirs.items():
        assert torch.equal(ours[name], t.float()), name
    # the reordering was undone: llama's q rows differ from the file's order, qwen2's do not
    raw = gguf_convert.gguf_tensors(gguf.GGUFReader(path), "qwen2", config)
    q = dict((n, make) for n, _, make in raw)["model.layers.0.self_attn.q_proj.weight"]()
    assert torch.equal(q, ours["model.layers.0.self_attn.q_proj.weight"]) == (arch == "qwen2")


def test_an_unknown_tensor_or_architecture_is_a_clear_error(tmp_path, monkeypatch):
    for name in ("blk.0.ssm_a.weight", "blk.0", "token_embd"):
        with pytest.raises(ModelLoadError, match=f"'{name}' has no place in a Llama-family model"):
            gguf_convert.hf_name(name)
    assert gguf_convert.hf_name("rope_freqs.weight") is None
    path = tmp_path / "gpt2.gguf"
    w = gguf.GGUFWriter(str(path), "gpt2")
    w.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelLoadError, match="architecture 'gpt2'; triforce reads llama, qwen2"):
        gguf_convert.write_hf_folder(path, tmp_path)
    from triforce.models import folders  # a disk that fills as the conversion ends: one line, no partial
    # folder left (a GB; its OSError was a traceback past the command line's UserError)
    tokens = ["a", "b", "c", "ab", "bc"] + [f"x{i}" for i in range(VOCAB - 8)] + ["<s>", "</s>", "<|end|>"]
    write_gguf(tmp_path / "full.gguf", "qwen2", False, tokens)
    monkeypatch.setattr(folders, "_finish_conversion", lambda folder: (_ for _ in ()).throw(
        OSError(28, "No space left on device", str(folder / "generation_config.json"))))
    with pytest.raises(ModelLoadError, match=r"cannot convert full.gguf into .*dest \(No space left on device: "):
        folders.convert_gguf(tmp_path / "full.gguf", tmp_path / "dest")
    assert not list(tmp_path.glob("dest*"))
    truncated = tmp_path / "truncated.gguf"
    write_gguf(tmp_path / "whole.gguf", "llama", True)
    truncated.write_bytes((tmp_path / "whole.gguf").read_bytes()[:-4096])
    with pytest.raises(ModelLoadError, match="truncated.gguf: cannot convert as a Llama-family GGUF"):
        gguf_convert.write_hf_folder(truncated, tmp_path)


def test_a_ggufs_rope_scaling_reaches_the_converted_config(tmp_path, monkeypatch):
    """transformers' GGUF reader leaves a llama or qwen2 GGUF's RoPE scaling out of its config, so a Qwen2.5
    128K GGUF (yarn, factor 4 over 32,768) converted into a model that ran unscaled at every position, where
    llama.cpp scales them."""
    from triforce.cache.full import FullKVCache
    from triforce.models.config import ModelConfig
    from triforce.models.loader import load_model

    tokens = ["a", "b", "c", "ab", "bc"] + [f"x{i}" for i in range(VOCAB - 8)] + ["<|endoftext|>", "<|im_start|>",
                                                                                 "<|im_end|>"]
    folders = {}
    for yarn in (None, 4.0):
        path = tmp_path / f"qwen-{yarn}.gguf"
        write_gguf(path, "qwen2", False, tokens, yarn=yarn)
        folders[yarn] = tmp_path / f"out-{yarn}"
        folders[yarn].mkdir()
        gguf_convert.write_hf_folder(path, folders[yarn])
    scaled = ModelConfig.from_folder(folders[4.0])
    assert (scaled.rope_type, scaled.rope_scaling["factor"], scaled.rope_scaling["original_max_position_embeddings"],
            scaled.rope_theta) == ("yarn", 4.0, 64, 10000.0)
    assert ModelConfig.from_folder(folders[None]).rope_type == "default"
    write_gguf(tmp_path / "old.gguf", "llama", False, tokens, scale_linear=4.0)  # no type: llama.cpp's linear
    (tmp_path / "out-old").mkdir()
    gguf_convert.write_hf_folder(tmp_path / "old.gguf", tmp_path / "out-old")
    old = ModelConfig.from_folder(tmp_path / "out-old")  # (it ran unscaled)
    assert (old.rope_type, old.rope_scaling["factor"]) == ("linear", 4.0)
    ids = torch.randint(0, VOCAB, (100,))

    def logits(folder):
        model = load_model(folder, "float32")
        return model(ids, FullKVCache(model.config, len(ids), model.dtype, "cpu"))

    plain, stretched = logits(folders[None]), logits(folders[4.0])
    assert (plain - stretched).abs().max() > 1e-3  # same weights: the scaling changed the positions
    # a folder converted before the scaling was carried gets it when next resolved
    from triforce.models import folders as model_folders

    monkeypatch.setenv("TRIFORCE_HOME", str(tmp_path / "home"))
    converted = model_folders.convert_gguf_cached(tmp_path / "qwen-4.0.gguf")
    config = json.loads((converted / "config.json").read_text())
    (converted / "config.json").write_text(json.dumps({**config, "rope_parameters": {"rope_theta": 10000.0,
                                                                                     "rope_type": "default"}}))
    (converted / model_folders.MENDED).unlink()  # as an earlier triforce left it
    assert ModelConfig.from_folder(converted).rope_type == "default"
    assert model_folders.convert_gguf_cached(tmp_path / "qwen-4.0.gguf") == converted
    assert ModelConfig.from_folder(converted).rope_scaling["factor"] == 4.0


def test_a_llama3_gguf_keeps_its_rope_scaling_and_a_split_one_is_refused(tmp_path):
    """llama.cpp keeps Llama 3.1's RoPE scaling only as rope_freqs, the divisors of its inverse frequencies:
    the conversion dropped them and the model ran plain RoPE at every position (transformers' GGUF reader
    too). The divisors become the config's llama3 parameters, which rotate as they divide; divisors of no
    llama3 setting are refused. One part of a split GGUF converted its tensors, then failed to load."""
    from triforce.models.config import ModelConfig
    from triforce.models.rope import _base_inv_freq, inverse_frequencies

    head = HIDDEN // HEADS
    bands = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    base = _base_inv_freq(10000.0, head)
    llama3 = ModelConfig.from_hf_dict({"vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": FFN,
                                       "num_hidden_layers": 1, "num_attention_heads": HEADS,
                                       "rope_scaling": {"rope_type": "llama3", **bands}})
    divisors = (base / inverse_frequencies(llama3)[0]).numpy()  # the reference rotation's (transformers')
    assert (divisors == 1).any() and (divisors == 8).any() and ((divisors > 1) & (divisors < 8)).any()  # 3 bands
    tokens = ["a", "b", "c", "ab", "bc"] + [f"x{i}" for i in range(VOCAB - 8)] + ["<s>", "<pad>", "</s>"]
    path = tmp_path / "llama3.gguf"
    write_gguf(path, "llama", True, tokens, rope_freqs=divisors)
    gguf_convert.write_hf_folder(path, tmp_path)
    config = ModelConfig.from_folder(tmp_path)
    assert config.rope_type == "llama3" and config.rope_scaling == {"rope_type": "llama3", **bands}
    torch.testing.assert_close(base / inverse_frequencies(config)[0], torch.from_numpy(divisors), rtol=1e-6, atol=0)
    odd = tmp_path / "odd.gguf"
    write_gguf(odd, "llama", True, tokens, rope_freqs=divisors[::-1].copy())
    with pytest.raises(ModelLoadError, match="no llama3 scaling triforce knows"):
        gguf_convert.write_hf_folder(odd, tmp_path / "odd")
    part = tmp_path / "model-00001-of-00003.gguf"
    write_gguf(part, "llama", True, tokens, split_count=3)
    with pytest.raises(ModelLoadError, match="one of 3 parts of a split GGUF; join them first"):
        gguf_convert.write_hf_folder(part, tmp_path / "part")


def test_a_smollm_gguf_splits_digits_first_as_llama_cpp_does_and_an_old_folder_is_mended(tmp_path, monkeypatch,
                                                                                          caplog):
    """SmolLM2's GGUF names its pre-tokenizer "smollm": llama.cpp (and Hugging Face's own tokenizer) split
    digits alone before GPT-2's pattern, which transformers' GGUF reader does not know, so the converted
    tokenizer split "a  12" into a, one space, one space + 1, 2 where they give a, two spaces, 1, 2. A folder
    converted before is mended when next resolved."""
    from transformers import AutoTokenizer

    from triforce.models import folders

    tokens = ["a", "\u0120", "\u0120\u0120", "1", "2", "\u01201"] + [f"x{i}" for i in range(VOCAB - 9)] + \
        ["<s>", "<pad>", "</s>"]
    merges = ("\u0120 \u0120", "\u0120 1")
    texts = {}
    other = {"version": "1.0", "added_tokens": [], "model": {"type": "WordLevel", "vocab": {"a": 0, "<unk>": 1},
                                                            "unk_token": "<unk>"}}
    (tmp_path / "tokenizer.json").write_text(json.dumps(other))  # another model's beside the GGUFs: not read (a
    # llama GGUF's tokenizer was this one, and every prompt other ids)
    for pre in ("gpt2", "smollm"):
        path = tmp_path / f"{pre}.gguf"
        write_gguf(path, "llama", True, tokens, pre=pre, merges=merges)
        out = tmp_path / pre
        out.mkdir()
        gguf_convert.write_hf_folder(path, out)
        tokenizer = AutoTokenizer.from_pretrained(out)
        texts[pre] = tokenizer.convert_ids_to_tokens(tokenizer("a  12", add_special_tokens=False).input_ids)
    assert texts["smollm"] == ["a", "\u0120\u0120", "1", "2"]  # llama.cpp's split of the same text
    assert texts["gpt2"] == ["a", "\u0120", "\u01201", "2"]  # GPT-2's pattern alone: what it was
    for pre in ("deepseek-llm", "default"):  # a pre-tokenizer no one checked (llama.cpp's default splits
        write_gguf(tmp_path / f"{pre}.gguf", "llama", True, tokens, pre=pre, merges=merges)  # punctuation
        (tmp_path / pre).mkdir()  # apart, GPT-2's does not): it may split otherwise, said
        with caplog.at_level(logging.WARNING):
            gguf_convert.write_hf_folder(tmp_path / f"{pre}.gguf", tmp_path / pre)
        assert f"pre-tokenizer {pre} is not one triforce knows" in caplog.text
    monkeypatch.setenv("TRIFORCE_HOME", str(tmp_path / "home"))
    folder = folders.convert_gguf_cached(tmp_path / "smollm.gguf")
    old = json.loads((tmp_path / "gpt2" / "tokenizer.json").read_text())["pre_tokenizer"]
    saved = json.loads((folder / "tokenizer.json").read_text())
    (folder / "tokenizer.json").write_text(json.dumps({**saved, "pre_tokenizer": old}))  # as converted before
    assert folders.convert_gguf_cached(tmp_path / "smollm.gguf") == folder  # mended once: not looked at again
    assert json.loads((folder / "tokenizer.json").read_text())["pre_tokenizer"] == old
    (folder / folders.MENDED).unlink()  # as an earlier triforce left it
    assert folders.convert_gguf_cached(tmp_path / "smollm.gguf") == folder
    assert json.loads((folder / "tokenizer.json").read_text())["pre_tokenizer"] == saved["pre_tokenizer"]


def test_a_converted_model_ends_generation_where_llama_cpp_does(tmp_path, monkeypatch, umask_022):
    """Qwen2.5's GGUFs name <|im_end|> the end of sequence; llama.cpp also ends at <|endoftext|> (as Qwen's
    generation_config does) and at the fill-in-the-middle file separator. The conversion wrote config.json's
    id only, so a text that ended as a document ran on, and safetensors wrote the weights 0600: a shared
    home's models were their fetcher's only. A folder converted before is mended when next resolved."""
    from triforce.models import folders, hub
    from triforce.models.config import ModelConfig

    monkeypatch.setenv("TRIFORCE_HOME", str(tmp_path / "home"))
    tokens = ["a", "b", "c", "ab", "bc", "<|file_sep|>"] + [f"x{i}" for i in range(VOCAB - 9)] + \
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # the separator a plain token, as llama.cpp reads it too
    path = tmp_path / "qwen.gguf"
    write_gguf(path, "qwen2", False, tokens)
    folder = folders.convert_gguf_cached(path)
    ends = [VOCAB - 1, 5, VOCAB - 3]  # <|im_end|>, then <|file_sep|> and <|endoftext|>; not <|im_start|>
    assert json.loads((folder / "generation_config.json").read_text()) == {"eos_token_id": ends}
    assert ModelConfig.from_folder(folder).eos_token_ids == tuple(ends)
    assert {p.stat().st_mode & 0o777 for p in folder.iterdir()} == {0o644}
    for resolve in (lambda: folders.convert_gguf_cached(path), lambda: hub.resolve_model(folder)):
        (folder / "generation_config.json").unlink()  # as converted before
        (folder / "model.safetensors").chmod(0o600)
        assert ModelConfig.from_folder(folder).eos_token_ids == (VOCAB - 1,)
        assert resolve() == folder
        assert ModelConfig.from_folder(folder).eos_token_ids == tuple(ends)
        assert (folder / "model.safetensors").stat().st_mode & 0o777 == 0o644


def test_control_tokens_outside_the_byte_alphabet_stay_whole_as_llama_cpp_matches_them(tmp_path, monkeypatch):
    """DeepSeek-R1's distilled models (qwen2 and llama GGUFs) write their turns "<｜User｜>", with full-width
    bars: transformers' GGUF reader respelled such a control token in bytes and left it out of the added
    tokens, so a chat prompt's turn became a dozen byte tokens, another text than the model was taught. Each
    is one token at its GGUF id, special (skipped where asked), as llama.cpp reads it; a folder converted
    before is mended once."""
    from transformers import AutoTokenizer

    from triforce.models import folders, gguf_tokenizer

    monkeypatch.setenv("TRIFORCE_HOME", str(tmp_path / "home"))
    tokens = ["a", "b", "c", "ab", "bc"] + [f"x{i}" for i in range(VOCAB - 8)] + \
        ["<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>"]
    user, assistant, end = VOCAB - 3, VOCAB - 2, VOCAB - 1
    path = tmp_path / "r1.gguf"
    write_gguf(path, "qwen2", False, tokens)

    def whole(folder):
        tokenizer = AutoTokenizer.from_pretrained(folder)
        return (len(tokenizer) == VOCAB and tokenizer.decode([user, 3, end]) == "<｜User｜>ab<｜end▁of▁sentence｜>" and
                tokenizer.decode([user, 3, end], skip_special_tokens=True) == "ab" and
                tokenizer("<｜User｜>ab<｜Assistant｜>", add_special_tokens=False).input_ids == [user, 3, assistant])

    monkeypatch.setattr(gguf_tokenizer, "mend_special_tokens", lambda *_: False)  # converted as before
    folder = folders.convert_gguf_cached(path)
    assert not whole(folder)
    assert max(json.loads((folder / "generation_config.json").read_text())["eos_token_id"]) >= VOCAB
    monkeypatch.undo()
    monkeypatch.setenv("TRIFORCE_HOME", str(tmp_path / "home"))
    (folder / folders.MENDED).unlink()
    assert folders.convert_gguf_cached(path) == folder and whole(folder)
    assert json.loads((folder / "generation_config.json").read_text())["eos_token_id"] == [end]  # (an id past
    # the vocabulary, which the text named, gone)
    saved = (folder / "tokenizer.json").read_text()
    assert not gguf_tokenizer.mend_special_tokens(folder, tokens, [])  # a GGUF without token types: as it is
    assert (folder / "tokenizer.json").read_text() == saved
    out = tmp_path / "out"
    out.mkdir()
    gguf_convert.write_hf_folder(path, out)
    assert whole(out)
