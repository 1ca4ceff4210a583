"""A reduced-vocabulary draft: target ids in, target-vocabulary logits out, -inf where it cannot propose."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from checkpoints import write_reduced_vocabulary
from mode_settings import for_mode
from triforce.cache.full import FullKVCache
from triforce.models.config import ModelLoadError
from triforce.models.loader import load_model
from triforce.models.vocab import ReducedVocabulary

KEPT = [0, 2, 3, 5, 7]  # of an 8-token target vocabulary
VOCAB_ROWS = ("model.embed_tokens.weight", "lm_head.weight")


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
    cache = FullKVCache(draft.config, 8, draft.dtype, "cpu")
    logits = draft(ids, cache)
    assert logits.shape == (4, 8) and torch.isinf(logits[:, [1, 4, 6]]).all()
    same = draft(torch.tensor([6, 2, 7, 1]), FullKVCache(draft.config, 8, draft.dtype, "cpu"))
    torch.testing.assert_close(same, logits)


@pytest.mark.parametrize("ids,why", [([0, 2, 9, 3, 5], "lie in"), ([0, 2, 2, 3, 5], "repeat"),
                                     ([0, 2, 3], "expected vocab_size - 1"),
                                     ([0, 2.7, 3, 4, 5], "must be a list of integers"), (5, "must be a list of")])
def test_bad_reduced_vocabulary_is_refused(tiny_dir, tmp_path, ids, why):
    import shutil

    folder = tmp_path / "bad"
    shutil.copytree(tiny_dir("reduced-6", vocab_size=6, seed=3), folder)
    (folder / "triforce_draft.json").write_text(json.dumps({"target_vocab_size": 8, "token_ids": ids}))
    with pytest.raises(ModelLoadError, match=why):
        load_model(folder)


@pytest.mark.parametrize("target_rows, draft_rows", [(96, 112), (112, 100)])
def test_a_draft_padded_to_other_rows_over_one_tokenizer_is_exact(tiny_dir, tmp_path, target_rows, draft_rows):
    """Embeddings padded past the tokenizer to different sizes (Qwen2.5-7B against -0.5B) were refused as a
    different tokenizer; the draft now reads and proposes the tokenizer's 96 tokens, and greedy equals `ar`."""
    from checkpoints import write_tiny_tokenizer
    from triforce import LLM, SamplingParams

    target = tiny_dir(f"padded-target-{target_rows}", seed=61, vocab_size=target_rows, scale=25)
    draft = tmp_path / "draft"  # the target's weights over draft_rows rows: it proposes what the target would
    draft.mkdir()
    config = json.loads((target / "config.json").read_text())
    (draft / "config.json").write_text(json.dumps({**config, "vocab_size": draft_rows}))
    rows = {name: t[:draft_rows] if t.shape[0] >= draft_rows else torch.cat((t, torch.randn(draft_rows - t.shape[0], *t.shape[1:])))
            for name, t in load_file(str(target / "model.safetensors")).items() if name in VOCAB_ROWS}
    save_file({**load_file(str(target / "model.safetensors")), **rows}, str(draft / "model.safetensors"))
    for folder in (target, draft):
        write_tiny_tokenizer(folder, 96)  # ids 0-95; rows past them pad the embedding
    prompt = " ".join(f"w{3 + i * 7 % 90}" for i in range(40))
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    plain = LLM(str(target), mode="ar", dtype="float32").generate(prompt, params)[0].token_ids
    for mode in ("draft", "triforce"):
        llm = LLM(str(target), str(draft), mode=mode, dtype="float32",
                  **for_mode(mode, dict(budget=32, chunk_size=4, sinks=2, window=64)))
        assert llm.draft.output_vocab_size == target_rows and llm.draft.vocab.size == 96
        out = llm.generate(prompt, params)[0]
        assert out.token_ids == plain and out.metrics.tiers[0].accepted > 0, mode


def test_a_draft_of_another_tokenizer_is_refused(tiny_dir):
    from triforce import LLM

    target = tiny_dir("padded-target-96", seed=61, vocab_size=96, scale=25, tokenizer=True)
    with pytest.raises(ModelLoadError, match="draft tokenizer differs"):
        LLM(str(target), str(tiny_dir("other-tokens-80", seed=62, vocab_size=80, tokenizer=True)), mode="draft")


def test_a_draft_whose_tokens_cannot_be_read_or_checked_is_refused_or_said(tiny_dir, tmp_path, caplog):
    """A draft's damaged tokenizer.json raised KeyError or a bare Exception out of transformers: a traceback.
    A draft with no tokenizer beside a target with one is taken by its rows alone (Llama-2 and Mistral have
    32,000 each): said."""
    import logging
    import shutil

    from triforce import LLM

    target = tiny_dir("padded-target-96", seed=61, vocab_size=96, scale=25, tokenizer=True)
    damaged = tmp_path / "damaged"
    shutil.copytree(tiny_dir("same-tokens-96", seed=63, vocab_size=96, tokenizer=True, num_layers=1), damaged)
    (damaged / "tokenizer.json").write_text('{"model": {"type": "BPE"}}')
    with pytest.raises(ModelLoadError, match="the draft: .*the draft's tokenizer cannot be read"):
        LLM(str(target), str(damaged), mode="draft")
    with caplog.at_level(logging.WARNING, logger="triforce"):
        LLM(str(target), str(tiny_dir("no-tokens-96", seed=64, vocab_size=96, num_layers=1)), mode="draft", window=64)
    assert "the draft's tokens cannot be checked against the target's" in caplog.text
