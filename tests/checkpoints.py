"""Tiny random-weight Hugging Face checkpoints, written by the tests themselves."""
from __future__ import annotations

from pathlib import Path

import torch

ARCHITECTURES = {
    "llama2": dict(model_type="llama"),
    "llama3": dict(model_type="llama", rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 32}),
    "linear": dict(model_type="llama", rope_scaling={"rope_type": "linear", "factor": 2.0}),
    "dynamic": dict(model_type="llama", rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
    "yarn": dict(model_type="llama", rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                   "original_max_position_embeddings": 128}),
    "mistral": dict(model_type="mistral", sliding_window=None),
    "qwen2": dict(model_type="qwen2", tie_word_embeddings=True),
}


def write_tiny_checkpoint(folder: Path, arch: str = "llama2", seed: int = 0, vocab_size: int = 96,
                          hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4, num_kv_heads: int = 2,
                          max_position_embeddings: int = 512, tie: bool | None = None, scale: float = 1.0) -> Path:
    """Writes a random-weight checkpoint of `arch` with transformers itself and returns its folder.
    `scale` multiplies the initializer range: larger weights give peakier, more varied distributions."""
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = dict(ARCHITECTURES[arch])
    model_type = spec.pop("model_type")
    if tie is not None:
        spec["tie_word_embeddings"] = tie
    config = AutoConfig.for_model(
        model_type, vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings, initializer_range=0.02 * scale,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, **spec)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # random norms and biases, so a wrong mapping of them cannot hide
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.normal_(0, 0.05)
    folder = Path(folder)
    model.save_pretrained(folder)
    return folder


def write_tiny_tokenizer(folder: Path, vocab_size: int) -> None:
    """A word-level tokenizer over made-up words w3..w{V-1} (0 pad, 1 bos, 2 eos), saved beside the weights."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, vocab_size)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(folder)


CHARS = "abcdefghijklmnopqrstuvwxyz0123456789 ABCDEFGHIJKLMNOPQRSTUVWXYZ{}[]:,.\"'!?;()-_+=*/<>@#$%&^~|`\\"


def write_char_tokenizer(folder: Path, vocab_size: int) -> None:
    """A byte-level BPE tokenizer (as GPT-2's, which llguidance reads) whose tokens are single characters:
    0 pad, 1 bos, 2 eos, then CHARS[:vocab_size - 3] (letters first, then digits and a space), saved beside
    the weights."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = CHARS[:vocab_size - 3]
    assert len(chars) == vocab_size - 3, "CHARS is too short for this vocabulary"
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{c.replace(" ", "\u0120"): 3 + i for i, c in enumerate(chars)}}
    tok = Tokenizer(models.BPE(vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(folder)


def metaspace_tokenizer(words: list[str]):
    """A word-level tokenizer over `words` with a leading word marker, as Llama 2's and Mistral's SentencePiece
    vocabularies have (0 <unk>, 1 </s>, then the words): a word is a space only after other text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = ["<unk>", "</s>"] + [f"\u2581{w}" for w in words]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>")


def byte_fallback_tokenizer(words: list[str]):
    """A SentencePiece-like BPE tokenizer over `words` (each with and without a word marker) that spells
    anything else in byte tokens <0x00>..<0xFF>, decoded as Llama 2's and Mistral's are (a run of byte tokens
    that ends inside a character decodes to U+FFFD throughout): 0 <unk>, 1 <s>, 2 </s>, then the bytes."""
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{i:02X}>": 3 + i for i in range(256)}}
    for w in [f"\u2581{w}" for w in words] + words + ["\u2581"]:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.BPE(vocab, merges=[], byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def write_reduced_vocabulary(folder: Path, token_ids: list[int], target_vocab_size: int) -> Path:
    """Marks a checkpoint of vocab_size len(token_ids) + 1 as a draft over part of a target's vocabulary."""
    import json

    (Path(folder) / "triforce_draft.json").write_text(
        json.dumps({"format": 1, "target_vocab_size": target_vocab_size, "token_ids": token_ids}))
    return Path(folder)
