"""Log-probabilities (SamplingParams.logprobs) are the target's, at the right position, in every mode: equal
to a single forward of the target over the prompt and the output, before temperature, top-k and top-p."""
import pytest
import torch

from scripted_planner import follow_script
from triforce.cache.full import FullKVCache
from triforce.config import ConfigError, EngineConfig, SamplingParams
from triforce.coordinator.hierarchy import build_engine
from triforce.models.loader import load_model

SETTINGS = dict(budget=32, chunk_size=4, sinks=2, window=16, refresh_every=12, full_layers=1)
AUTO_SCRIPT = [(("draft", "target"), (4,)), (("draft", "retrieval", "target"), (2, 4)), (("target",), ()),
               (("retrieval", "target"), (3,))]
CONFIGS = {"ar": dict(mode="ar"), "draft": dict(mode="draft"), "retrieval": dict(mode="retrieval"),
           "retrieval-dynamic": dict(mode="retrieval", retrieval_policy="dynamic"),
           "triforce": dict(mode="triforce"), "triforce-tree": dict(mode="triforce", tree1=6),
           "retrieval-tree": dict(mode="retrieval", tree2=6), "auto": dict(mode="auto")}


@pytest.fixture(scope="module")
def models(tiny_dir):
    target = load_model(tiny_dir("engine-target", seed=11, num_layers=3, scale=25))
    draft = load_model(tiny_dir("engine-draft", seed=12, num_layers=1, scale=25))
    return target, draft


def generate(target, draft, config, prompt, params):
    cfg = EngineConfig(**{**SETTINGS, **config})
    engine = build_engine(cfg, target, draft, len(prompt) + params.max_tokens)
    if cfg.mode == "auto":
        follow_script(engine, cfg.budget, AUTO_SCRIPT)
    tokens, metrics = engine.generate(prompt, params)
    return tokens, engine.logprobs, metrics


def target_logprobs(target, prompt, tokens):
    """log softmax of one forward of the target over prompt + tokens, at the rows that chose `tokens`."""
    ids = prompt + tokens
    cache = FullKVCache(target.config, len(ids), target.rope, target.dtype, "cpu")
    logits = target.forward(torch.tensor(ids), cache)
    return torch.log_softmax(logits[len(prompt) - 1:-1].float(), dim=-1)


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("params", [SamplingParams(max_tokens=40, temperature=0, ignore_eos=True, logprobs=3),
                                    SamplingParams(max_tokens=40, temperature=0.8, top_p=0.9, seed=5,
                                                   ignore_eos=True, logprobs=3)], ids=["greedy", "sampled"])
def test_logprobs_are_the_targets_own_in_every_mode(models, name, params):
    target, draft = models
    prompt = torch.randint(3, 96, (150,), generator=torch.Generator().manual_seed(1)).tolist()
    tokens, logprobs, metrics = generate(target, draft, CONFIGS[name], prompt, params)
    if params.greedy:
        assert tokens == generate(target, draft, CONFIGS["ar"], prompt, params)[0]
    if name != "ar":
        assert metrics.tiers and all(t.checks > 0 for t in metrics.tiers)  # speculation really ran
    reference = target_logprobs(target, prompt, tokens)  # [n, V]
    assert [lp.token for lp in logprobs] == tokens
    got = torch.tensor([lp.logprob for lp in logprobs])
    torch.testing.assert_close(got, reference[torch.arange(len(tokens)), torch.tensor(tokens)], atol=1e-4, rtol=0)
    values, ids = reference.topk(3, dim=-1)
    assert [[t for t, _ in lp.top] for lp in logprobs] == ids.tolist()
    torch.testing.assert_close(torch.tensor([[v for _, v in lp.top] for lp in logprobs]), values, atol=1e-4, rtol=0)


def test_no_logprobs_unless_asked_and_zero_lists_none_beside(models):
    target, draft = models
    prompt = list(range(3, 60))
    _, logprobs, _ = generate(target, draft, CONFIGS["triforce"], prompt, SamplingParams(max_tokens=8, ignore_eos=True))
    assert logprobs == []
    tokens, logprobs, _ = generate(target, draft, CONFIGS["triforce"], prompt,
                                   SamplingParams(max_tokens=8, ignore_eos=True, logprobs=0))
    assert len(logprobs) == len(tokens) == 8 and all(lp.top == [] for lp in logprobs)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3"])
def test_bad_logprobs_are_refused(bad):
    with pytest.raises(ConfigError, match="logprobs"):
        SamplingParams(logprobs=bad)
