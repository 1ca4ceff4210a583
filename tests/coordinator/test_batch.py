"""Batches (coordinator/batch.py): several sequences through the hierarchy at once, each exactly as alone."""
import pytest
import torch

from triforce.config import EngineConfig
from triforce.sampling_params import SamplingParams
from triforce.coordinator.batch import SequenceBatch
from triforce.coordinator.hierarchy import build_engine
from triforce.kernels.linear import kernel_max_rows, pieced_max_rows
from triforce.models.loader import load_model

SETTINGS = dict(budget=32, chunk_size=4, sinks=2, window=16, refresh_every=12, full_layers=0, prefill_chunk=64)
# (mode, policy, tree size at the bottom tier): chains and trees at every tier pair
CASES = [("ar", "static", 0), ("draft", "static", 0), ("draft", "static", 6), ("retrieval", "static", 0),
         ("retrieval", "dynamic", 4), ("triforce", "static", 0), ("triforce", "dynamic", 0), ("triforce", "static", 6)]


@pytest.fixture(scope="module")
def models(tiny_dir):
    target = load_model(tiny_dir("engine-target", seed=11, num_layers=3, scale=25))
    draft = load_model(tiny_dir("engine-draft", seed=12, num_layers=1, scale=25))
    return target, draft


def prompts(lengths, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 96, (n,), generator=g).tolist() for n in lengths]


def engine_for(models, mode, policy, tree, prompt, params):
    target, draft = models
    tree_setting = {"tree1": tree} if mode in ("draft", "triforce") else {"tree2": tree}
    cfg = EngineConfig(mode=mode, retrieval_policy=policy, **SETTINGS, **tree_setting)
    return build_engine(cfg, target, draft, len(prompt) + params.max_tokens)


def alone(models, mode, policy, tree, prompt, params):
    return engine_for(models, mode, policy, tree, prompt, params).generate(prompt, params)[0]


def together(models, mode, policy, tree, batch_prompts, batch_params, join_after=None):
    """All requests in one SequenceBatch; with join_after=k the last joins after k steps (continuous)."""
    batch = SequenceBatch()
    runs = [engine_for(models, mode, policy, tree, p, sp).run(p, sp) for p, sp in zip(batch_prompts, batch_params)]
    late = runs.pop() if join_after is not None else None
    handles = [batch.add(r) for r in runs]
    if late is not None:
        for _ in range(join_after):
            batch.step()
        assert batch.active, "the others should still be running when the last joins"
        handles.append(batch.add(late))
    batch.run()
    return [h.result[0] for h in handles]


@pytest.mark.parametrize("mode,policy,tree", CASES)
def test_greedy_batch_equals_each_request_alone(models, mode, policy, tree, count_calls):
    batch_prompts = prompts([150, 97, 203])
    batch_params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in (40, 25, 33)]
    expected = [alone(models, mode, policy, tree, p, sp) for p, sp in zip(batch_prompts, batch_params)]
    alone_calls = len(count_calls)
    count_calls.clear()
    assert together(models, mode, policy, tree, batch_prompts, batch_params) == expected
    assert [len(t) for t in expected] == [40, 25, 33]
    assert max(count_calls) == 3  # some forwards carried all three sequences
    assert len(count_calls) < alone_calls  # and the batch took fewer model calls than the requests alone


@pytest.mark.parametrize("rounds2", [2, 3])
def test_with_rounds2_a_batch_makes_its_forwards_in_step(models, count_calls, rounds2):
    """In triforce mode by rounds (`rounds2` > 0) every sequence makes the same forwards between two target
    checks, so once a call carries the whole batch every call does until a sequence finishes: none waits
    at the target while a batchmate's draft and tier 2 run alone. (By tokens, `rounds2=0`, the sequences
    whose tier-2 checks accepted less run more of them, in calls of fewer sequences.)"""
    target, draft = models
    cfg = EngineConfig(mode="triforce", **SETTINGS, rounds2=rounds2)
    params = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    batch = SequenceBatch()
    handles = [batch.add(build_engine(cfg, target, draft, 100).run(p, params)) for p in prompts([60, 60, 60])]
    batch.run()
    calls = count_calls[count_calls.index(3):]  # from the first decode step (prompt chunks run apart)
    assert calls == sorted(calls, reverse=True), calls
    assert all(len(h.result[0]) == 30 for h in handles)


@pytest.mark.parametrize("mode,policy,tree", [("triforce", "static", 0), ("triforce", "dynamic", 6),
                                              ("retrieval", "static", 4)])
def test_a_seeded_sample_is_the_same_alone_and_in_any_batch(models, mode, policy, tree):
    batch_prompts = prompts([120, 88, 140], seed=2)
    batch_params = [SamplingParams(max_tokens=24, temperature=t, top_k=k, seed=s, ignore_eos=True)
                    for t, k, s in ((1.0, 0, 5), (0.7, 20, 6), (1.0, 0, 7))]
    expected = [alone(models, mode, policy, tree, p, sp) for p, sp in zip(batch_prompts, batch_params)]
    assert together(models, mode, policy, tree, batch_prompts, batch_params) == expected
    reordered = together(models, mode, policy, tree, batch_prompts[::-1], batch_params[::-1])
    assert reordered == expected[::-1]


def test_a_sequence_joins_a_running_batch(models):
    batch_prompts = prompts([150, 97, 203], seed=3)
    batch_params = [SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)] * 3
    expected = [alone(models, "triforce", "static", 0, p, sp) for p, sp in zip(batch_prompts, batch_params)]
    got = together(models, "triforce", "static", 0, batch_prompts, batch_params, join_after=25)
    assert got == expected


def test_each_sequence_stops_on_its_own(models):
    batch_prompts = prompts([130, 110], seed=4)
    greedy = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    first = alone(models, "triforce", "static", 0, batch_prompts[0], greedy)
    stop_id = first[12]  # the first request meets this token early; its stop is its own
    batch_params = [SamplingParams(max_tokens=40, temperature=0), SamplingParams(max_tokens=35, temperature=0)]
    batch = SequenceBatch()
    handles = [batch.add(engine_for(models, "triforce", "static", 0, p, sp).run(p, sp, (stop_id,)))
               for p, sp in zip(batch_prompts, batch_params)]
    batch.run()
    stopped, other = handles[0].result[0], handles[1].result[0]
    assert stopped == first[: first.index(stop_id) + 1] and len(stopped) <= 13
    want_other = engine_for(models, "triforce", "static", 0, batch_prompts[1], batch_params[1]).generate(
        batch_prompts[1], batch_params[1], (stop_id,))[0]
    assert other == want_other


def test_an_error_in_one_sequences_own_code_ends_it_alone(models):
    """A run that raises between the batch's forwards (its retrieval cache's rebuild out of memory, say)
    ends alone: the others finish as alone. It raised out of the step before, and a server failed every
    request in its batch with it, those that had just finished too."""
    def failing_after(run, forwards):
        asked = next(run)
        for _ in range(forwards):
            asked = run.send((yield asked))
        run.close()
        raise RuntimeError("out of memory in this sequence's rebuild")

    batch_prompts = prompts([120, 90], seed=5)
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    expected = alone(models, "triforce", "static", 0, batch_prompts[0], params)
    batch = SequenceBatch()
    kept = batch.add(engine_for(models, "triforce", "static", 0, batch_prompts[0], params).run(batch_prompts[0], params))
    failed = batch.add(failing_after(engine_for(models, "triforce", "static", 0, batch_prompts[1], params).run(
        batch_prompts[1], params), 6))
    batch.run()
    assert kept.result[0] == expected
    with pytest.raises(RuntimeError, match="out of memory"):
        failed.result


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("level,tree", [(2, 0), (1, 0), (1, 6)])  # tree: the draft's, which level 1 checks
def test_a_sequence_whose_target_logits_overflow_ends_alone_with_an_error(models, temperature, level, tree):
    """One sequence's target rows turn NaN (a model's logits overflowing on its prompt): it ends with
    NonFiniteLogits, not a token, and the other finishes as alone. Greedy took the NaN's index as the
    argmax (a silent wrong answer), and a sampled check raised out of the batch's step (every request in
    a server's batch failed). The retrieval tier's NaN rows (level 1) are only proposals to the target:
    that request finishes, greedy with plain decoding's tokens."""
    from triforce.coordinator.runs import Forward
    from triforce.errors import NonFiniteLogits

    def overflowing_after(run, forwards):
        asked, seen = next(run), 0
        while True:
            logits = yield asked
            if isinstance(asked, Forward) and asked.level == level:  # triforce: draft, retrieval, target
                seen += 1
                logits = torch.full_like(logits, float("nan")) if seen > forwards else logits
            try:
                asked = run.send(logits)
            except StopIteration as done:
                return done.value

    batch_prompts = prompts([120, 90], seed=5)
    params = SamplingParams(max_tokens=30, temperature=temperature, seed=3, ignore_eos=True)
    expected = alone(models, "triforce", "static", tree, batch_prompts[0], params)
    batch = SequenceBatch()
    kept = batch.add(engine_for(models, "triforce", "static", tree, batch_prompts[0], params).run(batch_prompts[0], params))
    failed = batch.add(overflowing_after(engine_for(models, "triforce", "static", tree, batch_prompts[1], params).run(
        batch_prompts[1], params), 3))
    batch.run()
    assert kept.result[0] == expected
    if level == 1:
        assert failed.result[0] == alone(models, "triforce", "static", tree, batch_prompts[1], params) \
            if temperature == 0 else len(failed.result[0]) == params.max_tokens
        return
    with pytest.raises(NonFiniteLogits):
        failed.result


@pytest.mark.skipif(kernel_max_rows() == 0, reason="no CPU kernels here: every forward takes torch's product")
def test_a_prompt_prefilling_beside_a_decoding_one_leaves_both_as_alone_in_bfloat16(tiny_dir):
    """A's decode steps ran in one call with B's prefill chunks, through torch's product (more rows than the
    kernels take), whose rounding depends on the row count: in bfloat16 A's logits moved when a long
    prompt arrived beside it (a server's greedy answer changed with its neighbours). Now a chunk runs in a
    call of its own: A's log-probabilities and B's, bit for bit, are what they are alone. (Where the CPU
    lacks native bfloat16, as AVX2 ones do, torch's path here is a float32 product rounded once, which gave
    every row the same bits at any row count: the test bites on AVX512-BF16 CPUs.)"""
    target = load_model(tiny_dir("engine-target", seed=11, num_layers=3, scale=25), "bfloat16")
    a, b = prompts([10, 400], seed=5)
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True, logprobs=2)
    chunk = pieced_max_rows() + 32  # past the kernels' rows: its first chunk is torch's product
    cfg = EngineConfig(mode="ar", **{**SETTINGS, "prefill_chunk": chunk})

    def run(prompts_here):
        engines = [build_engine(cfg, target, None, len(p) + params.max_tokens) for p in prompts_here]
        batch = SequenceBatch()
        handles = [batch.add(e.run(p, params)) for e, p in zip(engines, prompts_here)]
        steps = 0
        while batch.active:
            batch.step()
            steps += 1
        return [(h.result[0], [(x.logprob, x.top) for x in e.logprobs]) for h, e in zip(handles, engines)], steps

    (a_alone,), a_steps = run([a])
    (b_alone,), b_steps = run([b])
    both, steps = run([a, b])
    assert steps < a_steps + b_steps - 2  # A decoded while B prefilled
    assert both == [a_alone, b_alone]
