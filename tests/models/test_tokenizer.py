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
