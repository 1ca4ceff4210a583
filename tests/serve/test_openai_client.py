"""The real `openai` client against `triforce serve`'s app on a free loopback port (uvicorn in a thread):
completions, chat and streams equal `triforce generate` and LLM.generate; every error status arrives as
the client's exception; 16 clients at once each get their own answer; a client that leaves mid-stream
frees its slot; /metrics, read with prometheus_client's parser, agrees with the responses' usage."""
import json
import threading
import time

import openai
import pytest
from servers import KEY, Server

from triforce import LLM, SamplingParams
from triforce.launch.cli import main
from triforce.serve.app import create_app

TEMPLATE = "{% for m in messages %}w3 {{ m['content'] }} {% endfor %}{% if add_generation_prompt %}w4{% endif %}"
SETTINGS = ["--mode", "triforce", "--dtype", "float32", "--window", "64", "--budget", "16", "--chunk-size", "4"]


def words(n: int, step: int = 7, first: int = 0) -> str:
    return " ".join(f"w{3 + (first + step * i) % 90}" for i in range(n))


@pytest.fixture(scope="module")
def models(tiny_dir):
    return (tiny_dir("serve-target", tokenizer=True, seed=71),
            tiny_dir("serve-draft", tokenizer=True, seed=72, num_layers=1))


@pytest.fixture(scope="module")
def llm(models):
    target, draft = models
    model = LLM(target, draft, mode="triforce", dtype="float32", window=64, budget=16, chunk_size=4)
    model.tokenizer.chat_template = TEMPLATE
    return model


@pytest.fixture(scope="module")
def server(llm):
    s = Server(create_app(llm, "tiny", api_key=KEY))
    yield s
    s.close()


def greedy(llm, prompt, max_tokens) -> str:
    return llm.generate(prompt, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))[0].text


def test_a_completion_equals_triforce_generate(models, server, capsys):
    target, draft = models
    prompt = words(40)
    r = server.client().completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0,
                                           extra_body={"ignore_eos": True})
    assert main(["generate", "--model", str(target), "--draft", str(draft), "--prompt", prompt, "--json",
                 "--temperature", "0", "--max-new-tokens", "12", "--ignore-eos", *SETTINGS]) == 0
    generated = json.loads(capsys.readouterr().out)
    assert r.choices[0].text == generated["text"] and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 12 and r.usage.prompt_tokens == generated["prompt_tokens"]


def test_streams_and_chat_equal_whole_answers(llm, server):
    client, prompt = server.client(), words(30, first=5)
    pieces = [c.choices[0].text for c in client.completions.create(
        model="tiny", prompt=prompt, max_tokens=10, temperature=0, stream=True, extra_body={"ignore_eos": True})]
    assert "".join(pieces) == greedy(llm, prompt, 10) and len(pieces) > 1
    messages = [{"role": "user", "content": words(12)}]
    whole = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0,
                                           extra_body={"ignore_eos": True})
    templated = llm.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    templated = getattr(templated, "input_ids", templated)
    expected = llm.generate([list(templated)], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))[0]
    assert whole.choices[0].message.content == expected.text and whole.choices[0].message.role == "assistant"
    streamed = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0,
                                              stream=True, stream_options={"include_usage": True},
                                              extra_body={"ignore_eos": True})
    chunks = list(streamed)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected.text
    assert chunks[-1].usage.completion_tokens == 8
    sampled = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0.9, seed=4,
                                             n=2)  # choice i: seed 4 + i
    alone = llm.generate([list(templated)] * 2, [SamplingParams(max_tokens=8, temperature=0.9, seed=s) for s in (4, 5)])
    assert [c.message.content for c in sampled.choices] == [o.text for o in alone]


def test_logprobs_whole_and_streamed_are_the_targets_as_generate_gives_them(llm, server):
    """Completions (`logprobs` k) and chat (`logprobs`, `top_logprobs` k), parsed by the client: one entry
    per generated token, equal to LLM.generate's (the target's log-probabilities), the k most likely beside
    each; a stream's chunks carry the same entries between them."""
    client, prompt = server.client(), words(30, first=2)
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, logprobs=2)
    expected = llm.generate(prompt, params)[0]
    completion = dict(model="tiny", prompt=prompt, max_tokens=10, temperature=0, logprobs=2,
                      extra_body={"ignore_eos": True})
    whole = client.completions.create(**completion).choices[0]
    texts = whole.logprobs.tokens  # each token's text where it stands: they join to the text
    assert whole.text == expected.text == "".join(texts) and len(texts) == 10
    assert whole.logprobs.token_logprobs == pytest.approx([e.logprob for e in expected.logprobs])
    for top, entry, text in zip(whole.logprobs.top_logprobs, expected.logprobs, texts):
        assert top[text] == pytest.approx(entry.logprob) == max(top.values()) and len(top) == 2  # greedy
    assert whole.logprobs.text_offset == [sum(map(len, texts[:i])) for i in range(10)]
    streamed = [c.choices[0].logprobs for c in client.completions.create(**completion, stream=True)
                if c.choices[0].logprobs is not None]
    assert sum((c.tokens for c in streamed), []) == texts and len(streamed) > 1
    assert sum((c.text_offset for c in streamed), []) == whole.logprobs.text_offset
    assert sum((c.token_logprobs for c in streamed), []) == whole.logprobs.token_logprobs
    stop = whole.text.split()[3]  # entries end with the token that completed a stop string, whole and streamed
    cut = client.completions.create(**completion, stop=[stop]).choices[0]
    assert stop in "".join(cut.logprobs.tokens)[len(cut.text):] and len(cut.logprobs.tokens) < 10
    assert sum((c.choices[0].logprobs.tokens for c in client.completions.create(**completion, stop=[stop], stream=True)
                if c.choices[0].logprobs), []) == cut.logprobs.tokens

    messages = [{"role": "user", "content": words(12)}]
    templated = llm.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    expected = llm.generate([list(getattr(templated, "input_ids", templated))],
                            SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=3))[0]
    chat = dict(model="tiny", messages=messages, max_tokens=8, temperature=0, logprobs=True, top_logprobs=3,
                extra_body={"ignore_eos": True})
    content = client.chat.completions.create(**chat).choices[0].logprobs.content
    assert [c.logprob for c in content] == pytest.approx([e.logprob for e in expected.logprobs])
    assert [t.logprob for c in content for t in c.top_logprobs] == \
        pytest.approx([v for e in expected.logprobs for _, v in e.top])
    assert all(c.bytes == list(c.token.encode()) and c.top_logprobs[0].token == c.token for c in content)  # greedy
    streamed = sum((c.choices[0].logprobs.content for c in client.chat.completions.create(**chat, stream=True)
                    if c.choices and c.choices[0].logprobs is not None), [])
    assert [c.model_dump() for c in streamed] == [c.model_dump() for c in content]
    plain = client.chat.completions.create(**{**chat, "logprobs": None, "top_logprobs": None})
    assert plain.choices[0].logprobs is None


def test_echo_puts_the_prompt_and_its_logprobs_first_and_max_tokens_0_scores_only(llm, server):
    """How evaluation harnesses ask for a text's log-likelihood (echo, logprobs, max_tokens 0): the prompt's
    entries are the target's (LLM.generate's prompt_logprobs), the first null; with generated tokens, theirs
    follow, whole and streamed alike; token-id prompts echo as decoded."""
    client, prompt = server.client(), words(20, first=3)
    ids = llm.encode(prompt)
    scored = llm.generate(prompt, SamplingParams(max_tokens=0, prompt_logprobs=1))[0]
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=0, echo=True, logprobs=1).choices[0]
    assert r.text == prompt == "".join(r.logprobs.tokens) and len(r.logprobs.tokens) == len(ids)
    assert r.logprobs.token_logprobs[0] is None and r.logprobs.top_logprobs[0] is None
    assert r.logprobs.token_logprobs[1:] == pytest.approx([e.logprob for e in scored.prompt_logprobs[1:]])
    for top, text, entry in zip(r.logprobs.top_logprobs[1:], r.logprobs.tokens[1:], scored.prompt_logprobs[1:]):
        assert top[text] == pytest.approx(entry.logprob) and max(top.values()) == pytest.approx(entry.top[0][1])
        assert len(top) == (1 if entry.top[0][0] == entry.token else 2)  # the most likely, and the chosen

    generated = llm.generate(prompt, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=1))[0]
    asked = dict(model="tiny", prompt=ids, max_tokens=6, temperature=0, echo=True, logprobs=1,
                 extra_body={"ignore_eos": True})
    whole = client.completions.create(**asked).choices[0]
    assert whole.text == llm.tokenizer.decode(ids, skip_special_tokens=True) + generated.text
    assert whole.logprobs.token_logprobs[:len(ids)] == pytest.approx(r.logprobs.token_logprobs)
    assert whole.logprobs.token_logprobs[len(ids):] == pytest.approx([e.logprob for e in generated.logprobs])
    chunks = [c.choices[0] for c in client.completions.create(**asked, stream=True)]
    assert "".join(c.text for c in chunks) == whole.text
    for field in ("tokens", "token_logprobs", "text_offset"):
        assert sum((getattr(c.logprobs, field) for c in chunks if c.logprobs), []) == getattr(whole.logprobs, field)
    plain = client.completions.create(model="tiny", prompt=prompt, max_tokens=0, echo=True).choices[0]
    assert plain.text == prompt and plain.logprobs is None


def test_vllms_prompt_logprobs_are_the_prompts_entries(llm, server):
    """vLLM's prompt_logprobs k (an extra field): each completion choice's, and a chat response's, per prompt
    token null (the first) or {token id: {logprob, rank, decoded_token}}, the prompt's token and its k most
    likely, as LLM.generate scores them; beside echo's logprobs (fewer), each its own count; not streamed."""
    from triforce.chat import chat_ids

    client, prompt = server.client(), words(20, first=3)
    ids = llm.encode(prompt)
    scored = llm.generate(prompt, SamplingParams(max_tokens=0, prompt_logprobs=3))[0]
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=2, echo=True, logprobs=1,
                                  extra_body={"prompt_logprobs": 3}).choices[0]
    entries = r.model_extra["prompt_logprobs"]
    assert len(entries) == len(ids) and entries[0] is None
    for token, entry, want in zip(ids[1:], entries[1:], scored.prompt_logprobs[1:]):
        assert entry[str(token)]["logprob"] == pytest.approx(want.logprob) and entry[str(token)]["rank"] == want.rank
        assert {int(t) for t in entry} == {token} | {t for t, _ in want.top}
        assert all(isinstance(e["decoded_token"], str) for e in entry.values())
    assert max(len(top) for top in r.logprobs.top_logprobs[1:len(ids)]) <= 2  # echo's: its own k of 1
    messages = [{"role": "user", "content": words(6)}]
    chat = client.chat.completions.create(model="tiny", messages=messages, max_tokens=2,
                                          extra_body={"prompt_logprobs": 0})
    templated = chat_ids(llm.tokenizer, messages)
    assert [list(e) if e else None for e in chat.model_extra["prompt_logprobs"]] == \
        [None] + [[str(t)] for t in templated[1:]]
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model="tiny", prompt=prompt, max_tokens=2, stream=True,
                                  extra_body={"prompt_logprobs": 1})
    assert "prompt_logprobs" in str(bad.value)


def test_a_logit_bias_bans_and_boosts_tokens_as_generate_does(llm, server):
    """OpenAI's logit_bias (token id strings to values), through the client: the answer is
    LLM.generate's with the same bias, the banned tokens absent and the answer changed."""
    client, prompt = server.client(), words(24, first=4)
    free = llm.generate(prompt, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))[0]
    banned = sorted(set(free.token_ids), key=free.token_ids.count)[-2:]
    bias = {**{str(t): -100 for t in banned}, "40": 3}
    expected = llm.generate(prompt, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logit_bias=bias))[0]
    got = client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0, logit_bias=bias,
                                    extra_body={"ignore_eos": True}).choices[0].text
    assert got == expected.text != free.text and not set(banned) & set(expected.token_ids)


def test_vllms_bans_and_stop_options_act_as_in_generate(llm, server):
    """vLLM's allowed_token_ids, bad_words and include_stop_str_in_output (extra fields), through the
    client: each answer is LLM.generate's with the same settings, and differs from the plain one."""
    client, prompt = server.client(), words(24, first=4)
    free = llm.generate(prompt, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))[0]
    settings = [dict(allowed_token_ids=sorted(set(free.token_ids))[1:4]),
                dict(bad_words=[max(set(free.text.split()), key=free.text.split().count)]),
                dict(stop=[free.text.split()[3]], include_stop_str_in_output=True)]
    for extra in settings:
        expected = llm.generate(prompt, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, **extra))[0]
        stop = extra.pop("stop", None)
        got = client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0, stop=stop,
                                        extra_body={"ignore_eos": True, **extra}).choices[0].text
        assert got == expected.text != free.text


def test_penalties_change_the_answer_as_generate_does(llm, server):
    """OpenAI's presence and frequency penalties and vLLM's repetition_penalty (an extra field), through the
    client: the answer is LLM.generate's with the same penalties, and differs from the plain one; a value
    out of range is a 400 that names its field."""
    client, prompt = server.client(), words(24, first=4)
    free = llm.generate(prompt, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))[0]
    penalties = dict(presence_penalty=1.5, frequency_penalty=1.0)
    asked = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, repetition_penalty=2.0, **penalties)
    expected = llm.generate(prompt, asked)[0]
    got = client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0, **penalties,
                                    extra_body={"ignore_eos": True, "repetition_penalty": 2.0}).choices[0].text
    assert got == expected.text != free.text
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": prompt}], max_tokens=2,
                                       frequency_penalty=3)
    assert bad.value.body["param"] == "frequency_penalty"


def test_stop_token_ids_and_min_tokens_answer_as_generate_does(llm, server):
    """vLLM's stop_token_ids (generation ends at one, even with ignore_eos: finish_reason "stop") and
    min_tokens (none of them before that many tokens), as extra fields through the client."""
    client, prompt = server.client(), words(24, first=4)
    free = llm.generate(prompt, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))[0]
    stop = free.token_ids[3]
    for min_tokens in (0, 8):
        asked = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, stop_token_ids=(stop,),
                               min_tokens=min_tokens)
        expected = llm.generate(prompt, asked)[0]
        got = client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0, extra_body={
            "ignore_eos": True, "stop_token_ids": [stop], "min_tokens": min_tokens}).choices[0]
        assert (got.text, got.finish_reason) == (expected.text, expected.finish_reason)
        assert stop not in expected.token_ids[:min_tokens]
        if not min_tokens:
            assert expected.token_ids[-1] == stop and len(expected.token_ids) <= 4 and got.finish_reason == "stop"


def test_every_error_status_reaches_the_client_as_its_exception(llm):
    server = Server(create_app(llm, "tiny", api_key=KEY, max_queue=1))
    client, prompt = server.client(), words(20)
    try:
        with pytest.raises(openai.AuthenticationError):  # 401
            server.client(key="wrong").completions.create(model="tiny", prompt=prompt, max_tokens=2)
        with pytest.raises(openai.NotFoundError) as unknown:  # 404
            client.completions.create(model="gpt-4", prompt=prompt, max_tokens=2)
        assert unknown.value.body["param"] == "model"
        with pytest.raises(openai.BadRequestError) as bad:  # 400
            client.completions.create(model="tiny", prompt=prompt, max_tokens=2, n=0)
        assert bad.value.body["param"] == "n"
        with pytest.raises(openai.BadRequestError) as too_long:  # 400, as OpenAI's and vLLM's
            client.completions.create(model="tiny", prompt=" ".join(["w5"] * 5000), max_tokens=2)
        assert too_long.value.body["code"] == "context_length_exceeded"
        scheduler = server.app.state.scheduler
        scheduler._admit = lambda: None  # nothing leaves the queue from now on
        outcome = []

        def wait_in_the_queue():
            try:
                server.client(timeout=5).completions.create(model="tiny", prompt=prompt, max_tokens=2)
            except openai.APITimeoutError as exc:
                outcome.append(exc)

        waiting = threading.Thread(target=wait_in_the_queue)
        waiting.start()
        for _ in range(100):
            if scheduler.waiting:
                break
            time.sleep(0.05)
        with pytest.raises(openai.InternalServerError) as full:  # 503: the one place in the queue is taken
            client.completions.create(model="tiny", prompt=prompt, max_tokens=2)
        assert full.value.status_code == 503 and full.value.body["code"] == "queue_full"
        waiting.join()
        assert len(outcome) == 1  # the waiting request never ran
        left = scheduler.waiting[0]
        for _ in range(100):  # the server notices the client left at its next poll (POLL_S)
            if left.cancelled:
                break
            time.sleep(0.05)
        assert left.cancelled, "the server did not notice that the client left"
        del scheduler._admit  # admitting again, the scheduler drops the request its client left
        for _ in range(100):
            if not scheduler.waiting:
                break
            time.sleep(0.05)
        assert not scheduler.waiting and not scheduler.running and left.request is None  # dropped, never run
        with pytest.raises(openai.BadRequestError) as many:  # n = 2 choices never fit a queue of one
            client.completions.create(model="tiny", prompt=prompt, max_tokens=2, n=2)
        assert many.value.body["param"] == "n" and "--max-queue" in many.value.body["message"]
        assert not scheduler.waiting  # no choice queued alone
    finally:
        server.close()


def test_sixteen_clients_at_once_each_get_their_own_answer(llm, server):
    prompts = [words(20 + i, step=3 + i % 5, first=i) for i in range(16)]
    expected = [greedy(llm, p, 8) for p in prompts]
    got = [None] * 16
    start = threading.Barrier(16)

    def ask(i):
        client = server.client()
        start.wait()
        if i % 2:
            stream = client.completions.create(model="tiny", prompt=prompts[i], max_tokens=8, temperature=0,
                                               stream=True, extra_body={"ignore_eos": True})
            got[i] = "".join(c.choices[0].text for c in stream)
        else:
            got[i] = client.completions.create(model="tiny", prompt=prompts[i], max_tokens=8, temperature=0,
                                               extra_body={"ignore_eos": True}).choices[0].text

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == expected


def test_a_client_that_leaves_mid_stream_frees_its_slot(server):
    before = server.metrics()
    tokens = ("vllm:generation_tokens_total", frozenset({("model_name", "tiny")}))
    running = ("vllm:num_requests_running", frozenset({("model_name", "tiny")}))
    stream = server.client().completions.create(model="tiny", prompt=words(30), max_tokens=400, temperature=0,
                                                stream=True, extra_body={"ignore_eos": True})
    next(iter(stream))
    stream.close()  # the client goes away after its first piece
    for _ in range(200):
        after = server.metrics()
        if after[running] == 0 and after.get(tokens, 0) > before.get(tokens, 0):
            break
        time.sleep(0.05)
    assert after[running] == 0
    assert 0 < after[tokens] - before.get(tokens, 0) < 400  # ended early, not at max_tokens


def test_metrics_parse_and_agree_with_the_responses_usage(llm):
    server = Server(create_app(llm, "tiny", api_key=KEY))
    try:
        client, usages = server.client(), []
        for i, max_tokens in enumerate((6, 9, 4)):
            r = client.completions.create(model="tiny", prompt=words(25 + i, first=i), max_tokens=max_tokens,
                                          temperature=0, extra_body={"ignore_eos": True})
            usages.append(r.usage)
        m, model = server.metrics(), frozenset({("model_name", "tiny")})
        assert m[("vllm:prompt_tokens_total", model)] == sum(u.prompt_tokens for u in usages)
        assert m[("vllm:generation_tokens_total", model)] == sum(u.completion_tokens for u in usages) == 19
        assert m[("vllm:request_success_total", model | {("finished_reason", "length")})] == 3
        assert m[("vllm:time_to_first_token_seconds_count", model)] == 3
        drafts = sum(v for (name, _), v in m.items() if name == "vllm:spec_decode_num_drafts_total")
        assert drafts > 0  # mode triforce: its tiers' checks are counted
    finally:
        server.close()
