"""The Python API: vLLM-shaped LLM.generate, stop strings, streaming, token-id prompts."""
import pickle

import pytest
import torch

from triforce import LLM, SamplingParams
from triforce.config import ConfigError
from triforce.errors import UserError

PROMPT = " ".join(f"w{3 + (7 * i) % 90}" for i in range(50))


def continuation(llm, prompt: str, ids: list[int]) -> str:
    """What the prompt is followed by when its tokens and then `ids` are decoded (a generated text)."""
    head = llm.encode(prompt)
    return llm.tokenizer.decode(head + ids, skip_special_tokens=True)[len(llm.tokenizer.decode(head)):]


@pytest.fixture(scope="module")
def llm(tiny_dir):
    target = tiny_dir("api-target", tokenizer=True, seed=51)
    draft = tiny_dir("api-draft", tokenizer=True, seed=52, num_layers=1)
    return LLM(target, draft, mode="triforce", dtype="float32", window=64, budget=16, chunk_size=4)


def test_generate_returns_one_output_per_prompt_in_order(llm):
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    outs = llm.generate([PROMPT, PROMPT + " w5"], params)
    assert len(outs) == 2 and all(len(o.token_ids) == 6 for o in outs)
    assert outs[0].token_ids == llm.generate(PROMPT, params)[0].token_ids
    assert outs[0].finish_reason == "length"


def test_a_batch_takes_one_params_per_prompt_and_stops_each_on_its_own(llm):
    prompts = [PROMPT, PROMPT[: len(PROMPT) // 2], PROMPT + " w7 w9"]
    free = llm.generate(prompts[1], SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))[0]
    params = [SamplingParams(max_tokens=9, temperature=0, ignore_eos=True),
              SamplingParams(max_tokens=20, temperature=0, ignore_eos=True, stop=[free.text.split()[4]]),
              SamplingParams(max_tokens=12, temperature=0.9, seed=4, ignore_eos=True)]
    outs = llm.generate(prompts, params)
    assert [o.token_ids for o in outs] == [llm.generate(p, sp)[0].token_ids for p, sp in zip(prompts, params)]
    assert [len(outs[0].token_ids), len(outs[2].token_ids)] == [9, 12]
    assert outs[1].finish_reason == "stop" and len(outs[1].token_ids) < 20


def test_a_batch_of_requests_with_their_own_penalties_and_bans_gives_each_its_own_answer(llm):
    """Requests with different penalties, min_p, stop token ids and min_tokens in one batch (their checks
    verified together) each get what they get alone, and the settings change the answers."""
    free = llm.generate(PROMPT, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))[0]
    params = [SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, presence_penalty=1.0,
                             repetition_penalty=1.5),
              SamplingParams(max_tokens=16, temperature=0, ignore_eos=True),
              SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, frequency_penalty=2.0,
                             stop_token_ids=[free.token_ids[1]], min_tokens=10),
              SamplingParams(max_tokens=16, temperature=0.9, seed=3, min_p=0.3, ignore_eos=True, presence_penalty=0.5)]
    outs = llm.generate([PROMPT] * 4, params)
    assert [o.token_ids for o in outs] == [llm.generate(PROMPT, p)[0].token_ids for p in params]
    assert outs[1].token_ids == free.token_ids and outs[0].token_ids != free.token_ids != outs[2].token_ids
    assert free.token_ids[1] not in outs[2].token_ids[:10]


def test_a_batch_that_does_not_fit_runs_in_parts(llm, monkeypatch):
    import triforce.api as api
    from triforce import request_memory

    prompts = [PROMPT, PROMPT + " w5", PROMPT + " w6 w8"]
    params = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
    together = [o.token_ids for o in llm.generate(prompts, params)]
    one = llm.cache_bytes_for(len(llm.tokenizer(prompts[2]).input_ids), 5)
    monkeypatch.setattr(llm, "prefixes", None)  # its room would come out of the memory below
    monkeypatch.setattr(request_memory, "available_bytes", lambda device: int(2.5 * one / 0.9))  # room for two
    parts = []
    real = api.SequenceBatch.add
    monkeypatch.setattr(api.SequenceBatch, "add", lambda self, run: parts.append(id(self)) or real(self, run))
    assert [o.token_ids for o in llm.generate(prompts, params)] == together
    assert len(set(parts)) == 2 and parts.count(parts[0]) == 2
    monkeypatch.setattr(request_memory, "available_bytes", lambda device: int(0.5 * one))
    with pytest.raises(UserError, match=r"need \d+\.\d\d [KM]iB") as refused:  # (a tiny model's caches)
        llm.generate(prompts, params)
    assert "0.00" not in str(refused.value)  # it read "need 0.00 GiB; ... may take 0.00 GiB"


def test_bad_batches_are_refused(llm):
    with pytest.raises(UserError, match="2 sampling params for 3 prompts"):
        llm.generate([PROMPT] * 3, [SamplingParams()] * 2)
    with pytest.raises(UserError, match="one prompt"):
        llm.generate([PROMPT] * 2, SamplingParams(max_tokens=2), stream=print)
    assert llm.generate([], SamplingParams()) == [] and llm.generate([], []) == []
    for params, message in (([SamplingParams()] * 2, "2 sampling params for 0 prompts"), ("junk", "must be a"),
                            (5, "must be a")):  # no prompt: the params were not looked at
        with pytest.raises(UserError, match=message):
            llm.generate([], params)
    with pytest.raises(UserError, match="must be a"):  # a TypeError traceback
        llm.generate([PROMPT], 5)
    with pytest.raises(UserError, match="0 sampling params for 1 prompts"):  # ran with the defaults
        llm.generate([PROMPT], [])
    with pytest.raises(UserError, match="detokenize"):  # its callback never heard a thing
        llm.generate(PROMPT, SamplingParams(max_tokens=2, detokenize=False), stream=print)
    with pytest.raises(UserError, match="stream must be a function"):  # vLLM's use_tqdm, once the third argument:
        llm.generate(PROMPT, SamplingParams(max_tokens=2), True)  # a TypeError after the run
    for prompts, params, message in ((["w5"], {"max_tokens": 2}, "params must be a SamplingParams"),
                                     ([None], None, "a prompt must be"), (5, None, "prompts must be"),
                                     ([[5, 1.5]], None, "a prompt must be"),
                                     (b"w5 w6", None, "not bytes"), ([bytearray(b"w5")], None, "not bytes")):
        with pytest.raises(UserError, match=message):
            llm.generate(prompts, params)


def test_token_id_prompts(llm):
    ids = llm.tokenizer(PROMPT).input_ids
    params = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
    assert llm.generate([ids], params)[0].token_ids == llm.generate(PROMPT, params)[0].token_ids


def test_stop_string_cuts_text_and_ends_generation(llm):
    free = llm.generate(PROMPT, SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))[0]
    words = free.text.split()
    stop = words[3]  # inside the first round (a triforce round here yields 7 tokens)
    first = free.text.index(stop)
    out = llm.generate(PROMPT, SamplingParams(max_tokens=20, temperature=0, ignore_eos=True, stop=[stop],
                                              logprobs=1))[0]
    assert out.text == free.text[:first] and out.finish_reason == "stop" and out.stop_reason == stop
    assert free.stop_reason is None and free.finish_reason == "length"
    # The output keeps the tokens through the one that completed the stop string (its round went on: a
    # triforce round yields several), and one log-probability entry per token kept; the metrics count
    # those tokens (they counted the whole round's, so tokens/s and the server's generation tokens grew).
    end = first + len(stop)
    kept = len(out.token_ids)
    assert out.token_ids == free.token_ids[:kept] and kept == out.metrics.generated_tokens
    assert len(continuation(llm, PROMPT, out.token_ids)) >= end > len(continuation(llm, PROMPT, out.token_ids[:-1]))
    assert [e.token for e in out.logprobs] == out.token_ids


def test_the_round_that_reaches_a_stop_token_keeps_its_text(llm):
    """Generation that ends at an end token (here a stop token id, as end-of-sequence does) keeps the tokens
    of the round that reached it, up to and with the end token, and their text but the end token's (as
    vLLM), streamed too (the last round's tokens were dropped from the output, text and stream when an end
    token ended it)."""
    free = llm.generate(PROMPT, SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))[0]
    stop = free.token_ids[5]  # inside the first round (a triforce round here yields 7 tokens)
    kept = free.token_ids[:free.token_ids.index(stop) + 1]
    pieces = []
    out = llm.generate(PROMPT, SamplingParams(max_tokens=20, temperature=0, stop_token_ids=[stop]),
                       stream=pieces.append)[0]
    assert out.token_ids == kept and out.finish_reason == "stop" and out.stop_reason == stop
    assert out.text == "".join(pieces) == continuation(llm, PROMPT, kept[:-1]) != ""
    assert llm.tokenizer.decode([stop], skip_special_tokens=True)  # a token with text, left out


def test_streamed_pieces_join_to_the_text(llm):
    pieces = []
    out = llm.generate(PROMPT, SamplingParams(max_tokens=15, temperature=0.8, seed=2, ignore_eos=True),
                       stream=pieces.append)[0]
    assert "".join(pieces) == out.text and len(pieces) > 1


def test_unknown_engine_setting_is_refused(tiny_dir):
    with pytest.raises(ConfigError, match="gamma3"):
        LLM(tiny_dir("api-target", tokenizer=True, seed=51), gamma3=2)


def test_settings_of_the_wrong_type_are_refused_at_once(tiny_dir):
    """A setting of the wrong type is refused as the LLM is built, naming it; fractional gammas, budgets and
    sinks built the LLM and failed deep in its first generate (torch's zeros() of a float size), and workers=2
    with an AttributeError there."""
    target = tiny_dir("api-target", tokenizer=True, seed=51)
    for settings, message in ((dict(gamma1=2.5), "gamma1 must be an integer"),
                              (dict(mode="retrieval", gamma2=1.5), "gamma2 must be an integer"),
                              (dict(sinks=2.5), "sinks must be an integer"), (dict(budget="64"), "budget must be"),
                              (dict(stop_below="0.5"), "stop_below must be a number"),
                              (dict(workers=2), "workers must be a channel"),
                              (dict(prefix_cache_gb="1"), "prefix_cache_gb must be a number")):
        with pytest.raises(ConfigError, match=message):
            LLM(target, **settings)
    # a draft's window past its positions: the LLM was built, and every request failed
    with pytest.raises(ConfigError, match="past its 512 positions"):
        LLM(target, tiny_dir("api-draft", tokenizer=True, seed=52, num_layers=1), mode="triforce", window=600)


def test_int8_proposers_are_made_once_when_a_config_asks_for_them(llm, int8_kernels):
    """A tier's int8 twin (models/quantized.py) is made at the first request whose config asks for it (the
    bench sweeps retrieval_weights and draft_weights on one LLM), kept for later ones, and the output is the
    target's."""
    import dataclasses

    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    base = llm.config
    want = llm.generate(PROMPT, params)[0].token_ids
    assert llm.retrieval_model is llm.target and llm.draft_model is llm.draft
    try:
        llm.config = dataclasses.replace(base, retrieval_weights="int8", draft_weights="int8")
        twins = llm.retrieval_model, llm.draft_model
        assert [t.quantized for t in twins] == ["int8", "int8"] and twins[1].vocab is llm.draft.vocab
        assert llm.generate(PROMPT, params)[0].token_ids == want
        assert (llm.retrieval_model, llm.draft_model) == twins
        for mode, weights in (("draft", (llm.target, twins[1])), ("retrieval", (twins[0], llm.draft)),
                              ("ar", (llm.target, llm.draft))):  # (a mode without the tier: the plain model)
            llm.config = dataclasses.replace(llm.config, mode=mode)
            assert llm.retrieval_model is weights[0] and llm.draft_model is weights[1]
    finally:
        llm.config = base


def test_an_int8_proposer_the_config_asks_for_is_made_as_the_llm_loads(tiny_dir, int8_kernels):
    """So that the memory checks of the first request (and a server's capacity) count it."""
    target = tiny_dir("api-target", tokenizer=True, seed=51)
    draft = tiny_dir("api-draft", tokenizer=True, seed=52, num_layers=1)
    llm = LLM(target, draft, mode="triforce", dtype="float32", window=64, budget=16, chunk_size=4,
              retrieval_weights="int8", draft_weights="draft")
    assert list(llm._int8_twins) == ["retrieval"] and llm.retrieval_model is llm._int8_twins["retrieval"]
    assert llm.draft_model is llm.draft


def test_a_worker_group_that_runs_another_dtype_is_said(tiny_dir, caplog):
    """--dtype auto decides per device: CPU coordinator and GPU workers (or a T4's float16) run tiers 2 and 3
    in different precisions, exact still (the group's target decides), but unsaid."""
    import logging
    from types import SimpleNamespace

    channel = SimpleNamespace(handshake=None, dtype="bfloat16", prefix_bytes=0, tp_size=1, prefill_chunk=512)
    with caplog.at_level(logging.WARNING, logger="triforce"):
        LLM(tiny_dir("api-target", tokenizer=True, seed=51), mode="ar", dtype="float32", workers=channel)
    assert "runs the target in bfloat16 and this process (the draft and the retrieval tier) in float32" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="triforce"):
        LLM(tiny_dir("api-target", tokenizer=True, seed=51), mode="ar", dtype="bfloat16", workers=channel)
    assert "worker group" not in caplog.text


def test_settings_of_a_tier_the_mode_does_not_run_are_refused(tiny_dir, monkeypatch):
    """The CLI refused them, the Python API ignored them without a word: a draft in modes ar and retrieval, a
    tree or rounds2 in a mode whose tiers they do not shape, a tree shape without a tree, stop_below or lookup
    in mode ar, a draft or retrieval tier's setting in a mode without that tier, tree1=True (a bool taken as a tree of one node) and tree1="²" (a superscript passed
    str.isdigit, then int() raised a ValueError). Refused before anything loads."""
    import triforce.api as api

    target = tiny_dir("api-target", tokenizer=True, seed=51)
    monkeypatch.setattr(api, "resolve_model", lambda *a: pytest.fail("the model was looked up first"))
    for settings, message in ((dict(mode="ar", draft="x"), "draft x runs a tier that mode ar does not run"),
                              (dict(mode="retrieval", draft="x"), "mode retrieval does not run"),
                              (dict(mode="ar", tree1=4), "tree1 shapes a tier that mode ar"),
                              (dict(mode="draft", tree2=4), "tree2 shapes a tier that mode draft"),
                              (dict(mode="draft", rounds2=2), "mode draft does not take it"),
                              (dict(mode="triforce", tree_shape="confidence"), "chains unless tree1 is set"),
                              (dict(mode="auto", tree_shape="confidence"), "mode auto proposes no trees"),
                              (dict(mode="ar", stop_below=0.3), "stop_below shapes a proposer's chains"),
                              (dict(mode="ar", lookup=2), "lookup shapes a proposer's chains, and mode ar"),
                              (dict(mode="ar", budget=512), "budget sets the retrieval tier, which mode ar does"),
                              (dict(mode="draft", full_layers=0), "full_layers sets the retrieval tier, which mode "
                                                                  "draft"),  # (ignored: all of them)
                              (dict(mode="retrieval", gamma1=2), "gamma1 sets the draft tier, which mode retrieval"),
                              (dict(mode="retrieval", window=64), "window sets the draft tier"),
                              (dict(mode="draft", retrieval_weights="int8"), "retrieval_weights sets the retrieval "
                                                                             "tier, which mode draft"),
                              (dict(retrieval_weights="int4"), "retrieval_weights must be one of"),
                              (dict(mode="retrieval", draft_weights="int8"), "draft_weights sets the draft tier"),
                              (dict(mode="draft", tree1=True), "tree1 must be 'auto' or a node count"),
                              (dict(mode="draft", tree1="²"), "tree1 must be 'auto' or a node count")):
        with pytest.raises(ConfigError, match=message):
            LLM(target, **settings)


def test_a_gpus_requests_rows_of_the_vocabulary_count_in_the_hosts_memory(tiny_dir):
    """On a GPU a request's rows of the vocabulary live in the host's memory (tiers.py), where nothing counted
    them: a batch whose rows the host cannot hold runs in parts, and a request whose rows alone do not fit
    is refused. On a CPU they count with the caches (cache_bytes_for), and the host is not asked apart."""
    from triforce.coordinator.hierarchy import row_bytes
    from triforce.errors import TooLarge
    from triforce.request_memory import HOST_SHARE

    llm = LLM(tiny_dir("api-target", tokenizer=True, seed=51), mode="ar", dtype="float32", prefix_cache_gb=0)
    assert llm.host_bytes_for(50, 4) == 0 and llm.host_free() is None
    llm.device = "cuda"  # its caches on a GPU (nothing here touches one)
    rows = llm.host_bytes_for(50, 4)
    assert rows == row_bytes(llm.config, llm.target.config, None) > 0
    assert llm.host_bytes_for(50, 4, True) > rows  # a scored prompt's rows too
    llm.free_memory = lambda: 2**40
    llm.host_free = lambda: int(2.5 * rows / HOST_SHARE)
    assert llm._parts_that_fit([(50, 4)] * 5) == [[0, 1], [2, 3], [4]]
    llm.host_free = lambda: int(0.5 * rows / HOST_SHARE)
    with pytest.raises(TooLarge, match="of the host's memory"):
        llm._parts_that_fit([(50, 4)])


def test_vllms_spellings_are_taken(llm):
    """vLLM's SamplingParams writes its defaults of stop, stop_token_ids, bad_words, logit_bias, min_tokens and
    top_k as None, and generate's second parameter sampling_params: code written for vLLM runs as it is."""
    nones = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True, stop=None, stop_token_ids=None,
                           bad_words=None, logit_bias=None, min_tokens=None, top_k=None)
    assert nones == SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    out = llm.generate(PROMPT, sampling_params=nones)[0]
    assert len(out.token_ids) == 4 and out.token_ids == llm.generate(PROMPT, nones)[0].token_ids


def test_outputs_have_vllms_shape(llm):
    """vLLM's RequestOutput: request_id (counting up), prompt (the string given; None for token ids),
    prompt_token_ids, outputs (CompletionOutput: index, text, token_ids, finish_reason, cumulative_logprob);
    the flat fields read the first output."""
    params = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True, logprobs=0)
    by_text, by_ids = llm.generate([PROMPT, llm.encode(PROMPT)], params)
    assert int(by_ids.request_id) == int(by_text.request_id) + 1
    assert (by_text.prompt, by_ids.prompt) == (PROMPT, None)
    assert by_text.prompt_token_ids == by_ids.prompt_token_ids == llm.encode(PROMPT)
    first = by_text.outputs[0]
    assert len(by_text.outputs) == 1 and first.index == 0 and by_text.finished
    assert (first.text, first.token_ids, first.finish_reason) == (by_text.text, by_text.token_ids, "length")
    assert first.token_ids == by_ids.outputs[0].token_ids and len(first.token_ids) == 5
    assert first.cumulative_logprob == pytest.approx(sum(e.logprob for e in first.logprobs)) and first.cumulative_logprob < 0
    assert llm.generate(PROMPT, SamplingParams(max_tokens=2))[0].outputs[0].cumulative_logprob is None


def test_n_outputs_per_prompt_are_each_what_its_seed_gives_alone(llm):
    """SamplingParams.n (vLLM's): n outputs of each prompt, output i what n = 1 with seed + i gives (output
    0: the request's own seed), run in one batch with the other prompts."""
    params = SamplingParams(max_tokens=8, temperature=1.0, seed=11, ignore_eos=True, n=3)
    outs = llm.generate([PROMPT, PROMPT + " w5"], params)
    assert [len(o.outputs) for o in outs] == [3, 3]
    for prompt, out in zip([PROMPT, PROMPT + " w5"], outs):
        assert [c.index for c in out.outputs] == [0, 1, 2]
        alone = [llm.generate(prompt, SamplingParams(max_tokens=8, temperature=1.0, seed=11 + i, ignore_eos=True))[0]
                 for i in range(3)]
        assert [c.token_ids for c in out.outputs] == [a.token_ids for a in alone]
        assert len({tuple(c.token_ids) for c in out.outputs}) > 1  # the seeds differ, so do the samples
    greedy = llm.generate(PROMPT, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, n=2))[0]
    assert greedy.outputs[0].token_ids == greedy.outputs[1].token_ids == greedy.token_ids
    unseeded = llm.generate(PROMPT, SamplingParams(max_tokens=6, temperature=1.0, ignore_eos=True, n=2))[0]
    assert [len(c.token_ids) for c in unseeded.outputs] == [6, 6]


def test_bad_n_is_refused(llm):
    import numpy as np

    for n in (0, -1, 1.5, True, "2", 10**9):  # 10**9 built a billion requests' settings, silently
        with pytest.raises(ConfigError, match="n must be an integer from 1 to 4096"):
            SamplingParams(n=n)
    with pytest.raises(ConfigError, match="^n must"):  # named, not an impossible seed range
        SamplingParams(n=2**65, seed=0)
    numpy_n = SamplingParams(n=np.int64(2), seed=5)  # was an OverflowError
    assert numpy_n.n == 2 and type(numpy_n.n) is int and [c.seed for c in numpy_n.choices()] == [5, 6]
    assert len(llm.generate(PROMPT, SamplingParams(max_tokens=2, n=2, best_of=2))[0].outputs) == 2
    with pytest.raises(ConfigError, match="best_of must be None or n"):
        SamplingParams(n=2, best_of=3)
    with pytest.raises(ConfigError, match="output i takes seed"):
        SamplingParams(n=3, seed=2**64 - 2)
    assert SamplingParams(n=3, seed=2**64 - 3).choices()[-1].seed == 2**64 - 1
    for huge in (10**5000, -10**5000):  # its message raised ValueError (Python prints 4,300 digits at most)
        with pytest.raises(ConfigError, match=r"^seed must .* about 5,000 digits"):
            SamplingParams(seed=huge)
    with pytest.raises(ConfigError, match=r"got \['x+\.\.\.\)$"):  # a long value cut in the message
        SamplingParams(stop=["x" * 10_000, 5])
    with pytest.raises(ConfigError, match="a list holding an integer too long to print"):
        SamplingParams(stop=[10**5000])
    with pytest.raises(UserError, match="n = 1"):
        llm.generate(PROMPT, SamplingParams(max_tokens=2, n=2), stream=print)


def test_vllms_other_spellings_of_prompts_and_outputs(llm, tiny_dir):
    """What code written for vLLM passes and reads: TextPrompt and TokensPrompt dicts, use_tqdm,
    detokenize=False (token ids alone: lm-evaluation-harness's scoring), CompletionOutput built by keyword
    in vLLM's order, finished(), cumulative_logprob as a field, num_cached_tokens."""
    import dataclasses

    from triforce import CompletionOutput

    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True, logprobs=1)
    plain = llm.generate(PROMPT, params)[0]
    by_text, by_ids = llm.generate([{"prompt": PROMPT}, {"prompt_token_ids": llm.encode(PROMPT)}], params,
                                   use_tqdm=False)
    assert by_text.token_ids == by_ids.token_ids == plain.token_ids and (by_text.prompt, by_ids.prompt) == (PROMPT, None)
    with pytest.raises(UserError, match="a prompt dict takes one of"):
        llm.generate({"prompt": PROMPT, "multi_modal_data": {}}, params)
    # lm-evaluation-harness's calls: older vLLM's prompt_token_ids=, and lora_request (None) always
    ids = llm.encode(PROMPT)
    for given in (ids, [ids]):
        old_style, = llm.generate(prompt_token_ids=given, sampling_params=params, use_tqdm=False, lora_request=None)
        assert old_style.token_ids == plain.token_ids
    assert llm.chat([{"role": "user", "content": "w5"}], params, lora_request=None,
                    chat_template="{{ messages[0]['content'] }}")[0].token_ids
    assert llm.generate([PROMPT, PROMPT], params, priority=[0, 0])[1].token_ids == plain.token_ids
    for wrong, message in (({"lora_request": object()}, "LoRA adapters"), ({"priority": [1]}, "one priority"),
                           ({"priority": [0, 0]}, "one per prompt"), ({"priority": 0}, "one priority"),
                           ({"prompt_token_ids": ids}, "not both")):
        with pytest.raises(UserError, match=message):
            llm.generate(PROMPT, params, **wrong)
    bare = llm.generate(PROMPT, dataclasses.replace(params, detokenize=False))[0]
    assert bare.token_ids == plain.token_ids and bare.text == "" and plain.text
    with pytest.raises(ConfigError, match="stop strings need detokenize"):
        SamplingParams(detokenize=False, stop=["w5"])
    out = plain.outputs[0]
    assert dataclasses.asdict(out)["cumulative_logprob"] == out.cumulative_logprob and out.finished()
    made = CompletionOutput(index=0, text="a", token_ids=[1], cumulative_logprob=None, logprobs=None)
    assert made.finish_reason is None and not made.finished()
    long_prompt = " ".join([PROMPT] * 14)  # more than one 512-token block of the prefix store
    roomy = LLM(tiny_dir("api-target-1k", tokenizer=True, seed=51, max_position_embeddings=1024), mode="ar",
                dtype="float32")
    first, again = (roomy.generate(long_prompt, SamplingParams(max_tokens=2))[0] for _ in range(2))
    assert first.num_cached_tokens == 0 and again.num_cached_tokens == again.metrics.cached_prompt_tokens == 512


def test_vllms_engine_arguments_are_taken(tiny_dir):
    """LLM(...) as a vLLM script builds it: seed (unseeded samples repeat from LLM to LLM with the same
    seed), max_model_len, gpu_memory_utilization, enable_prefix_caching, parallel sizes of 1, and the
    arguments that change nothing here; what would mean another machine is refused by name."""
    target = tiny_dir("api-target", tokenizer=True, seed=51)
    vllm_style = dict(tensor_parallel_size=1, pipeline_parallel_size=1, enforce_eager=True, trust_remote_code=False,
                      disable_log_stats=True, gpu_memory_utilization=0.5, max_model_len=300, enable_prefix_caching=False)
    llm = LLM(target, mode="ar", dtype="float32", seed=7, **vllm_style)
    sampled = SamplingParams(max_tokens=12, temperature=1.0, ignore_eos=True)
    first = [o.token_ids for o in llm.generate([PROMPT] * 3, sampled)]
    again = [o.token_ids for o in LLM(target, mode="ar", dtype="float32", seed=7).generate([PROMPT] * 3, sampled)]
    other = [o.token_ids for o in LLM(target, mode="ar", dtype="float32", seed=8).generate([PROMPT] * 3, sampled)]
    assert first == again and first != other and len({tuple(t) for t in first}) == 3
    assert llm.prefixes is None and llm.target.config.max_positions == 300
    from triforce.models.rope import POSITION_MARGIN  # its RoPE table holds the positions it may use (all 512,
    whole = LLM(target, mode="ar", dtype="float32").target.rope  # and 2.1M for yarn x64 over 32K, before)
    assert len(llm.target.rope.cos) == 300 + POSITION_MARGIN < len(whole.cos)
    assert torch.equal(llm.target.rope.cos, whole.cos[:300 + POSITION_MARGIN])
    prompt_len = len(llm.encode(PROMPT))
    for max_tokens in (260, None):  # as vLLM's engine: generation stops where the positions do
        out = llm.generate(PROMPT, SamplingParams(max_tokens=max_tokens, ignore_eos=True))[0]
        assert len(out.token_ids) == 300 - prompt_len and out.finish_reason == "length"
    with pytest.raises(UserError, match="the prompt \\(350 tokens\\) fills the model's 300 positions \\(max_model_len\\)"):
        llm.generate([[5] * 350], SamplingParams(max_tokens=1))
    assert llm.generate([[5] * 300], SamplingParams(max_tokens=0, prompt_logprobs=0))[0].token_ids == []  # scored
    assert llm.get_tokenizer() is llm.tokenizer
    one = llm.cache_bytes_for(50, 4)
    llm.free_memory = lambda: int(3 * one)  # room for one request's caches at half of it, for two at 0.9
    assert llm._parts_that_fit([(50, 4)] * 2) == [[0], [1]]
    with pytest.raises(UserError, match="gpu_memory_utilization 0.5 of the"):  # what it may take, and why
        llm._parts_that_fit([(50, 200)])
    llm.memory_share = 0.9
    assert llm._parts_that_fit([(50, 4)] * 2) == [[0, 1]]
    assert llm.cache_bytes_for(50, 4, True) > 1.35 * one  # a scored prompt's rows: in parts again
    assert llm._parts_that_fit([(50, 4, True), (50, 4, False)]) == [[0], [1]]
    assert LLM(target, mode="ar", dtype="float32", enable_prefix_caching=0).prefixes is None  # 0 is false too
    for bad, message in (({"tensor_parallel_size": 2}, "worker group, launched by torchrun"),
                         ({"tensor_parallel_size": "1"}, "must be an integer >= 1"),
                         ({"enforce_eager": "no"}, "enforce_eager must be true, false or None"),
                         ({"max_model_len": 600}, "more than the model's 512 positions"),
                         ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization must be in"),
                         ({"seed": "7"}, "seed must be an integer"), ({"swap_space": 4}, "unknown engine settings: swap_space"),
                         ({"enable_prefix_caching": False, "prefix_cache_gb": 2}, "give one of the two")):  # ignored
        with pytest.raises(ConfigError, match=message):
            LLM(target, mode="ar", dtype="float32", **bad)


def test_one_token_prompt(llm):
    out = llm.generate([[5]], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))[0]
    assert len(out.token_ids) == 4


def test_bad_words_and_allowed_token_ids_change_what_generate_says(llm):
    """bad_words (words of the tokenizer, here one token each and a pair) never appear, allowed_token_ids
    are all that appears; each answer equals the one given the same bans as token ids."""
    free = llm.generate(PROMPT, SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))[0]
    words = free.text.split()
    bad = [max(set(words), key=words.count), f"{words[5]} {words[6]}"]
    out = llm.generate(PROMPT, SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, bad_words=bad))[0]
    ids = tuple(tuple(llm.tokenizer.encode(w, add_special_tokens=False)) for w in bad)
    by_ids = llm.generate(PROMPT, SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, bad_words_ids=ids))[0]
    assert out.token_ids == by_ids.token_ids != free.token_ids
    assert bad[0] not in out.text.split() and bad[1] not in out.text
    allowed = sorted(set(free.token_ids))[:3]
    out = llm.generate(PROMPT, SamplingParams(max_tokens=24, temperature=0.9, seed=1, ignore_eos=True,
                                              allowed_token_ids=allowed))[0]
    assert set(out.token_ids) <= set(allowed)
    for bad_params in (dict(allowed_token_ids=[5, 96]), dict(bad_words_ids=[[4, 100]])):
        with pytest.raises(UserError, match=f"{next(iter(bad_params))} names token"):
            llm.generate(PROMPT, SamplingParams(**bad_params))


def test_include_stop_str_in_output_keeps_the_stop_string_and_the_stop_tokens_text(llm):
    free = llm.generate(PROMPT, SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))[0]
    stop = " ".join(free.text.split()[3:5])
    cut, kept = (llm.generate(PROMPT, SamplingParams(max_tokens=20, temperature=0, ignore_eos=True, stop=[stop],
                                                     include_stop_str_in_output=flag))[0] for flag in (False, True))
    assert kept.text == cut.text + stop and kept.token_ids == cut.token_ids and kept.stop_reason == stop
    token = free.token_ids[6]
    cut, kept = (llm.generate(PROMPT, SamplingParams(max_tokens=20, temperature=0, ignore_eos=True,
                                                     stop_token_ids=[token], include_stop_str_in_output=flag))[0]
                 for flag in (False, True))
    assert kept.token_ids == cut.token_ids and kept.token_ids[-1] == token
    assert kept.text == continuation(llm, PROMPT, kept.token_ids) != cut.text == continuation(llm, PROMPT, cut.token_ids[:-1])


def test_chat_lays_each_conversation_out_by_the_template_and_generates(llm, monkeypatch):
    """vLLM's LLM.chat: OpenAI's messages (text or text parts; OpenAI's developer role as system) through the
    tokenizer's chat template, one conversation or a list; a model without a template and messages of another
    shape are one clear error."""
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    with pytest.raises(UserError, match="no chat template"):
        llm.chat([{"role": "user", "content": "w5"}], params)
    monkeypatch.setattr(llm.tokenizer, "chat_template", "{% for m in messages %}{% if m['role'] not in ('system', "
                        "'user') %}{{ raise_exception('no word for ' + m['role']) }}{% endif %}{{ {'system': 'w7', "
                        "'user': 'w8'}[m['role']] }} {{ m['content'] }} {% endfor %}{% if add_generation_prompt %}w9"
                        "{% endif %}")
    first = [{"role": "developer", "content": "w5"}, {"role": "user", "content": [{"type": "text", "text": "w6"}]}]
    second = [{"role": "user", "content": "w10 w11"}]
    outs = llm.chat([first, second], params)
    assert [o.prompt_token_ids for o in outs] == [llm.encode("w7 w5 w8 w6 w9"), llm.encode("w8 w10 w11 w9")]
    assert [o.prompt for o in outs] == ["w7 w5 w8 w6 w9", "w8 w10 w11 w9"]  # as vLLM's: the laid-out text
    assert [o.token_ids for o in outs] == [llm.generate(o.prompt_token_ids, params)[0].token_ids for o in outs]
    assert llm.chat(first, params)[0].token_ids == outs[0].token_ids  # one conversation alone
    for bad in ([], [{"content": "w5"}], [{"role": "user", "content": [{"type": "image_url"}]}], "w5"):
        with pytest.raises(UserError, match="messages' must be"):
            llm.chat(bad, params)
    with pytest.raises(UserError, match="'chat_template_kwargs' must be an object of the template's variables, not a"
                                        " int"):
        llm.chat(first, params, chat_template_kwargs=5)  # a TypeError as it built the message
    with pytest.raises(UserError, match="the chat template refused these messages: no word for tool"):
        llm.chat([{"role": "tool", "content": "w5"}], params)  # a role the template has no word for
    # documents (apply_chat_template's, for RAG templates) pass as vLLM passes them; it was refused as reserved
    monkeypatch.setattr(llm.tokenizer, "chat_template", "{% for d in documents %}{{ d['text'] }} {% endfor %}"
                        "{% for m in messages %}{{ m['content'] }} {% endfor %}")
    out = llm.chat(second, params, chat_template_kwargs={"documents": [{"title": "a", "text": "w3 w4"}]})[0]
    assert out.prompt == "w3 w4 w10 w11"  # (the prompt text as decoded: no trailing space)


def test_the_end_of_sequence_among_stop_token_ids_names_no_stop_reason(llm):
    """As vLLM: the model's end of sequence ends a request without a stop_reason, also where stop_token_ids
    names it (it was named there); with ignore_eos it is a stop token like any, and named."""
    eos = llm.main_eos_id()
    forced = dict(max_tokens=4, temperature=0, logit_bias={eos: 100.0}, stop_token_ids=[eos])
    out = llm.generate(PROMPT, SamplingParams(**forced))[0]
    assert out.token_ids == [eos] and out.finish_reason == "stop" and out.stop_reason is None
    out = llm.generate(PROMPT, SamplingParams(**forced, ignore_eos=True))[0]
    assert out.token_ids == [eos] and out.finish_reason == "stop" and out.stop_reason == eos


def test_an_end_id_that_only_generation_config_names_ends_generation(tiny_dir, tmp_path, caplog):
    """Qwen2.5's instruct models name <|im_end|> in config.json and add <|endoftext|> in
    generation_config.json, where transformers and vLLM read it; generation ran on past the second."""
    import json
    import shutil

    source = tiny_dir("api-target", tokenizer=True, seed=51)
    free = LLM(source, mode="ar", dtype="float32").generate(
        PROMPT, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))[0]
    end = free.token_ids[4]
    shutil.copytree(source, tmp_path / "model")
    (tmp_path / "model" / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, end]}))
    llm = LLM(tmp_path / "model", mode="ar", dtype="float32")
    assert llm.eos_ids() == tuple(sorted({2, end}))
    out = llm.generate(PROMPT, SamplingParams(max_tokens=12, temperature=0))[0]
    assert out.token_ids == free.token_ids[:free.token_ids.index(end) + 1] and out.finish_reason == "stop"
    assert out.stop_reason == end  # not the tokenizer's own end: named, as vLLM names generation_config's
    (tmp_path / "model" / "generation_config.json").write_text(json.dumps({"eos_token_id": ["2"]}))
    with pytest.raises(UserError, match="generation_config.json: eos_token_id must be a token id or a list"):
        LLM(tmp_path / "model", mode="ar")
    (tmp_path / "model" / "generation_config.json").write_text(json.dumps({"eos_token_id": [96, 5]}))
    with caplog.at_level("WARNING"):  # no logit row gives 96: left out, as transformers and vLLM load it
        assert LLM(tmp_path / "model", mode="ar").eos_ids() == (2, 5)
    assert "end-of-sequence ids [96] lie outside the vocabulary of 96" in caplog.text


def test_chat_takes_a_template_of_its_own(llm, monkeypatch):
    """vLLM's LLM.chat(chat_template=...): a model without a template chats with the one given, and one
    given goes before the tokenizer's."""
    params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    template = "{% for m in messages %}w7 {{ m['content'] }} {% endfor %}{% if add_generation_prompt %}w9{% endif %}"
    conversation = [{"role": "user", "content": "w5"}]
    out = llm.chat(conversation, params, chat_template=template)[0]
    assert out.prompt_token_ids == llm.encode("w7 w5 w9")
    assert out.token_ids == llm.generate(out.prompt_token_ids, params)[0].token_ids
    monkeypatch.setattr(llm.tokenizer, "chat_template", "{% for m in messages %}w8 {{ m['content'] }}{% endfor %}",
                        raising=False)
    assert llm.chat(conversation, params, chat_template=template)[0].prompt_token_ids == llm.encode("w7 w5 w9")
    assert llm.chat(conversation, params)[0].prompt_token_ids == llm.encode("w8 w5")
    for bad, got in ((123, "int"), (" ", "' '")):
        with pytest.raises(UserError, match=f"chat_template must be a Jinja template's text \\(got {got}\\)"):
            llm.chat(conversation, params, chat_template=bad)


def test_logprob_entries_give_each_tokens_text_as_vllms_decoded_token(llm):
    """vLLM's Logprob.decoded_token: each listed token's text where it stands (after the prompt and the
    tokens before it), a special token's name whatever skip_special_tokens says (as vLLM's), so the chosen
    tokens' texts join to the output's text but for special tokens; the prompt's entries too; None where
    the request asked for no text (detokenize false)."""
    special = set(llm.tokenizer.all_special_ids)
    ids = llm.encode(PROMPT)
    ids = ids[:10] + [llm.tokenizer.eos_token_id] + ids[10:]  # a special token inside the prompt

    def text_of(token):  # a word, after the space that parts it
        return " " + llm.tokenizer.convert_ids_to_tokens(token)

    params = SamplingParams(max_tokens=8, temperature=0.9, seed=3, ignore_eos=True, logprobs=2, prompt_logprobs=1)
    out = llm.generate(ids, params)[0]
    completion = out.outputs[0]
    assert "".join(entry[t].decoded_token for t, entry in zip(completion.token_ids, completion.logprobs)
                   if t not in special) == completion.text
    assert all(entry[t].decoded_token == text_of(t) for entry in completion.logprobs for t in entry)
    assert out.prompt_logprobs[0] is None
    assert all(entry[t].decoded_token == text_of(t) for entry in out.prompt_logprobs[1:] for t in entry)
    assert out.prompt_logprobs[10][llm.tokenizer.eos_token_id].decoded_token == " " + llm.tokenizer.eos_token
    pickled = pickle.dumps(out)  # (multiprocessing, Ray): with the texts, without the tokenizer that decodes them
    assert b"TokenTexts" not in pickled and pickle.loads(pickled).outputs[0].logprobs[0] == completion.logprobs[0]
    assert [dict(e) for e in pickle.loads(pickled).outputs[0].logprobs] == [dict(e) for e in completion.logprobs]
    bare = llm.generate(ids, SamplingParams(max_tokens=8, temperature=0.9, seed=3, ignore_eos=True, logprobs=2,
                                            detokenize=False))[0].outputs[0]
    assert bare.token_ids == completion.token_ids and bare.text == ""
    assert all(entry[t].decoded_token is None for entry in bare.logprobs for t in entry)


def test_a_tokenizer_from_elsewhere_as_vllms_tokenizer_argument(tiny_dir):
    """vLLM's tokenizer= (here a folder; a Hugging Face id: tests/models/test_hub.py) for a model folder
    without one; skip_tokenizer_init=True loads none (token ids in, no text out); one with more tokens than
    the model's vocabulary is another model's, and refused."""
    bare, tokenized = tiny_dir("api-bare", seed=51), tiny_dir("api-target", tokenizer=True, seed=51)
    params = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
    assert LLM(bare, mode="ar", dtype="float32").tokenizer is None
    llm = LLM(bare, mode="ar", dtype="float32", tokenizer=str(tokenized))
    want = LLM(tokenized, mode="ar", dtype="float32").generate(PROMPT, params)[0]
    got = llm.generate(PROMPT, params)[0]
    assert (got.prompt_token_ids, got.token_ids, got.text) == (want.prompt_token_ids, want.token_ids, want.text)
    skipped = LLM(tokenized, mode="ar", dtype="float32", skip_tokenizer_init=True)
    assert skipped.tokenizer is None
    assert skipped.generate([want.prompt_token_ids], params)[0].token_ids == want.token_ids
    with pytest.raises(UserError, match="skip_tokenizer_init=True loaded no tokenizer; pass token ids"):
        skipped.generate(PROMPT, params)
    for asked, message in (({"stop": ["w5"]}, "stop strings need the model's tokenizer \\(skip_tokenizer_init=True"
                                              " loaded no tokenizer\\); pass stop_token_ids"),
                           ({"bad_words": ["w5"]}, "bad_words need .* pass bad_words_ids")):
        with pytest.raises(UserError, match=message):  # a text to find, and nothing to find it with
            skipped.generate([want.prompt_token_ids], SamplingParams(max_tokens=5, **asked))
    with pytest.raises(UserError, match="has 200 tokens, more than the 96 of the model's vocabulary"):
        LLM(bare, mode="ar", dtype="float32", tokenizer=tiny_dir("api-big-vocab", tokenizer=True, vocab_size=200))
    for bad, message in (({"tokenizer": str(tokenized / "nope")}, "nope: no such tokenizer folder, .gguf file"),
                         ({"tokenizer": str(tokenized.parent)}, "no tokenizer in .* \\(none of tokenizer.json"),
                         ({"tokenizer": ""}, "tokenizer must be a non-empty name or path"),
                         ({"tokenizer": str(tokenized), "skip_tokenizer_init": True}, "loads no tokenizer")):
        with pytest.raises(UserError, match=message):
            LLM(bare, mode="ar", dtype="float32", **bad)


def test_use_tqdm_draws_vllms_bar_over_the_prompts(llm, capfd):
    """vLLM's use_tqdm: a bar over the prompts as they finish (a scored one too); none without it."""
    params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    prompts = [PROMPT, PROMPT[:40], {"prompt": PROMPT + " w5"}]
    quiet = llm.generate(prompts, params)
    capfd.readouterr()
    loud = llm.generate(prompts + [PROMPT], [params] * 3 + [SamplingParams(max_tokens=0, prompt_logprobs=0)],
                        use_tqdm=True)
    err = capfd.readouterr().err
    assert "Processed prompts" in err and "4/4" in err
    assert [o.token_ids for o in loud[:3]] == [o.token_ids for o in quiet]
    llm.generate(prompts, params, use_tqdm=False)
    assert "Processed prompts" not in capfd.readouterr().err
    ids = llm.encode(PROMPT)  # a one-token prompt with max_tokens 0 ends as it is added: no step sees it
    llm.generate([ids[:1], ids], SamplingParams(max_tokens=0), use_tqdm=True)
    assert "2/2" in capfd.readouterr().err


def test_sampling_params_are_found_where_they_lived_before_the_split():
    """Code outside that imported them from triforce.config (before 69cb54a) gets the same classes; a
    name that was never there is still an AttributeError."""
    import triforce.config
    import triforce.sampling_params
    from triforce.config import SamplingParams as moved, StructuredOutputs

    assert moved is SamplingParams is triforce.sampling_params.SamplingParams
    assert StructuredOutputs is triforce.sampling_params.StructuredOutputs
    with pytest.raises(AttributeError):
        triforce.config.NoSuchThing


def test_truncate_prompt_tokens_keeps_a_texts_bos_as_vllms_tokenizer_truncation_does():
    """vLLM truncates a text inside the tokenizer, which keeps the special tokens it adds: the last ids of a
    Llama prompt lost its BOS. Token ids given are cut as given."""
    from types import SimpleNamespace

    from triforce.request_checks import RequestChecks

    class Tokenizer:  # a BOS before every text, as Llama's
        bos_token_id = 1

        def __call__(self, text):
            return SimpleNamespace(input_ids=[1] + [5] * len(text.split()))

    checks = RequestChecks()
    checks.tokenizer = Tokenizer()
    ids = [1, 5, 6, 7, 8]
    assert checks.truncated(ids, "a text", 3) == [1, 7, 8]
    assert checks.truncated(ids, ids, 3) == [6, 7, 8]  # token ids: the last 3
    assert checks.truncated([5, 6, 7, 8], "a text", 3) == [6, 7, 8]  # no BOS to keep
    assert checks.truncated(ids, "a text", 5) == ids and checks.truncated(ids, "a text", None) == ids
    checks.target = SimpleNamespace(config=SimpleNamespace(max_positions=3))  # -1: the model's length (vLLM's)
    assert checks.truncated(ids, "a text", -1) == [1, 7, 8] and checks.truncated(ids, ids, -1) == [6, 7, 8]
    assert SamplingParams(truncate_prompt_tokens=-1).truncate_prompt_tokens == -1
    for bad in (0, -2, 2.0):
        with pytest.raises(ConfigError, match="truncate_prompt_tokens must be None, -1"):
            SamplingParams(truncate_prompt_tokens=bad)

    class Unadded(Tokenizer):  # a BOS it adds nowhere (SmolLM2's <|im_start|>): written in the text, it is cut
        def __call__(self, text):
            return SimpleNamespace(input_ids=[5] * len(text.split()))

    checks = RequestChecks()
    checks.tokenizer = Unadded()
    assert checks.truncated(ids, "<s> a text", 3) == [6, 7, 8]


def test_an_empty_text_is_a_prompt_where_the_tokenizer_adds_a_bos():
    """vLLM runs "" as [BOS] where the tokenizer adds one, and refuses empty ids: "" was refused before
    tokenizing."""
    from types import SimpleNamespace

    from triforce.errors import UserError
    from triforce.request_checks import RequestChecks

    checks = RequestChecks()
    checks.target = SimpleNamespace(config=SimpleNamespace(vocab_size=96))
    checks.tokenizer = lambda text: SimpleNamespace(input_ids=[1] + [5] * len(text.split()))
    assert checks.encode("") == [1]
    checks.tokenizer = lambda text: SimpleNamespace(input_ids=[5] * len(text.split()))
    with pytest.raises(UserError, match="empty prompt"):
        checks.encode("")


def test_a_default_draft_an_export_left_aside_is_found(tiny_dir, tmp_path, monkeypatch):
    """train-draft replaces a draft by renaming it aside (NAME.old), then the new one in: killed between the
    two, the default model ran without its draft until the next export put it back."""
    import shutil

    from triforce import llm_models

    target = tiny_dir("api-target", tokenizer=True, seed=51)
    shutil.copytree(tiny_dir("api-draft", tokenizer=True, seed=52, num_layers=1), tmp_path / "draft.old")
    monkeypatch.setitem(llm_models.DEFAULT_DRAFTS, str(target), tmp_path / "draft")
    llm = LLM(target, mode="triforce", dtype="float32", window=64)
    assert llm.draft_path == tmp_path / "draft.old" and llm.draft is not None


def test_an_unseeded_request_draws_from_a_whole_state_of_its_own(llm, monkeypatch):
    """Its generator's mt19937 words come from os.urandom (speculation/sampling.unseeded_generator): words
    laid out as manual_seed(5) lays them out give what seed 5 gives. It was seeded by a number, whose low
    32 bits alone a generator keeps: unseeded requests shared 2**32 streams."""
    import os

    from triforce.speculation.sampling import MT_WORDS

    assert torch.equal(torch.rand(4, generator=torch.Generator().manual_seed(5)),
                       torch.rand(4, generator=torch.Generator().manual_seed(5 + 2**32)))
    words = [5]
    for i in range(1, MT_WORDS):  # mt19937's init_genrand
        words.append((1812433253 * (words[-1] ^ (words[-1] >> 30)) + i) & 0xFFFFFFFF)
    made = b"".join(w.to_bytes(4, "little") for w in words)
    seeded = llm.generate(PROMPT, SamplingParams(max_tokens=12, temperature=1.0, seed=5))[0].token_ids
    urandom = os.urandom
    monkeypatch.setattr(os, "urandom", lambda n: made if n == 4 * MT_WORDS else urandom(n))
    assert llm.generate(PROMPT, SamplingParams(max_tokens=12, temperature=1.0))[0].token_ids == seeded
    monkeypatch.undo()
    outs = {tuple(o.token_ids) for o in llm.generate([PROMPT] * 4, SamplingParams(max_tokens=12, temperature=1.0))}
    assert len(outs) > 1
