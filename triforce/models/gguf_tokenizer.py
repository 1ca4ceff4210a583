"""What a GGUF's tokenizer, as transformers' GGUF reader converts it, needs mended to split text as llama.cpp
splits it: the pre-tokenizer of the names it does not know (mend_pre_tokenizer), and the control and
user-defined tokens written outside the byte alphabet (mend_special_tokens). Both rewrite a converted
folder's tokenizer.json, at conversion and once for folders converted before (folders.py)."""
from __future__ import annotations

import json
from pathlib import Path

from ..files import write_whole

# GGUF pre-tokenizer names whose text llama.cpp splits into single digits before GPT-2's pattern (its
# llama-vocab.cpp groups them); transformers' GGUF reader knows none of them and splits by GPT-2's alone
DIGITS_FIRST = frozenset({"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"})
# The byte-level pre-tokenizers a converted tokenizer is known to split as llama.cpp does: DIGITS_FIRST's
# (mended here), GPT-2's own, and those transformers' GGUF reader sets (Llama 3's, Qwen2's, Mistral's
# tekken). Not "default": llama.cpp's default splits punctuation and runs of digits apart, GPT-2's does not.
CHECKED_PRE = DIGITS_FIRST | {"gpt2", "llama-bpe", "qwen2", "tekken"}
CONTROL, USER_DEFINED = 3, 4  # GGUF's token types (gguf.TokenType) of tokens matched whole in a text


def mend_pre_tokenizer(folder: Path, pre: str | None) -> bool:
    """Gives `folder`'s tokenizer the pre-tokenizer of GGUF pre-tokenizer name `pre` where transformers' GGUF
    reader leaves the wrong one (DIGITS_FIRST: digits alone, then GPT-2's pattern, as llama.cpp and Hugging
    Face's own SmolLM2 tokenizer split; GPT-2's alone made "x =  1" x, =, one space, one space and 1, not
    x, =, two spaces, 1); whether it changed the file."""
    from tokenizers import Regex, Tokenizer, pre_tokenizers

    path = folder / "tokenizer.json"
    if pre not in DIGITS_FIRST or not path.is_file():
        return False
    wanted = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
                                      pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True,
                                                               use_regex=True)])
    tokenizer = Tokenizer.from_file(str(path))
    if tokenizer.pre_tokenizer is not None and \
            json.loads(tokenizer.pre_tokenizer.__getstate__()) == json.loads(wanted.__getstate__()):
        return False
    tokenizer.pre_tokenizer = wanted
    write_whole(path, tokenizer.to_str())
    return True


def special_tokens_mended(folder: Path, reader) -> bool:
    """mend_special_tokens for a converted folder from its GGUF (`reader`), where its tokenizer is
    byte-level (tokenizer.ggml.model gpt2: the alphabet its texts are respelled in); whether it changed."""
    from .gguf_convert import field_value  # (it imports this module)

    return field_value(reader, "tokenizer.ggml.model") == "gpt2" and mend_special_tokens(folder, *gguf_tokens(reader))


def gguf_tokens(reader) -> tuple[list[str], list[int]]:
    """The texts and the types of a GGUF's tokens ([] and [] where it names none)."""
    tokens, types = reader.fields.get("tokenizer.ggml.tokens"), reader.fields.get("tokenizer.ggml.token_type")
    if tokens is None or types is None:
        return [], []
    return ([bytes(tokens.parts[i]).decode("utf-8", errors="replace") for i in tokens.data],
            [int(types.parts[i][0]) for i in types.data])


def mend_special_tokens(folder: Path, tokens: list[str], types: list[int]) -> bool:
    """Gives `folder`'s byte-level tokenizer each control and user-defined token of its GGUF (`tokens`,
    `types`: gguf_tokens) whose text lies outside the byte alphabet, whole at its GGUF id, as llama.cpp
    matches them: transformers' GGUF reader respelled their texts in bytes and left them out of the added
    tokens (a "mislabel" to it), so DeepSeek-R1's distilled models' turns, "<｜User｜>" with full-width bars,
    became a dozen byte tokens each, and their chat prompts another text than the model was taught; and
    the end of sequence, named by its text, it added anew past the vocabulary, as it adds the defaults of
    the tokenizer class it picks: ids no embedding row holds, dropped. Whether it changed the file."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    path = folder / "tokenizer.json"
    if not tokens or len(tokens) != len(types) or not path.is_file():  # (types are optional in a GGUF)
        return False
    data = json.loads(path.read_text(encoding="utf-8"))
    vocab = data.get("model", {}).get("vocab")
    if data.get("model", {}).get("type") != "BPE" or not isinstance(vocab, dict):
        return False
    alphabet = set(bytes_to_unicode().values())
    wanted = {text: (index, kind == CONTROL) for index, (text, kind) in enumerate(zip(tokens, types))
              if kind in (CONTROL, USER_DEFINED) and text and not set(text) <= alphabet}
    entries = data.get("added_tokens", [])
    kept = [e for e in entries if e["content"] not in wanted and e["id"] < len(tokens)]
    spelled = {index: text for text, index in vocab.items()}
    for text, (index, special) in wanted.items():
        vocab.pop(spelled.get(index), None)  # its bytes' spelling, which no merge makes
        vocab[text] = index
        kept.append({"id": index, "content": text, "single_word": False, "lstrip": False, "rstrip": False,
                     "normalized": False, "special": special})
    kept.sort(key=lambda e: e["id"])
    if kept == entries and all(spelled.get(index) == text for text, (index, _) in wanted.items()):
        return False
    data["added_tokens"] = kept
    write_whole(path, json.dumps(data, ensure_ascii=False, indent=2))
    return True
