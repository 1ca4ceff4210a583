"""The self-distillation data (draft/generated.py, draft/sources.py): the answers are the target's own
samples, greedy and sampled; the labels a draft trains on are the target's distribution over them; an
interrupted generation resumes; the prompts' held-out subjects never reach training."""
import pytest
import torch
from scipy.stats import chi2

from triforce import LLM
from triforce.draft import prompts
from triforce.draft.data import TargetLabels, pack
from triforce.draft.generated import GeneratedSamples, GenerationSettings, chat_prompt


@pytest.fixture(scope="module")
def llm(tiny_dir):
    return LLM(tiny_dir("gen-target", tokenizer=True, seed=81, num_layers=2, scale=25), mode="ar", dtype="float32")


def hf_model(llm):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(llm.model_path, dtype=torch.float32).eval()


def test_greedy_answers_are_the_targets_greedy_continuations_and_labels_its_distribution(llm, tmp_path):
    settings = GenerationSettings(samples=6, max_tokens=12, temperatures=(0.0, 1.0), batch=4)
    samples = GeneratedSamples(tmp_path / "a", settings)
    samples.generate(llm)
    rows = samples.load()
    assert len(rows) == 6 and [r["temperature"] for r in rows] == [0.0, 1.0] * 3
    reference = hf_model(llm)
    for r in rows[::2]:  # the greedy ones: transformers' greedy decoding of the same prompt
        out = reference.generate(r["prompt"].long()[None], max_new_tokens=12, do_sample=False,
                                 eos_token_id=llm.eos_ids()[0], pad_token_id=0)
        expected = out[0, r["prompt"].numel():].tolist()
        assert r["answer"].tolist() == expected[: len(r["answer"])]
        assert len(r["answer"]) == 12 or r["answer"][-1].item() in llm.eos_ids()

    # The labels of the packed samples are the target's top-k log-probabilities at every position.
    sequences = pack(samples.token_lists(), 16, separator=llm.eos_ids()[0])
    labels = TargetLabels(tmp_path / "labels", top_k=8)
    labels.compute(llm.target, sequences)
    ids, logp = labels.load(sequences.shape[0])
    with torch.no_grad():
        expected = torch.log_softmax(reference(sequences).logits, -1).topk(8, -1)
    torch.testing.assert_close(logp.float(), expected.values, atol=2e-3, rtol=2e-3)
    # Ids agree wherever the ranks are told apart. Ranks of equal probability come in any order (in runs
    # of the pad token, to which the tiny tokenizer maps the prompts' unknown words and whose embedding is
    # zero, every token ties; CPU and CUDA order ties differently).
    values = expected.values
    apart = torch.ones_like(values[..., :3], dtype=torch.bool)
    for j in range(3):
        for neighbour in (j - 1, j + 1):
            if neighbour >= 0:
                apart[..., j] &= (values[..., j] - values[..., neighbour]).abs() > 1e-2
    assert apart.float().mean() > 0.3  # enough ranks apart for the check to mean something
    assert torch.equal(ids.long()[..., :3][apart], expected.indices[..., :3][apart])


def test_sampled_answers_follow_the_targets_distribution(llm, tmp_path):
    """The first answer token of 800 samples at temperature 1, against the sum of the target's
    next-token distributions after each sample's prompt (chi-square, alpha = 0.001)."""
    settings = GenerationSettings(samples=800, max_tokens=1, temperatures=(1.0,), batch=200, seed=3)
    samples = GeneratedSamples(tmp_path / "s", settings)
    samples.generate(llm)
    rows = samples.load()
    vocab = llm.target.config.vocab_size
    observed = torch.bincount(torch.cat([r["answer"][:1] for r in rows]).long(), minlength=vocab).double()
    reference = hf_model(llm)
    expected = torch.zeros(vocab, dtype=torch.float64)
    prompts_seen = {}
    for r in rows:
        key = tuple(r["prompt"].tolist())
        if key not in prompts_seen:
            with torch.no_grad():
                prompts_seen[key] = torch.softmax(reference(r["prompt"].long()[None]).logits[0, -1].double(), -1)
        expected += prompts_seen[key]
    keep = expected >= 5
    statistic = ((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum().item()
    statistic += (observed[~keep].sum() - expected[~keep].sum()).item() ** 2 / max(expected[~keep].sum().item(), 1e-9)
    assert keep.sum() >= 10  # the test has power: many tokens are likely
    assert statistic < chi2.ppf(0.999, int(keep.sum()))


def test_generation_resumes_at_the_first_missing_shard(llm, tmp_path):
    settings = GenerationSettings(samples=10, max_tokens=6, temperatures=(0.7,), batch=4)
    samples = GeneratedSamples(tmp_path / "r", settings)
    samples.generate(llm)
    first = [r["answer"].tolist() for r in samples.load()]
    shards = sorted((tmp_path / "r").glob("samples-*.pt"))
    assert len(shards) == 3
    kept = [shards[i].stat().st_mtime_ns for i in (0, 2)]
    shards[1].unlink()
    samples.generate(llm)
    assert [shards[i].stat().st_mtime_ns for i in (0, 2)] == kept  # not generated again
    assert [r["answer"].tolist() for r in samples.load()] == first
    # Each sample has its own seed: batched otherwise, the answers are the same.
    other = GeneratedSamples(tmp_path / "r5", GenerationSettings(samples=10, max_tokens=6, temperatures=(0.7,),
                                                                 batch=5))
    other.generate(llm)
    assert [r["answer"].tolist() for r in other.load()] == first
    # Asking for more later: the short last shard (samples 8-9 of 10) is filled out, not skipped (its
    # samples 10 and 11 were missing), and asking for fewer again loads as many as asked.
    more = GeneratedSamples(tmp_path / "r", GenerationSettings(samples=12, max_tokens=6, temperatures=(0.7,), batch=4))
    more.generate(llm)
    assert len(more.load()) == 12 and [r["answer"].tolist() for r in more.load()][:10] == first
    assert [r["answer"].tolist() for r in samples.load()] == first


def test_heldout_subjects_are_never_training_prompts():
    train = {text for _, text in prompts.prompts(2000)}
    heldout = {text for _, text in prompts.prompts(500, heldout=True)}
    assert train and heldout and not train & heldout
    assert {g for g, _ in prompts.prompts(2000)} == set(prompts.GENRES)
    for subject in prompts.subjects(heldout=True):
        assert not any(subject in text for text in train)


def test_a_prompt_asked_again_is_answered_at_another_temperature(llm, tmp_path):
    n = prompts.prompt_count()
    samples = GeneratedSamples(tmp_path / "t", GenerationSettings(samples=2 * n, temperatures=(0.0, 0.7, 1.0)))
    pairs = prompts.prompts(2 * n)
    for i in (0, 1, 5, n - 1):
        assert pairs[i] == pairs[i + n] and samples.temperature(i) != samples.temperature(i + n)


def test_chat_prompt_uses_the_template(llm):
    tokenizer = llm.tokenizer
    tokenizer.chat_template = "{% for m in messages %}w3 {{ m['content'] }}{% endfor %} w4"
    try:
        assert chat_prompt(tokenizer, "w5 w6") == [3, 5, 6, 4]
    finally:
        tokenizer.chat_template = None
