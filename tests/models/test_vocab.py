"""A reduced-vocabulary draft: target ids in, target-vocabulary logits out, -inf where it cannot propose."""
import json

import pytest
import torch

from checkpoints import write_reduced_vocabulary
from triforce.cache.full import FullKVCache
from triforce.models.config import ModelLoadError
from triforce.models.loader import load_model
from triforce.models.vocab import ReducedVocabulary

KEPT = [0, 2, 3, 5, 7]  # of an 8-token target vocabulary


def test_encode_and_expand():
    vocab = ReducedVocabulary(torch.tensor(KEPT), 8)
    assert vocab.encode(torch.tensor([0, 1, 2, 7, 6])).tolist() == [0, 5, 1, 4, 5]
    logits = torch.arange(6.0)[None]  # draft ids 0..4 kept, 5 = "other"
    full = vocab.expand_logits(logits)[0]
    assert full[KEPT].tolist() == [0, 1, 2, 3, 4]
    assert torch.isinf(full[[1, 4, 6]]).all()


def test_reduced_draft_reads_target_ids(tiny_dir):
    folder = write_reduced_vocabulary(tiny_dir("reduced-6", vocab_size=6, seed=3), KEPT, 8)
    draft = load_model(folder)
    assert draft.output_vocab_size == 8 and draft.config.vocab_size == 6
    ids = torch.tensor([1, 2, 7, 4])  # 1 and 4 are outside the kept set: both read as the "other" id
    cache = FullKVCache(draft.config, 8, draft.rope, draft.dtype, "cpu")
    logits = draft(ids, cache)
    assert logits.shape == (4, 8) and torch.isinf(logits[:, [1, 4, 6]]).all()
    same = draft(torch.tensor([6, 2, 7, 1]), FullKVCache(draft.config, 8, draft.rope, draft.dtype, "cpu"))
    torch.testing.assert_close(same, logits)


@pytest.mark.parametrize("ids,why", [([0, 2, 9, 3, 5], "lie in"), ([0, 2, 2, 3, 5], "repeat"),
                                     ([0, 2, 3], "expected vocab_size - 1")])
def test_bad_reduced_vocabulary_is_refused(tiny_dir, tmp_path, ids, why):
    import shutil

    folder = tmp_path / "bad"
    shutil.copytree(tiny_dir("reduced-6", vocab_size=6, seed=3), folder)
    (folder / "triforce_draft.json").write_text(json.dumps({"target_vocab_size": 8, "token_ids": ids}))
    with pytest.raises(ModelLoadError, match=why):
        load_model(folder)
