"""models/tokenizer.py: a model folder's tokenizer, or a clear error where it has one that does not load."""
import json

import pytest

from triforce.models.config import ModelLoadError
from triforce.models.tokenizer import load_tokenizer

UNREADABLE = [{"version": "1.0", "model": {"type": "BPE"}},  # transformers: a KeyError ('added_tokens')
              {"version": "1.0", "added_tokens": [], "normalizer": None, "pre_tokenizer": None,
               "post_processor": None, "decoder": None, "model": {"type": "Nope"}}]  # tokenizers: an Exception


@pytest.mark.parametrize("content", UNREADABLE)
def test_a_tokenizer_file_the_libraries_cannot_read_is_one_line(tiny_dir, tmp_path, content):
    """A tokenizer.json in another version's layout raised a KeyError or tokenizers' plain Exception, which
    went up as a traceback; it is there, so it is an error, not a folder without a tokenizer."""
    target = tiny_dir("api-target", tokenizer=True, seed=51)
    for path in target.iterdir():
        if path.name != "tokenizer.json":
            (tmp_path / path.name).symlink_to(path)
    (tmp_path / "tokenizer.json").write_text(json.dumps(content))
    assert load_tokenizer(target, 96) is not None
    with pytest.raises(ModelLoadError, match="cannot read the tokenizer in"):
        load_tokenizer(tmp_path, 96)


def test_a_llama_folder_converted_from_a_gguf_loads_its_generic_tokenizer_without_the_models_config(tmp_path, monkeypatch):
    """A folder triforce converted (READY) whose tokenizer_config.json names transformers' generic
    tokenizer.json class loads that class directly, as AutoTokenizer would after importing the model type's
    config module (about 1 s of every command's start): the same class, ids and chat template, and that
    module is not imported. Another model type's folder, or a folder triforce did not convert, goes through
    AutoTokenizer."""
    import subprocess
    import sys

    from transformers import AutoTokenizer

    from test_gguf_convert import VOCAB, write_gguf
    from triforce.models import folders

    tokens = ["a", "\u0120", "b", "c", "ab", "bc"] + [f"x{i}" for i in range(VOCAB - 9)] + ["<s>", "<pad>", "</s>"]
    write_gguf(tmp_path / "m.gguf", "llama", True, tokens)
    monkeypatch.setenv("TRIFORCE_HOME", str(tmp_path / "home"))
    folder = folders.convert_gguf_cached(tmp_path / "m.gguf")
    assert json.loads((folder / "tokenizer_config.json").read_text())["tokenizer_class"] in ("TokenizersBackend",
                                                                                              "PreTrainedTokenizerFast")
    (folder / "chat_template.jinja").write_text("{% for m in messages %}<s>{{ m['content'] }}</s>{% endfor %}")
    text, chat = "a b c a  bc x1x2", [{"role": "user", "content": "a b"}]
    probe = ("import sys, json; from pathlib import Path; from triforce.models.tokenizer import load_tokenizer; "
             f"t = load_tokenizer(Path({str(folder)!r}), {VOCAB}); "
             f"print(json.dumps([type(t).__name__, t({text!r}).input_ids, t.chat_template, "
             "'transformers.models.llama.configuration_llama' in sys.modules]))")
    name, ids, template, imported = json.loads(subprocess.run([sys.executable, "-c", probe], capture_output=True,
                                                              text=True, check=True).stdout)
    auto = AutoTokenizer.from_pretrained(folder)
    assert (name, ids, template) == (type(auto).__name__, auto(text).input_ids, auto.chat_template)
    assert not imported
    assert auto.apply_chat_template(chat, tokenize=False) == load_tokenizer(folder, VOCAB).apply_chat_template(
        chat, tokenize=False)
    calls = []
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", lambda *a, **k: calls.append(a) or auto)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "qwen2"}))  # AutoTokenizer may
    assert load_tokenizer(folder, VOCAB) is auto and calls  # override a generic class for another model type
    calls.clear()
    (folder / "config.json").write_text(json.dumps(config))
    (folder / folders.READY).unlink()  # a folder of the user's: AutoTokenizer decides
    assert load_tokenizer(folder, VOCAB) is auto and calls
