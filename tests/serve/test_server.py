"""`triforce serve` (serve/): the OpenAI wire format over FastAPI's TestClient, against LLM.generate on the
same tiny models: whole and streamed answers, chat, concurrent requests on one batch, errors, the key,
the queue and cancellation."""
import gc
import json
import queue
import re
import threading
import time
import weakref
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from triforce import LLM, SamplingParams
import triforce
from triforce.coordinator.batch import SequenceBatch
from triforce.serve.app import create_app
from triforce.serve.openai import ApiError, parse
from triforce.serve.scheduler import Scheduler

PROMPT = " ".join(f"w{3 + (7 * i) % 90}" for i in range(40))
TEMPLATE = "{% for m in messages %}w3 {{ m['content'] }} {% endfor %}{% if add_generation_prompt %}w4{% endif %}"


@pytest.fixture(scope="module")
def llm(tiny_dir):
    target = tiny_dir("serve-target", tokenizer=True, seed=71)
    draft = tiny_dir("serve-draft", tokenizer=True, seed=72, num_layers=1)
    model = LLM(target, draft, mode="triforce", dtype="float32", window=64, budget=16, chunk_size=4)
    model.tokenizer.chat_template = TEMPLATE
    return model


@pytest.fixture
def client(llm):
    with TestClient(create_app(llm, "tiny")) as c:
        yield c


def plain(llm, prompt, max_tokens, **sampling):
    return llm.generate(prompt, SamplingParams(max_tokens=max_tokens, **sampling))[0]


def events(response) -> list:
    """The data of each server-sent event of a streamed response."""
    lines = [line for line in response.text.split("\n") if line]
    assert all(line.startswith("data: ") for line in lines)
    return [line[len("data: "):] for line in lines]


def test_a_body_past_the_limit_is_refused_as_it_arrives_and_the_server_goes_on(llm):
    """A request body larger than --max-request-mb gets 413, said by its Content-Length or counted as it
    arrives (chunked, no length): a body of gigabytes had been read whole, then parsed, in the server's
    memory. One under the limit is answered, as is the next request."""
    body = {"prompt": PROMPT, "max_tokens": 2, "temperature": 0, "user": "x" * 3000}
    raw = json.dumps(body).encode()
    with TestClient(create_app(llm, "tiny", max_body_bytes=len(raw) - 1)) as c:
        for path in ("/v1/completions", "/tokenize"):
            r = c.post(path, content=raw, headers={"Content-Type": "application/json"})
            assert r.status_code == 413 and "--max-request-mb" in r.json()["error"]["message"], r.text
        chunked = c.post("/v1/completions", content=(raw[i:i + 1000] for i in range(0, len(raw), 1000)),
                         headers={"Content-Type": "application/json"})
        assert chunked.status_code == 413 and chunked.json()["error"]["code"] == "request_too_large"
        r = c.post("/v1/completions", json={**body, "user": "x"})
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == plain(llm, PROMPT, 2, temperature=0).text


def test_top_logprobs_of_0_without_logprobs_is_taken_as_vllm_takes_it(client):
    """0 alternatives asks for none: a 400 ("needs 'logprobs': true") where vLLM answers."""
    r = client.post("/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "user", "content": "w5"}],
                                                  "max_tokens": 2, "top_logprobs": 0})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["logprobs"] is None


def test_a_completion_is_what_generate_gives(llm, client):
    expected = plain(llm, PROMPT, 12, temperature=0, ignore_eos=True)
    r = client.post("/v1/completions", json={"model": "tiny", "prompt": PROMPT, "max_tokens": 12,
                                             "temperature": 0, "ignore_eos": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion" and body["model"] == "tiny"
    assert body["choices"][0]["text"] == expected.text and body["choices"][0]["finish_reason"] == "length"
    assert body["choices"][0]["stop_reason"] is None
    assert body["usage"] == {"prompt_tokens": 40, "completion_tokens": 12, "total_tokens": 52,
                             "prompt_tokens_details": {"cached_tokens": 0}}
    unnamed = client.post("/v1/completions", json={"model": "", "prompt": PROMPT, "max_tokens": 12, "temperature": 0,
                                                   "ignore_eos": True})  # the served model, as vLLM takes it (a 404)
    assert unnamed.status_code == 200 and unnamed.json()["model"] == "tiny", unnamed.text
    assert unnamed.json()["choices"][0]["text"] == expected.text
    for count in (12.0, "12"):  # as vLLM's request models (pydantic, lax) take them: pandas writes 12.0 (a 400)
        r = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": count, "temperature": 0,
                                                 "ignore_eos": True, "logprobs": str(1), "top_k": 5.0})
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == expected.text, r.text
        assert r.json()["usage"]["completion_tokens"] == 12 and len(r.json()["choices"][0]["logprobs"]["top_logprobs"][0]) == 1
    seeded = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0.9, "seed": 3, "top_k": 20}
    sample = plain(llm, PROMPT, 8, temperature=0.9, seed=3, top_k=20)
    assert client.post("/v1/completions", json=seeded).json()["choices"][0]["text"] == sample.text


def test_a_stream_carries_the_same_text_and_ends_with_done(llm, client):
    expected = plain(llm, PROMPT, 10, temperature=0, ignore_eos=True)
    r = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 10, "temperature": 0, "ignore_eos": True,
                                             "stream": True, "stream_options": {"include_usage": True}})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    data = events(r)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == expected.text
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 10 and len({c["id"] for c in chunks}) == 1
    assert all("usage" in c and c["usage"] is None for c in chunks[:-1])  # OpenAI's: null but in the last


def test_return_token_ids_gives_each_choices_ids_and_its_prompts_whole_and_streamed(llm, client):
    """vLLM's return_token_ids: a completion choice's token_ids and prompt_token_ids, a chat answer's
    prompt_token_ids beside its choices' token_ids; streamed, each chunk carries the ids of the text it
    carries, so they join to the output's, and a choice's first chunk the prompt's. What a model without
    a tokenizer (--skip-tokenizer-init) answers with."""
    expected = plain(llm, PROMPT, 7, temperature=0, ignore_eos=True)
    ids = llm.encode(PROMPT)
    body = {"prompt": PROMPT, "max_tokens": 7, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    choice = client.post("/v1/completions", json=body).json()["choices"][0]
    assert (choice["token_ids"], choice["prompt_token_ids"]) == (expected.token_ids, ids)
    unasked = client.post("/v1/completions", json={**body, "return_token_ids": False}).json()["choices"][0]
    assert "token_ids" not in unasked and "prompt_token_ids" not in unasked
    chunks = [json.loads(d) for d in events(client.post("/v1/completions", json={**body, "stream": True, "n": 2,
                                                                                 "echo": True}))[:-1]]
    for index in (0, 1):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
        assert sum((c["token_ids"] for c in mine), []) == expected.token_ids
        worded = [c for c in mine[1:] if c["text"]]  # (the first: the echo) a word per token here
        assert worded and all(len(c["token_ids"]) == len(c["text"].split()) > 0 for c in worded)
        assert mine[0]["prompt_token_ids"] == ids and all("prompt_token_ids" not in c for c in mine[1:])
    messages = [{"role": "user", "content": "w10 w11"}]
    chat = {"messages": messages, "max_tokens": 5, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    answer = client.post("/v1/chat/completions", json=chat).json()
    templated = llm.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    prompt = list(templated["input_ids"] if hasattr(templated, "keys") else templated)
    assert answer["prompt_token_ids"] == prompt
    assert answer["choices"][0]["token_ids"] == plain(llm, [prompt], 5, temperature=0, ignore_eos=True).token_ids
    chunks = [json.loads(d) for d in events(client.post("/v1/chat/completions", json={**chat, "stream": True}))[:-1]]
    assert sum((c["choices"][0]["token_ids"] for c in chunks), []) == answer["choices"][0]["token_ids"]
    assert chunks[0]["prompt_token_ids"] == prompt and all("prompt_token_ids" not in c for c in chunks[1:])


def test_continuous_usage_stats_count_each_choices_tokens_in_every_chunk(llm, client):
    """vLLM's stream_options.continuous_usage_stats: every chunk carries its choice's counts so far (it was
    ignored: null in all but the last chunk); without include_usage it asks for nothing."""
    expected = [plain(llm, PROMPT, 30, temperature=0.9, seed=7 + i, ignore_eos=True) for i in range(2)]
    body = {"prompt": PROMPT, "max_tokens": 30, "temperature": 0.9, "seed": 7, "n": 2, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    chunks = [json.loads(d) for d in events(client.post("/v1/completions", json=body))[:-1]]
    for i, e in enumerate(expected):
        mine = [c for c in chunks if c["choices"] and c["choices"][0]["index"] == i]
        counts = [c["usage"]["completion_tokens"] for c in mine]
        assert len(mine) > 2 and counts == sorted(counts) and 0 < counts[0] < counts[-1] == len(e.token_ids)
        assert "".join(c["choices"][0]["text"] for c in mine) == e.text
        assert all(c["usage"]["prompt_tokens"] == 40 and c["usage"]["total_tokens"] == 40 + count
                   for c, count in zip(mine, counts))
    assert chunks[-1]["usage"]["completion_tokens"] == 60 and not chunks[-1]["choices"]
    body["stream_options"] = {"continuous_usage_stats": True}
    assert all("usage" not in json.loads(d) for d in events(client.post("/v1/completions", json=body))[:-1])
    chat = {"messages": [{"role": "user", "content": "w10 w11"}], "max_tokens": 12, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    chunks = [json.loads(d) for d in events(client.post("/v1/chat/completions", json=chat))[:-1]]
    counts = [c["usage"]["completion_tokens"] for c in chunks]
    assert counts == sorted(counts) and counts[-1] == 12 and chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    echo = {**body, "echo": True, "max_tokens": 5, "stream_options": chat["stream_options"]}  # the prompt's
    # chunk counts no completion token (it said 1)
    chunks = [json.loads(d) for d in events(client.post("/v1/completions", json=echo))[:-1]]
    first = [next(c for c in chunks if c["choices"] and c["choices"][0]["index"] == i) for i in range(2)]
    assert all(c["choices"][0]["text"] == PROMPT and c["usage"]["completion_tokens"] == 0 for c in first)


def test_the_stop_reason_names_the_stop_string_or_token_id_whole_and_streamed(llm, client):
    """vLLM's stop_reason: the stop string or stop token id that ended a choice, in the answer and in a
    stream's last chunk of that choice."""
    free = plain(llm, PROMPT, 12, temperature=0, ignore_eos=True)
    stop_id, stop_text = free.token_ids[2], free.text.split()[3]
    asked = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    for extra, reason in (({"stop_token_ids": [stop_id]}, stop_id), ({"stop": [stop_text]}, stop_text)):
        whole = client.post("/v1/completions", json={**asked, **extra}).json()["choices"][0]
        assert (whole["finish_reason"], whole["stop_reason"]) == ("stop", reason)
        chunks = [json.loads(d) for d in events(client.post("/v1/completions", json={**asked, **extra,
                                                                                     "stream": True}))[:-1]]
        assert [(c["choices"][0]["finish_reason"], c["choices"][0].get("stop_reason")) for c in chunks][-1] == (
            "stop", reason)


def test_chat_uses_the_template_and_streams_deltas(llm, client):
    messages = [{"role": "user", "content": "w10 w11 w12"}]
    ids = llm.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    expected = plain(llm, ids, 8, temperature=0, ignore_eos=True)
    body = {"messages": messages, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    r = client.post("/v1/chat/completions", json=body).json()
    assert r["object"] == "chat.completion" and r["choices"][0]["message"] == {"role": "assistant",
                                                                             "content": expected.text}
    assert r["usage"]["prompt_tokens"] == len(ids)
    chunks = [json.loads(d) for d in events(client.post("/v1/chat/completions", json={**body, "stream": True}))[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == expected.text
    assert chunks[-1]["object"] == "chat.completion.chunk" and chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_concurrent_requests_run_together_and_each_gets_its_own(llm, client, count_calls):
    prompts = [PROMPT, PROMPT + " w5 w9", " ".join(PROMPT.split()[:25])]
    expected = [plain(llm, p, 14, temperature=0, ignore_eos=True).text for p in prompts]
    count_calls.clear()
    got = [None] * len(prompts)
    start = threading.Barrier(len(prompts))

    def ask(i):
        start.wait()
        r = client.post("/v1/completions", json={"prompt": prompts[i], "max_tokens": 14, "temperature": 0,
                                                 "ignore_eos": True})
        got[i] = r.json()["choices"][0]["text"]

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == expected  # never mixed up
    assert max(count_calls) >= 2  # some forwards carried several requests


def test_n_choices_are_the_requests_of_their_seeds(llm, client):
    """n = 3 with a seed: choice i is what the request alone with seed + i gives (choice 0: the n = 1
    answer), whole and streamed (the choices' chunks interleave, each in its order), and usage counts the
    prompt once and every choice's tokens."""
    sampling = dict(temperature=0.9, top_k=20)
    expected = [plain(llm, PROMPT, 8, seed=5 + i, **sampling) for i in range(3)]
    assert len({e.text for e in expected}) > 1
    body = {"prompt": PROMPT, "max_tokens": 8, "seed": 5, "n": 3, **sampling}
    r = client.post("/v1/completions", json=body).json()
    assert [c["index"] for c in r["choices"]] == [0, 1, 2]
    assert [c["text"] for c in r["choices"]] == [e.text for e in expected]
    assert r["usage"]["prompt_tokens"] == 40
    assert r["usage"]["completion_tokens"] == sum(len(e.token_ids) for e in expected)
    data = events(client.post("/v1/completions", json={**body, "stream": True,
                                                        "stream_options": {"include_usage": True}}))
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    for i, e in enumerate(expected):
        mine = [c["choices"][0] for c in chunks if c["choices"] and c["choices"][0]["index"] == i]
        assert "".join(c["text"] for c in mine) == e.text and mine[-1]["finish_reason"] == e.finish_reason
    assert chunks[-1]["usage"] == r["usage"]
    chat = {"messages": [{"role": "user", "content": "w10 w11"}], "max_tokens": 4, "n": 2, "stream": True}
    firsts = {}
    for c in (json.loads(d) for d in events(client.post("/v1/chat/completions", json=chat))[:-1]):
        firsts.setdefault(c["choices"][0]["index"], c["choices"][0]["delta"])
    assert sorted(firsts) == [0, 1] and all(d["role"] == "assistant" for d in firsts.values())


def test_a_list_of_prompts_gets_each_prompts_choices_in_order(llm, client):
    """prompt: [text, token ids] with n = 2 (as evaluation harnesses batch them): choices prompt after
    prompt, each what that prompt asked alone with its seed gives; usage sums the prompts."""
    short = llm.encode(" ".join(PROMPT.split()[:12]))
    expected = [plain(llm, p, 6, temperature=0.8, seed=9 + i) for p in (PROMPT, short) for i in range(2)]
    r = client.post("/v1/completions", json={"prompt": [PROMPT, short], "max_tokens": 6, "temperature": 0.8,
                                             "seed": 9, "n": 2}).json()
    assert [c["text"] for c in r["choices"]] == [e.text for e in expected]
    assert [c["index"] for c in r["choices"]] == [0, 1, 2, 3]
    assert r["usage"]["prompt_tokens"] == 40 + 12
    chunks = [json.loads(d) for d in events(client.post("/v1/completions", json={
        "prompt": [PROMPT, short], "max_tokens": 6, "temperature": 0.8, "seed": 9, "n": 2, "stream": True}))[:-1]]
    assert ["".join(c["choices"][0]["text"] for c in chunks if c["choices"][0]["index"] == i) for i in range(4)] == \
        [e.text for e in expected]
    too_many = parse_error({"prompt": [PROMPT] * 2049}, llm)
    assert too_many.param == "prompt" and "at most 2048" in too_many.message


def parse_error(body: dict, llm) -> ApiError:
    with pytest.raises(ApiError) as refused:
        parse("completion", body, llm, "tiny")
    return refused.value


@pytest.mark.parametrize("path,body,status,param", [
    ("/v1/completions", {"model": "gpt-4", "prompt": PROMPT}, 404, "model"),
    ("/v1/completions", {"prompt": PROMPT, "n": 0}, 400, "n"),
    ("/v1/completions", {"prompt": PROMPT, "n": 129}, 400, "n"),
    ("/v1/completions", {"prompt": PROMPT, "n": 2, "best_of": 3}, 400, "best_of"),
    ("/v1/completions", {"prompt": PROMPT, "n": 2, "seed": 2**64 - 1}, 400, "seed"),
    ("/v1/completions", {"prompt": PROMPT, "logprobs": 21}, 400, "logprobs"),
    ("/v1/completions", {"prompt": PROMPT, "logprobs": True}, 400, "logprobs"),
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": PROMPT, "logit_bias": [5, 3]}, 400, "logit_bias"),
    ("/v1/completions", {"prompt": PROMPT, "logit_bias": {"5": 101}}, 400, "logit_bias"),
    ("/v1/completions", {"prompt": PROMPT, "logit_bias": {"w5": 1}}, 400, "logit_bias"),
    ("/v1/completions", {"prompt": PROMPT, "logit_bias": {"96": 1}}, 400, "logit_bias"),
    ("/v1/completions", {"prompt": PROMPT, "logit_bias": {"5": True}}, 400, "logit_bias"),
    ("/v1/completions", {"prompt": PROMPT, "logit_bias": {"5": "1"}}, 400, "logit_bias"),
    ("/v1/completions", {"prompt": PROMPT, "echo": "yes"}, 400, "echo"),
    ("/v1/completions", {"prompt": PROMPT, "echo": 1}, 400, "echo"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w5"}], "echo": True}, 400, "echo"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w5"}], "logprobs": 2}, 400, "logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w5"}], "logprobs": 1}, 400, "logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w5"}], "top_logprobs": 2}, 400,
     "top_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w5"}], "logprobs": True,
                              "top_logprobs": -1}, 400, "top_logprobs"),
    ("/v1/completions", {"prompt": PROMPT, "frobnicate": True}, 400, "frobnicate"),
    ("/v1/completions", {"prompt": PROMPT, "temperature": -1}, 400, "temperature"),
    ("/v1/completions", {"prompt": PROMPT, "temperature": "hot"}, 400, "temperature"),
    ("/v1/completions", {"prompt": PROMPT, "temperature": 10**400}, 400, "temperature"),  # an OverflowError: 500
    ("/v1/completions", {"prompt": PROMPT, "seed": "x"}, 400, "seed"),
    ("/v1/completions", {"prompt": PROMPT, "seed": True}, 400, "seed"),
    ("/v1/completions", {"prompt": PROMPT, "seed": 1.5}, 400, "seed"),
    ("/v1/completions", {"prompt": PROMPT, "min_tokens": True}, 400, "min_tokens"),
    ("/v1/completions", {"prompt": PROMPT, "best_of": True, "n": 2}, 400, "best_of"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w5"}],
                              "tools": [{"type": "function", "function": {"name": True}}]}, 400, "tools"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w5"}],
                              "tools": [{"type": "function", "function": {"name": "f"}}],
                              "tool_choice": {"type": "function", "function": {"name": True}}}, 400, "tool_choice"),
    ("/v1/responses", {"input": "w5", "store": True}, 400, "store"),
    ("/v1/completions", {"prompt": PROMPT, "stop": [1]}, 400, "stop"),
    ("/v1/completions", {"prompt": PROMPT, "stop": 0}, 400, "stop"),  # falsy: taken as no stop
    ("/v1/completions", {"prompt": PROMPT, "stop": ""}, 400, "stop"),  # as [""] is
    ("/v1/completions", {"prompt": PROMPT, "repetition_penalty": 0}, 400, "repetition_penalty"),
    ("/v1/completions", {"prompt": PROMPT, "presence_penalty": "high"}, 400, "presence_penalty"),
    ("/v1/completions", {"prompt": PROMPT, "stop_token_ids": [1.5]}, 400, "stop_token_ids"),
    ("/v1/completions", {"prompt": PROMPT, "min_p": 1.5}, 400, "min_p"),
    ("/v1/completions", {"prompt": PROMPT, "stop_token_ids": [10**6]}, 400, "stop_token_ids"),
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": 4, "min_tokens": 5}, 400, "min_tokens"),
    ("/v1/completions", {"prompt": PROMPT, "allowed_token_ids": []}, 400, "allowed_token_ids"),
    ("/v1/completions", {"prompt": PROMPT, "allowed_token_ids": [5, 96]}, 400, "allowed_token_ids"),
    ("/v1/completions", {"prompt": PROMPT, "allowed_token_ids": "5"}, 400, "allowed_token_ids"),
    ("/v1/completions", {"prompt": PROMPT, "bad_words": "w5"}, 400, "bad_words"),
    ("/v1/completions", {"prompt": PROMPT, "bad_words": [" "]}, 400, "bad_words"),
    ("/v1/completions", {"prompt": PROMPT, "include_stop_str_in_output": 1}, 400, "include_stop_str_in_output"),
    ("/v1/completions", {"prompt": PROMPT, "skip_special_tokens": "no"}, 400, "skip_special_tokens"),
    ("/v1/completions", {"prompt": PROMPT, "stream": True, "stream_options": 3}, 400, "stream_options"),
    ("/v1/completions", {"prompt": ""}, 400, "prompt"),
    ("/v1/completions", {"prompt": [5, 100000]}, 400, "prompt"),
    ("/v1/completions", {"prompt": [PROMPT, 5]}, 400, "prompt"),
    ("/v1/completions", {"prompt": [PROMPT, ""]}, 400, "prompt"),
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": 10**6}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": " ".join(["w5"] * 5000)}, 400, "prompt"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": " ".join(["w5"] * 5000)}]}, 400, "messages"),
    ("/v1/completions", {"prompt": PROMPT, "ignore_eos": "no"}, 400, "ignore_eos"),
    ("/v1/completions", {"prompt": PROMPT, "stream": True, "stream_options": {"include_usage": "no"}}, 400,
     "include_usage"),
    ("/v1/completions", {"prompt": PROMPT, "use_beam_search": True}, 400, "use_beam_search"),
    ("/v1/completions", {"prompt": PROMPT, "stream": True, "stream_options": False}, 400, "stream_options"),  # (read
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w5"}], "logprobs": True,  # as none, and
                              "top_logprobs": False}, 400, "top_logprobs"),  # false as 0)
    ("/v1/completions", {"prompt": PROMPT, "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ("/tokenize", {"messages": [{"role": "user", "content": "w5"}], "tools": "get_weather"}, 400, "tools"),
    ("/v1/completions", {"prompt": PROMPT, "priority": False}, 400, "priority"),
    ("/v1/completions", {"prompt": PROMPT, "add_special_tokens": False}, 400, "add_special_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w5"}], "store": True}, 400, "store"),
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": -4}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": 2.5}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": PROMPT, "top_k": 2.5}, 400, "top_k"),
    ("/v1/completions", {"prompt": PROMPT, "stream": "yes"}, 400, "stream"),
    ("/v1/responses", {"input": "w5", "max_output_tokens": 0}, 400, "max_output_tokens"),
    ("/v1/responses", {"input": "w5", "stream": 1}, 400, "stream"),
    ("/v1/responses", {"input": "w5", "text": "json"}, 400, "text"),
    ("/v1/completions", {"prompt": PROMPT, "user": 5}, 400, "user"),  # (answered: a tag of any type was taken)
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w5"}], "user": ["x"]}, 400, "user"),
    ("/v1/responses", {"input": "w5", "user": {"id": 1}}, 400, "user"),
    ("/v1/responses", {"input": "w5", "metadata": "x"}, 400, "metadata"),  # (echoed back in the Response)
    ("/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w5"}], "continue_final_message": True}, 400,
     "continue_final_message"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w5"}], "chat_template_kwargs": {"tools": []}},
     400, "chat_template_kwargs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w5"}],  # the tokenizer's own options
                              "chat_template_kwargs": {"padding": "max_length", "max_length": 10**9}}, 400,
     "chat_template_kwargs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w5"}], "add_generation_prompt": "no"}, 400,
     "add_generation_prompt"),
    ("/v1/completions", {"prompt": PROMPT, "truncate_prompt_tokens": 0}, 400, "truncate_prompt_tokens"),
    ("/v1/completions", {"prompt": PROMPT, "truncate_prompt_tokens": -2}, 400, "truncate_prompt_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w5"}], "max_completion_tokens": 0}, 400,
     "max_completion_tokens"),
    ("/v1/nothing", {}, 404, None),
])
def test_bad_requests_get_openai_errors(client, path, body, status, param):
    r = client.post(path, json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["message"] and error["type"] and error["param"] == param
    assert not re.search(r"\b(True|False|None)\b", error["message"])  # JSON's words: true, false, null
    if path == "/v1/responses":  # named as the request named it, not as the chat request it becomes
        assert "max_completion_tokens" not in error["message"] and "messages" not in error["message"]


def test_fields_that_clients_send_at_their_defaults_or_as_null_are_taken(llm, client):
    """OpenAI's and vLLM's clients send some fields at their defaults (store false, vLLM's use_beam_search
    false...), tags that change no answer (metadata), and unset fields as null: each asks for what the server
    does anyway, and a 400 failed the request. A null max_completion_tokens beside max_tokens left max_tokens
    unread (the answer ran to the server's default length)."""
    chat = {"messages": [{"role": "user", "content": "w5"}], "max_tokens": 3, "temperature": 0, "ignore_eos": True}
    plain = client.post("/v1/chat/completions", json=chat).json()["choices"][0]["message"]["content"]
    sent = {"store": False, "metadata": {"run": "a"}, "service_tier": "auto", "modalities": ["text"],
            "use_beam_search": False, "length_penalty": 1.0, "priority": 0, "add_special_tokens": False,
            "request_id": "r1", "spaces_between_special_tokens": True, "reasoning_effort": None, "audio": None,
            "max_completion_tokens": None, "prompt_logprobs": None, "functions": None, "cache_salt": None}
    r = client.post("/v1/chat/completions", json={**chat, **sent})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3, r.text
    assert r.json()["choices"][0]["message"]["content"] == plain
    assert r.json()["id"] == "chatcmpl-r1"  # vLLM's: the request_id names the answer (a fresh one was made)
    r = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2, "add_special_tokens": True,
                                             "stop": ["a", "b", "c", "d", "e"], "user": None,
                                             "spaces_between_special_tokens": False})  # (a fast tokenizer's no-op)
    assert r.status_code == 200, r.text  # vLLM takes any number of stop strings (OpenAI: 4)
    # a null that is a field's own: a completion's "max_tokens": null asks for what the context allows (vLLM's)
    r = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": None, "temperature": 0,
                                             "ignore_eos": True}).json()
    room = llm.target.config.max_positions - r["usage"]["prompt_tokens"]
    assert r["usage"]["completion_tokens"] == min(1024, room) > 16, r["usage"]
    # a field the server does not take is a 400 that names it; a request's own chat template (vLLM refuses it
    # too unless trusted) says where one is set
    for field, value in (("chat_template", "{{ messages }}"), ("suffix", "w5")):
        r = client.post("/v1/chat/completions", json={**chat, field: value})
        error = r.json()["error"]
        assert r.status_code == 400 and error["param"] == field and error["code"] == "unsupported_parameter"
        assert ("--chat-template" in error["message"]) == (field == "chat_template"), error


def test_an_infinite_temperature_is_refused(client):
    """An infinite temperature would sample uniformly: Infinity (Python's json reads it) and 1e999 (JSON, read
    as infinity) are refused with the body, as no JSON numbers (echoed in a Response's metadata, the answer
    could not be written: a 500 after the generation)."""
    for field, value in (("temperature", "Infinity"), ("top_k", "1e999"), ("metadata", '{"x": 1e999}')):
        url = "/v1/responses" if field == "metadata" else "/v1/completions"
        key = "input" if field == "metadata" else "prompt"
        r = client.post(url, content=f'{{"{key}": "{PROMPT}", "{field}": {value}}}',
                        headers={"content-type": "application/json"})
        message = r.json()["error"]["message"]
        assert r.status_code == 400 and ("Infinity is not a JSON number" in message if value == "Infinity" else
                                         "past a float's range" in message), r.text


def test_tokenize_gives_the_ids_a_request_would_generate_from_and_detokenize_their_text(llm, client):
    """vLLM's /tokenize: a prompt's ids as a completion's (with the tokenizer's special tokens unless asked
    not to), a chat's as the template lays them out (the usage of the same chat request counts them);
    /detokenize gives their text back; bad bodies are 400s that name the field. An empty prompt is tokenized
    as vLLM's is ([BOS] where the tokenizer adds one, else no ids)."""
    r = client.post("/tokenize", json={"prompt": "w5 w6 w7", "return_token_strs": True}).json()
    assert r["tokens"] == llm.encode("w5 w6 w7") and r["count"] == len(r["tokens"])
    assert r["token_strs"] == llm.tokenizer.convert_ids_to_tokens(r["tokens"])
    assert r["max_model_len"] == llm.target.config.max_positions
    bare = client.post("/tokenize", json={"prompt": "w5 w6 w7", "add_special_tokens": False}).json()
    assert bare["tokens"] == llm.tokenizer("w5 w6 w7", add_special_tokens=False).input_ids and bare["token_strs"] is None
    # an empty prompt is its tokenizer's ids, none here (a 400 before: a client counting tokens failed)
    empty = client.post("/tokenize", json={"prompt": ""}).json()
    assert empty["tokens"] == llm.tokenizer("").input_ids == [] and empty["count"] == 0
    messages = [{"role": "user", "content": "w10 w11"}]
    chat = client.post("/tokenize", json={"messages": messages}).json()
    asked = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1}).json()
    assert chat["tokens"][-1] == 4 and chat["count"] == asked["usage"]["prompt_tokens"]  # ... w4 (the template's)
    text = client.post("/detokenize", json={"tokens": chat["tokens"]}).json()["prompt"]
    assert text == llm.tokenizer.decode(chat["tokens"]) and "w10 w11" in text
    for path, body, param in (("/tokenize", {"prompt": "w5", "messages": messages}, "prompt"),
                              ("/tokenize", {"prompt": 5}, "prompt"), ("/tokenize", {"prompt": "w5", "n": 2}, "n"),
                              ("/tokenize", {"messages": []}, "messages"),
                              ("/tokenize", {"prompt": "w5", "model": "gpt-4"}, "model"),
                              ("/detokenize", {"tokens": [5, 96]}, "tokens"), ("/detokenize", {"tokens": "5"}, "tokens")):
        r = client.post(path, json=body)
        assert r.status_code in (400, 404) and r.json()["error"]["param"] == param, (path, body, r.text)


def test_chat_template_options_and_text_parts_reach_the_template(llm, client, monkeypatch):
    """Text parts join as one content; add_generation_prompt false ends after the last message;
    continue_final_message ends inside it, which the answer continues; chat_template_kwargs are the
    template's variables: each prompt is the template's with the same options, counted in usage."""
    monkeypatch.setattr(llm.tokenizer, "chat_template", "{% if greeting %}w9 {% endif %}{% for d in documents or "
                        "[] %}w8 {{ d['text'] }} {% endfor %}{% for m in messages %}w3 {{ m['content'] }} w5 {% endfor %}"
                        "{% if add_generation_prompt %}w4{% endif %}")
    messages = [{"role": "user", "content": "w10 w11"}, {"role": "assistant", "content": "w20 w21"}]
    parts = [messages[0], {"role": "assistant", "content": [{"type": "text", "text": "w20"},
                                                            {"type": "text", "text": "w21"}]}]

    def template(ms, **options):
        ids = llm.tokenizer.apply_chat_template(ms, tokenize=True, **options)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    joined = [messages[0], {"role": "assistant", "content": "w20\nw21"}]
    cases = [(dict(messages=parts), template(joined, add_generation_prompt=True)),
             (dict(messages=messages, add_generation_prompt=False), template(messages)),
             (dict(messages=messages, add_generation_prompt=False, continue_final_message=True),
              template(messages, continue_final_message=True)),
             (dict(messages=messages, chat_template_kwargs={"greeting": True}),
              template(messages, add_generation_prompt=True, greeting=True)),
             (dict(messages=messages, documents=[{"text": "w30"}]),  # vLLM's field, for RAG templates
              template(messages, add_generation_prompt=True, documents=[{"text": "w30"}]))]
    plainly = template(messages, add_generation_prompt=True)
    assert len({tuple(plainly)} | {tuple(ids) for _, ids in cases[1:]}) == 5  # the options change the prompt
    r = client.post("/tokenize", json={"messages": messages, "documents": "w30"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "documents"
    for body, ids in cases:
        assert client.post("/tokenize", json=body).json()["tokens"] == ids
        r = client.post("/v1/chat/completions", json={**body, "max_tokens": 4, "temperature": 0}).json()
        assert r["usage"]["prompt_tokens"] == len(ids)
        assert r["choices"][0]["message"]["content"] == plain(llm, ids, 4, temperature=0).text


def test_truncate_prompt_tokens_keeps_each_prompts_last_tokens(llm, client):
    ids = llm.encode(PROMPT)
    expected = plain(llm, ids[-12:], 6, temperature=0, ignore_eos=True)
    assert plain(llm, PROMPT, 6, temperature=0, ignore_eos=True, truncate_prompt_tokens=12).token_ids == expected.token_ids
    r = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "ignore_eos": True,
                                             "truncate_prompt_tokens": 12, "echo": True}).json()
    assert r["usage"]["prompt_tokens"] == 12
    assert r["choices"][0]["text"] == llm.tokenizer.decode(ids[-12:], skip_special_tokens=True) + expected.text
    whole = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 1, "truncate_prompt_tokens": -1})
    assert whole.json()["usage"]["prompt_tokens"] == len(ids)  # -1: the model's length, as vLLM's (a 400 before)


def test_malformed_json_is_a_400(client):
    r = client.post("/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]


def test_a_body_is_read_as_json_and_an_answer_encoded_off_the_event_loop(llm, monkeypatch):
    """json.loads of a body of megabytes, and FastAPI's encoding of a whole answer returned as a dict (0.8 s
    for a 4,000-token prompt's log-probabilities), ran on the event loop: every stream and /health waited."""
    import triforce.serve.app as app_module
    from starlette.responses import JSONResponse

    threads = []
    read, render = app_module.request_json, JSONResponse.render
    monkeypatch.setattr(app_module, "request_json", lambda raw: threads.append(threading.current_thread().name)
                        or read(raw))
    monkeypatch.setattr(JSONResponse, "render", lambda self, content: threads.append(
        threading.current_thread().name) or render(self, content))
    with TestClient(create_app(llm, "tiny")) as c:
        r = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2, "temperature": 0})
        t = c.post("/tokenize", json={"prompt": "w5 w6"})
    assert r.status_code == 200 and t.json()["count"] > 0
    assert len(threads) == 4 and all(name.startswith("triforce-parse") for name in threads), threads


def test_a_request_being_tokenized_holds_up_neither_health_nor_streams(llm, monkeypatch):
    """Requests are checked and tokenized off the event loop: while one request's encoding is stuck,
    /health answers and a stream already running goes on to its end."""
    parsed, entered, release, real = threading.Event(), threading.Event(), threading.Event(), llm.encode

    def encode(prompt):
        if prompt == "w7 w8":
            entered.set()
            release.wait(30)
        ids = real(prompt)
        parsed.set()  # the stream's, which is encoded first (one request at a time)
        return ids

    monkeypatch.setattr(llm, "encode", encode)
    with TestClient(create_app(llm, "tiny")) as c:
        streamed = []
        stream = threading.Thread(target=lambda: streamed.append(c.post("/v1/completions", json={
            "prompt": PROMPT, "max_tokens": 20, "temperature": 0, "ignore_eos": True, "stream": True})))
        stuck = threading.Thread(target=lambda: c.post("/v1/completions", json={"prompt": "w7 w8", "max_tokens": 2}))
        answered = []
        health = threading.Thread(target=lambda: answered.append(c.get("/health").status_code))
        try:
            stream.start()
            assert parsed.wait(10)
            stuck.start()
            assert entered.wait(10)
            health.start()
            health.join(10)
            stream.join(60)
            assert answered == [200]
            assert streamed and events(streamed[0])[-1] == "[DONE]"
        finally:
            release.set()
            for t in (stream, stuck, health):
                t.join(60)


def test_models_health_and_the_api_key(llm):
    with TestClient(create_app(llm, "tiny", api_key="sesame")) as c:
        assert c.get("/health").status_code == 200  # open
        assert c.get("/v1/models").status_code == 401
        wrong = c.get("/v1/models", headers={"Authorization": "Bearer wrong"})
        assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
        key = {"Authorization": "Bearer sesame"}
        models = c.get("/v1/models", headers=key).json()
        assert [m["id"] for m in models["data"]] == ["tiny"]
        assert c.get("/v1/models/tiny", headers=key).json() == models["data"][0]  # the openai client's retrieve
        unknown = c.get("/v1/models/org/other", headers=key)
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
        assert c.get("/v1/models/tiny").status_code == 401
        assert models["data"][0]["max_model_len"] == llm.target.config.max_positions  # vLLM's
        assert models["data"][0]["root"] == str(llm.model_path) and models["data"][0]["permission"] == []
        assert c.get("/version").json()["version"] == triforce.__version__
        wrong_method = c.post("/health")  # a 405 says which methods it takes
        assert wrong_method.status_code == 405 and wrong_method.headers["allow"] == "GET"
        preflight = {"Origin": "http://ui.example", "Access-Control-Request-Method": "POST"}
        assert "access-control-allow-origin" not in c.options("/v1/completions", headers=preflight).headers
    # a web page's scripts, where the server allows their origin (CORS): the browser's preflight carries no key
    with TestClient(create_app(llm, "tiny", api_key="sesame", allowed_origins=("http://ui.example",))) as c:
        r = c.options("/v1/completions", headers={**preflight, "Access-Control-Request-Headers": "authorization"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://ui.example"
        r = c.get("/v1/models", headers={**key, "Origin": "http://ui.example"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://ui.example"
        assert c.get("/v1/models", headers={"Origin": "http://ui.example"}).status_code == 401
        other = c.options("/v1/completions", headers={**preflight, "Origin": "http://evil.example"})
        assert "access-control-allow-origin" not in other.headers


def test_an_unexpected_error_is_a_500_a_browser_can_read_logged_once(llm, monkeypatch, caplog):
    """Starlette's handler of exceptions sat outside CORS: a web page got a CORS failure instead of the JSON
    500, and the traceback was logged twice (Starlette raises it again after answering)."""
    import logging

    import triforce.serve.tokens as tokens

    monkeypatch.setattr(tokens, "tokenize", lambda *a: (_ for _ in ()).throw(RuntimeError("a bug")))
    with TestClient(create_app(llm, "tiny", allowed_origins=("http://ui.example",)), raise_server_exceptions=False) \
            as c, caplog.at_level(logging.ERROR):
        r = c.post("/tokenize", json={"prompt": "w5"}, headers={"Origin": "http://ui.example"})
    assert r.status_code == 500 and r.json()["error"]["message"] == "internal error: RuntimeError: a bug"
    assert r.headers["access-control-allow-origin"] == "http://ui.example"
    assert sum("a bug" in (record.exc_text or str(record.exc_info)) for record in caplog.records) == 1


@pytest.mark.parametrize("body", ['{"prompt": "w5", "seed": ' + "7" * 5000 + "}",  # past int()'s 4,300 digits
                                  '{"prompt": ' + "[" * 100000 + "]" * 100000 + "}", "{not json",
                                  '{"input": "w5", "metadata": {"score": NaN}}'])
def test_a_body_python_cannot_read_as_json_is_a_400(client, body):
    """A huge integer (json.loads raises a plain ValueError) and arrays nested past the recursion limit were
    500s with a traceback in the log; NaN (Python's extension to JSON), echoed in a Response's metadata, a
    500 once the answer could not be written as JSON."""
    url = "/v1/responses" if "input" in body else "/v1/completions"
    r = client.post(url, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("the request body is not valid JSON ("), r.text


def test_a_lone_surrogate_and_the_developer_role(llm, client, monkeypatch):
    """JSON's "\\ud83d" alone is no text: a 400 that says so (the tokenizer's own error was cryptic). OpenAI's
    developer role is the system one (the templates know that name; it reached them as written)."""
    r = client.post("/v1/completions", content='{"prompt": "w5 \\ud83d w6"}',
                    headers={"content-type": "application/json"})
    assert r.status_code == 400 and "lone surrogate" in r.json()["error"]["message"], r.text
    monkeypatch.setattr(llm.tokenizer, "chat_template", "{% for m in messages %}{{ {'system': 'w7', 'user': 'w8'}"
                        ".get(m['role'], 'w9') }} {{ m['content'] }} {% endfor %}")
    as_role = [client.post("/tokenize", json={"messages": [{"role": role, "content": "w5"},
                                                           {"role": "user", "content": "w6"}]}).json()["tokens"]
               for role in ("developer", "system")]
    assert as_role[0] == as_role[1] == llm.encode("w7 w5 w8 w6 ")


def test_a_full_queue_refuses_with_503_and_a_cancelled_request_stops_early(llm, monkeypatch):
    job = parse("completion", {"prompt": PROMPT, "max_tokens": 30, "temperature": 0, "ignore_eos": True,
                               "stream": True}, llm, "tiny")
    held = Scheduler(llm, max_queue=1)
    monkeypatch.setattr(held, "_admit", lambda: None)  # nothing leaves the queue
    held.submit(job, lambda *_: None)
    with pytest.raises(ApiError) as refused:
        held.submit(job, lambda *_: None)
    assert refused.value.status == 503 and refused.value.code == "queue_full"
    held.stop()
    pair = parse("completion", {"prompt": PROMPT, "max_tokens": 4, "n": 2}, llm, "tiny")
    held = Scheduler(llm, max_queue=3)
    monkeypatch.setattr(held, "_admit", lambda: None)
    waiting = held.submit_choices(pair, [lambda *_: None] * 2)
    with pytest.raises(ApiError) as refused:  # all of a request's choices or none: 2 + 2 > 3
        held.submit_choices(pair, [lambda *_: None] * 2)
    assert refused.value.code == "queue_full" and len(held.waiting) == 2
    waiting[0].cancel()  # a cancelled request waiting to be dropped holds no place
    assert held.queued == 1
    assert len(held.submit_choices(pair, [lambda *_: None] * 2)) == 2
    assert held.queued == 3 and len(held.waiting) == 3  # and is dropped (they piled up behind a blocked head)
    held.stop()

    long_job = parse("completion", {"prompt": PROMPT, "max_tokens": 400, "temperature": 0, "ignore_eos": True,
                                    "stream": True}, llm, "tiny")
    scheduler = Scheduler(llm)
    first, done, seen = threading.Event(), threading.Event(), []

    def on_event(kind, data):
        seen.append((kind, data))
        (first if kind == "text" else done if kind == "done" else threading.Event()).set()

    ticket = scheduler.submit(long_job, on_event)
    assert first.wait(60)
    ticket.cancel()  # the client went away after its first piece
    assert done.wait(60)
    assert 0 < len(seen[-1][1].token_ids) < 400  # ended after the round in progress, not at max_tokens
    assert seen[-1][1].finish_reason == "abort"  # and says so (/metrics counts it apart from "length")
    scheduler.stop()


def most_running_at_once(llm, job, count: int) -> int:
    """The most of `count` copies of `job`, all waiting before the first is admitted, that the scheduler
    runs at once."""
    scheduler, most, ended = Scheduler(llm), [], threading.Semaphore(0)
    admit, scheduler._admit = scheduler._admit, lambda: None  # all wait, then are admitted in one pass
    try:
        for _ in range(count):
            scheduler.submit(job, lambda kind, data: kind in ("done", "error") and ended.release())

        def admit_and_count():
            admit()
            most.append(len(scheduler.running))

        scheduler._admit = admit_and_count
        assert all(ended.acquire(timeout=60) for _ in range(count))
    finally:
        scheduler.stop()
    return max(most)


def test_requests_fit_beside_the_caches_the_running_ones_have_yet_to_allocate(llm, monkeypatch):
    """A running request allocates its retrieval buffers only once its prompt is prefilled: admitted by the
    memory free alone, a burst of requests got in past what the memory holds (here the free memory never
    moves, as before any of them allocated: all three got in at once). The scheduler counts the running
    requests' whole needs: two fit, the third waits for one to end. And a request that could not fit alone
    is refused (413), though the running ones' needs, counted again on top of the memory free (part of it
    theirs), made room for it before."""
    from triforce.serve.tickets import Ticket

    job = parse("completion", {"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "ignore_eos": True}, llm, "tiny")
    need = llm.cache_bytes_for(len(job.prompts[0]), 8)
    monkeypatch.setattr(llm, "free_memory", lambda: int(2.5 * need / llm.memory_share))
    assert most_running_at_once(llm, job, 3) == 2

    big = parse("completion", {"prompt": PROMPT, "max_tokens": 400}, llm, "tiny")
    big_need = llm.cache_bytes_for(len(big.prompts[0]), 400)
    free = (big_need - 0.5 * llm.memory_share * need) / llm.memory_share  # less than it needs, more with `need`
    monkeypatch.setattr(llm, "free_memory", lambda: int(free))
    held = Scheduler(llm)
    monkeypatch.setattr(held, "_admit", lambda: None)
    held.running[object()] = Ticket(job, [], None, None, need)  # a request running beside, holding `need`
    try:
        with pytest.raises(ApiError) as refused:
            held.submit(big, lambda *_: None)
        assert refused.value.status == 413 and refused.value.code == "context_length_exceeded"
        # a request that fits in what was free while none ran is queued without reading the memory free now,
        # which on a GPU snapshots the allocator on the server's event loop (each request stalled every stream)
        monkeypatch.setattr(llm, "free_memory", lambda: pytest.fail("read on the event loop"))
        held.submit(job, lambda *_: None)
        assert len(held.waiting) == 1
    finally:
        held.running.clear()
        held.stop()


def test_a_request_about_to_run_alone_is_weighed_against_the_memory_free_now(llm, monkeypatch):
    """Queued against what was free when the server last went idle, a request was then admitted alone
    without a look at the memory, which another process may have taken meanwhile: it ran out of memory."""
    job = parse("completion", {"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "ignore_eos": True}, llm, "tiny")
    need = llm.cache_bytes_for(len(job.prompts[0]), 8)
    reads = iter([int(4 * need / llm.memory_share)])  # idle at the start; then another process took most of it
    monkeypatch.setattr(llm, "free_memory", lambda: next(reads, int(0.5 * need / llm.memory_share)))
    held, told = Scheduler(llm), queue.Queue()
    try:
        held.submit(job, lambda kind, data: told.put((kind, data)))
        kind, error = told.get(timeout=60)
        assert kind == "error" and error.status == 413 and "of the memory free now" in error.message
    finally:
        held.stop()


def test_a_request_that_does_not_fit_is_weighed_again_once_the_batch_changes(llm, monkeypatch):
    """The first waiting request, too large beside the running ones, is weighed again where one of them
    ended (or a second later), not before every step of the batch: each weighing reads the free memory (a
    GPU's allocator snapshot), under the lock /health and /metrics wait for."""
    job = parse("completion", {"prompt": PROMPT, "max_tokens": 60, "temperature": 0, "ignore_eos": True}, llm,
                "tiny")
    need, reads = llm.cache_bytes_for(len(job.prompts[0]), 60), []
    monkeypatch.setattr(llm, "free_memory", lambda: reads.append(1) or int(2.5 * need / llm.memory_share))
    monkeypatch.setattr("triforce.serve.admission.REFIT_S", 600.0)  # (a slow machine's seconds: not counted)
    steps = []
    step = SequenceBatch.step
    monkeypatch.setattr(SequenceBatch, "step", lambda self: steps.append(1) or step(self))
    assert most_running_at_once(llm, job, 3) == 2
    assert len(steps) >= 60 and len(reads) < 10  # (before: a read per step while the third waited)


def test_a_gpus_requests_rows_in_the_hosts_memory_are_counted_as_they_are_admitted(llm, monkeypatch):
    """Their caches on a GPU, requests keep their rows of the vocabulary in the host's memory: the scheduler
    counts them as it counts the caches (two fit here, the third waits for one to end), and refuses a
    request whose rows alone the host cannot hold (413)."""
    from triforce.request_memory import HOST_SHARE

    job = parse("completion", {"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "ignore_eos": True}, llm, "tiny")
    rows = 10**6
    monkeypatch.setattr(llm, "host_bytes_for", lambda *a: rows)
    monkeypatch.setattr(llm, "host_free", lambda: int(2.5 * rows / HOST_SHARE))
    assert most_running_at_once(llm, job, 3) == 2
    monkeypatch.setattr(llm, "host_free", lambda: int(0.5 * rows / HOST_SHARE))
    held = Scheduler(llm)
    try:
        with pytest.raises(ApiError) as refused:
            held.submit(job, lambda *_: None)
        assert refused.value.status == 413 and "of the host's memory" in str(refused.value.body())
    finally:
        held.stop()


@pytest.mark.parametrize("stream", [True, False])
def test_a_finished_request_frees_its_caches_without_a_garbage_collection(llm, stream):
    """A request's caches go when it finishes, not when Python's cyclic collector next runs, and so does
    the request: a streamed request's ticket and request refer to each other while it runs (its stream's
    callback names the ticket), and in a server's large heap a full collection comes rarely (a 75-minute
    soak held 2 GB of finished requests' caches, then dropped them at once; docs/serving.md)."""
    job = parse("completion", {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": True,
                               "stream": stream}, llm, "tiny")
    scheduler, done, caches, requests = Scheduler(llm), threading.Event(), [], []

    def on_event(kind, data):
        if kind == "done":
            done.set()

    admit = scheduler._admit

    def admit_and_watch():  # the scheduler's thread, between steps: the running request's caches, weakly
        admit()
        for ticket in list(scheduler.running.values()):
            if not caches:
                caches.extend(weakref.ref(tier.cache) for tier in ticket.request.engine.ladder)
                requests.append(weakref.ref(ticket.request))

    scheduler._admit = admit_and_watch
    gc.collect()
    gc.disable()
    try:
        scheduler.submit(job, on_event)  # the ticket is not kept here
        assert done.wait(60)
        scheduler.stop()
        assert len(caches) >= 2 and all(ref() is None for ref in caches), "a finished request's caches live on"
        assert requests[0]() is None, "a finished request is held in a reference cycle"
    finally:
        gc.enable()


def test_a_finished_request_whose_sequence_cannot_be_ended_is_answered_and_the_server_goes_on(llm, monkeypatch):
    """Ending a finished request's sequence on a worker group that just went away (Request.close raising
    WorkerError) raised in the scheduler's thread, which ended: that request and every other in flight
    then waited forever. Its answer stands, and the next request is served."""
    from triforce.coordinator.channel import WorkerError
    from triforce.request import Request

    close = Request.close

    def failing_close(self):
        close(self)
        raise WorkerError("the worker group at tcp://127.0.0.1:1 failed 'end': it did not answer")

    monkeypatch.setattr(Request, "close", failing_close)
    scheduler = Scheduler(llm)
    try:
        for _ in range(2):
            done, outcome = threading.Event(), []

            def on_event(kind, data, outcome=outcome, done=done):
                if kind in ("done", "error"):
                    outcome.append(kind)
                    done.set()

            scheduler.submit(parse("completion", {"prompt": PROMPT, "max_tokens": 4, "temperature": 0}, llm, "tiny"),
                             on_event)
            assert done.wait(30) and outcome == ["done"]
        assert scheduler.alive
    finally:
        scheduler.stop()


def test_a_streamed_request_admitted_with_others_gets_its_own_text(llm):
    """Requests admitted in one pass of the scheduler, a streamed one first: the stream's pieces reach it
    and join to its text (once its callback read the last admitted request's settings, lost its text), its
    entries and ids (return_token_ids) to its output's."""
    streamed = parse("completion", {"prompt": PROMPT, "max_tokens": 10, "temperature": 0, "ignore_eos": True,
                                    "stream": True, "logprobs": 1}, llm, "tiny")
    whole = parse("completion", {"prompt": PROMPT + " w9", "max_tokens": 10, "temperature": 0}, llm, "tiny")
    scheduler = Scheduler(llm)
    admit, scheduler._admit = scheduler._admit, lambda: None  # both wait, then join in one pass
    seen, done = [], threading.Event()
    scheduler.submit(streamed, lambda kind, data: (seen.append((kind, data)), kind == "done" and done.set()))
    scheduler.submit(whole, lambda *_: None)
    scheduler._admit = admit
    assert done.wait(60)
    scheduler.stop()
    pieces = [data for kind, data in seen if kind == "text"]
    output = seen[-1][1]
    assert "".join(piece for piece, _, _ in pieces) == output.text and len(pieces) > 1
    assert [e for _, entries, _ in pieces for e in entries] == output.logprobs  # each entry once, in order
    assert [i for _, _, ids in pieces for i in ids] == output.token_ids  # each id once, in order (and counted)


@pytest.mark.parametrize("mode", ["triforce", "auto"])
def test_a_request_cancelled_in_its_prefill_stops_there(tiny_dir, mode):
    from triforce.request import Request
    from triforce.coordinator.batch import SequenceBatch

    target = tiny_dir("serve-target", tokenizer=True, seed=71)
    draft = tiny_dir("serve-draft", tokenizer=True, seed=72, num_layers=1)
    llm = LLM(target, draft, mode=mode, dtype="float32", window=64, budget=16, chunk_size=4, prefill_chunk=8)
    ids = llm.tokenizer(PROMPT).input_ids  # 40 tokens: 5 prefill chunks of the target
    request = Request(llm, ids, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True), None)
    batch = SequenceBatch()
    seq = batch.add(request.run())
    target_tier = request.engine.ladder[-1]
    while target_tier.length < 8:  # the first chunk ran
        assert not batch.step()
    request.cancel()
    assert batch.step() == [seq]  # after the chunk it had handed the batch, not after the prompt
    tokens, metrics = seq.result
    assert tokens == [] and target_tier.length == 16 and metrics.generated_tokens == 0
    assert request.output(tokens, metrics).token_ids == []


def test_a_scoring_request_cut_in_its_prefill_is_aborted_not_answered(tiny_dir):
    """max_tokens 0 with prompt_logprobs (an evaluation's log-likelihood), cancelled mid-prompt (a server's
    shutdown): finish_reason "abort" (it was "length", as if every prompt token was scored: 0 tokens are
    not fewer than max_tokens 0); scored whole, then cancelled: "length"."""
    from triforce.request import Request
    from triforce.coordinator.batch import SequenceBatch

    target = tiny_dir("serve-target", tokenizer=True, seed=71)
    llm = LLM(target, mode="ar", dtype="float32", prefill_chunk=8)
    ids = llm.tokenizer(PROMPT).input_ids
    for cut_at in (8, None):
        request = Request(llm, ids, SamplingParams(max_tokens=0, prompt_logprobs=0), None)
        batch = SequenceBatch()
        seq = batch.add(request.run())
        while cut_at is not None and request.engine.ladder[-1].length < cut_at:
            assert not batch.step()
        if cut_at is None:
            while not batch.step():
                pass
        request.cancel()
        while cut_at is not None and not batch.step():
            pass
        output = request.output(*seq.result)
        assert output.outputs[0].finish_reason == ("abort" if cut_at else "length")
        assert (len(output.prompt_logprobs) < len(ids)) == bool(cut_at)


def test_triforce_serve_answers_over_http(tiny_dir):
    """The command line end to end: `triforce serve` on a free port, a completion through a real socket.
    The model is given as vLLM's launch lines give it (`vllm serve MODEL`)."""
    import subprocess
    import sys

    import httpx
    from servers import free_port, wait_healthy

    port = free_port()
    target = tiny_dir("serve-target", tokenizer=True, seed=71)
    server = subprocess.Popen([sys.executable, "-m", "triforce", "serve", str(target), "--mode", "ar",
                               "--dtype", "float32", "--port", str(port), "--served-model-name", "tiny"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, server)
        r = httpx.post(f"{url}/v1/completions", json={"model": "tiny", "prompt": PROMPT, "max_tokens": 5}, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 5
        assert httpx.get(f"{url}/v1/nope").json()["error"]["type"] == "not_found_error"
    finally:
        server.terminate()
        out, _ = server.communicate(timeout=30)
    assert "serving tiny" in out


def test_metrics_count_a_request_whose_client_left_while_it_waited_as_aborted(llm):
    """A waiting request whose client went away is counted as vLLM counts it, success{finished_reason=
    "abort"} (it was counted nowhere; and a drain counted it a failure)."""
    from triforce.serve.metrics import ServerMetrics

    job = parse("completion", {"prompt": PROMPT, "max_tokens": 4}, llm, "tiny")
    scheduler = Scheduler(llm)
    scheduler.metrics = ServerMetrics("tiny", scheduler)
    scheduler._admit = lambda: None  # they all wait
    try:
        gone = scheduler.submit_choices(parse("completion", {"prompt": PROMPT, "max_tokens": 4, "n": 2}, llm, "tiny"),
                                        [lambda *_: None] * 2)
        for ticket in gone:
            ticket.cancel()
        scheduler.submit(job, lambda *_: None)  # (the queue, trimmed of the tickets of clients gone)
        assert scheduler.queued == 1
        scheduler.submit(job, lambda *_: None).cancel()
        scheduler.drain()
    finally:
        scheduler.stop()
    text = scheduler.metrics.render().decode()
    assert 'vllm:request_success_total{finished_reason="abort",model_name="tiny"} 3.0' in text
    assert 'triforce:request_failures_total{model_name="tiny"} 1.0' in text


def test_metrics_count_requests_tokens_and_speculation(llm):
    """/metrics in Prometheus' format: after two requests, their tokens, reasons and each tier's checks.
    Before any, every request series is there at 0 (one born at its first event, at 1, gave rate() nothing
    for it: an alert on failures missed each process's first)."""
    with TestClient(create_app(llm, "tiny")) as c:
        fresh = c.get("/metrics").text
        for series in ('triforce:request_failures_total{model_name="tiny"} 0.0',
                       'vllm:request_success_total{finished_reason="abort",model_name="tiny"} 0.0',
                       'vllm:generation_tokens_total{model_name="tiny"} 0.0',
                       'vllm:time_to_first_token_seconds_count{model_name="tiny"} 0.0'):
            assert series in fresh.splitlines(), series
        outs = [c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": n, "temperature": 0,
                                                "ignore_eos": True}).json() for n in (9, 7)]
        text = c.get("/metrics").text
    expected = plain(llm, PROMPT, 9, temperature=0, ignore_eos=True).metrics

    def value(line_start):
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(line_start))

    assert value('vllm:generation_tokens_total{model_name="tiny"}') == 16
    assert value('vllm:prompt_tokens_total{model_name="tiny"}') == 80
    assert value('vllm:request_success_total{finished_reason="length",model_name="tiny"}') == 2
    assert value('vllm:num_requests_waiting{model_name="tiny"}') == 0
    assert value('vllm:time_to_first_token_seconds_count{model_name="tiny"}') == 2
    tier = expected.tiers[-1]  # the target, checking the retrieval tier's tokens
    prefix = f'vllm:spec_decode_num_drafts_total{{drafter="{tier.drafter}",model_name="tiny",tier="{tier.name}"}}'
    assert value(prefix) >= tier.checks > 0
    accepted = value(f'vllm:spec_decode_num_accepted_tokens_total{{drafter="{tier.drafter}",model_name="tiny",'
                     f'tier="{tier.name}"}}')
    per_pos = value('vllm:spec_decode_num_accepted_tokens_per_pos_total{drafter="retrieval"')
    assert accepted == per_pos > 0 and all(o["usage"]["completion_tokens"] for o in outs)


def test_metrics_show_the_bytes_the_prefix_store_holds(tiny_dir):
    """triforce:prefix_cache_bytes: none before a request; after one, what the store holds (its prompt's
    full blocks of 16 tokens)."""
    llm = LLM(tiny_dir("serve-target", tokenizer=True, seed=71), mode="ar", dtype="float32", prefill_chunk=16)
    line = 'triforce:prefix_cache_bytes{model_name="tiny"} '

    def held(text):
        return [float(row[len(line):]) for row in text.splitlines() if row.startswith(line)]

    with TestClient(create_app(llm, "tiny")) as c:
        before = held(c.get("/metrics").text)
        assert c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2, "temperature": 0}).status_code == 200
        after = held(c.get("/metrics").text)
    assert before == [0.0] and after == [float(llm.prefixes.bytes)] and after[0] > 0


def test_a_server_shutting_down_ends_its_requests_and_refuses_new_ones(llm, monkeypatch):
    """Ctrl-C or SIGTERM (launch/serve.py's server calls Scheduler.drain before uvicorn's own shutdown): the
    running request ends after its round with finish_reason "abort" (its stream closes properly), a waiting
    one gets an error, and a new one a 503; uvicorn's server alone waited for every stream to run out."""
    import uvicorn

    from triforce.launch import serve as serve_module
    from triforce.launch.serve import draining_server

    job = parse("completion", {"prompt": PROMPT, "max_tokens": 400, "temperature": 0, "ignore_eos": True,
                               "stream": True}, llm, "tiny")
    scheduler = Scheduler(llm, max_queue=4)
    first, events = threading.Event(), {0: [], 1: []}

    def tell(i):
        return lambda kind, data: (events[i].append((kind, data)), kind == "text" and first.set())

    scheduler.submit(job, tell(0))
    assert first.wait(60)
    monkeypatch.setattr(scheduler, "_admit", lambda: None)  # the next one waits
    scheduler.submit(job, tell(1))
    app = create_app(llm, "tiny")
    app.state.scheduler.stop()  # its own, which this test does not use
    app.state.scheduler = scheduler
    exits = []
    monkeypatch.setattr(uvicorn.Server, "handle_exit", lambda self, sig, frame: exits.append(sig))
    monkeypatch.setattr(serve_module, "ABORT_AFTER_S", 0.0)  # (the running one: aborted at once)
    draining_server(uvicorn)(uvicorn.Config(app)).handle_exit(2, None)  # outside an event loop: at once
    assert exits == [2]
    with pytest.raises(ApiError) as refused:
        scheduler.submit(job, lambda *_: None)
    assert refused.value.status == 503 and "shutting down" in refused.value.message
    deadline = time.time() + 60
    while not any(kind == "done" for kind, _ in events[0]) and time.time() < deadline:
        time.sleep(0.05)
    done = [data for kind, data in events[0] if kind == "done"]
    assert done and done[0].finish_reason == "abort" and len(done[0].token_ids) < 400
    [(kind, error)] = events[1]
    assert kind == "error" and (error.status, error.message) == (503, "the server is shutting down")
    scheduler.stop()


def running_stream(llm, max_tokens: int):
    """A streamed completion of `max_tokens` running in a Scheduler of its own, its first text out:
    (the job, the scheduler, the events its client was told)."""
    job = parse("completion", {"prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                               "stream": True}, llm, "tiny")
    scheduler = Scheduler(llm, max_queue=4)
    first, events = threading.Event(), []
    scheduler.submit(job, lambda kind, data: (events.append((kind, data)), kind == "text" and first.set()))
    assert first.wait(60)
    return job, scheduler, events


def told(events: list, kind: str):
    """The one event of `kind` a client is told, waited for (a minute at most)."""
    deadline = time.time() + 60
    while not any(k == kind for k, _ in events) and time.time() < deadline:
        time.sleep(0.05)
    [data] = [data for k, data in events if k == kind]
    return data


def test_a_step_that_fails_tells_its_requests_though_a_close_fails_too_and_stop_tells_the_rest(llm, monkeypatch):
    """A step's failure ended every running request; a run's close that raised then lost them all (removed
    from `running`, never told: their clients waited until their streams were cut). stop() without a drain
    (an app embedded, a test client leaving) left waiting requests unanswered."""
    job, scheduler, events = running_stream(llm, 400)

    class ClosingFails:  # a run whose close raises (its real one closed here, its caches freed)
        def __init__(self, run):
            run.close()

        def close(self):
            raise ZeroDivisionError

    def failing_step():
        for seq in scheduler._batch.active:
            seq.run = ClosingFails(seq.run)
        raise RuntimeError("a forward failed")

    monkeypatch.setattr(scheduler._batch, "step", failing_step)
    error = told(events, "error")
    assert error.status == 500 and "a forward failed" in error.message and scheduler.alive
    monkeypatch.setattr(scheduler, "_admit", lambda: None)  # the next one waits
    left = []
    scheduler.submit(job, lambda kind, data: left.append((kind, data)))
    scheduler.stop()
    [(kind, stopped)] = left
    assert kind == "error" and (stopped.status, stopped.message) == (503, "the server stopped")


def test_a_drain_lets_running_requests_end_whole_within_its_abort_delay(llm):
    """As vLLM lets requests run out its shutdown's grace: a running request that ends within the drain's
    delay is answered whole (every running one was cut at once, a 200 of partial text), while a new one
    is refused at once."""
    job, scheduler, events = running_stream(llm, 30)
    scheduler.drain(abort_after_s=60)
    with pytest.raises(ApiError, match="shutting down"):
        scheduler.submit(job, lambda *_: None)
    done = told(events, "done")
    assert done.finish_reason == "length" and len(done.token_ids) == 30
    scheduler.stop()


def test_a_request_admitted_while_the_server_drains_is_ended_too(llm, monkeypatch):
    """drain() between a request leaving the queue and joining the batch (it is in neither list then): the
    request still ends early, "abort", rather than run to max_tokens behind a closed server."""
    from triforce.serve import scheduler as scheduling

    job = parse("completion", {"prompt": PROMPT, "max_tokens": 400, "temperature": 0, "ignore_eos": True}, llm,
                "tiny")
    held = Scheduler(llm)
    real = scheduling.Request

    def allocated_during_the_drain(*args, **kwargs):
        request = real(*args, **kwargs)
        held.drain()
        return request

    monkeypatch.setattr(scheduling, "Request", allocated_during_the_drain)
    done = threading.Event()
    seen = []
    held.submit(job, lambda kind, data: (seen.append((kind, data)), kind == "done" and done.set()))
    assert done.wait(60)
    held.stop()
    assert seen[-1][1].finish_reason == "abort" and len(seen[-1][1].token_ids) < 400


def test_a_worker_group_that_stops_answering_stops_the_server(llm, monkeypatch):
    """A hung worker failed the requests in flight, then the server stayed up saying ok at /health and failing
    every request; now its scheduler stops for good, says why and ends the server (torchrun ends the group)."""
    from triforce.coordinator.batch import SequenceBatch
    from triforce.coordinator.channel import WorkerError

    def group_gone(self):
        monkeypatch.setattr(llm, "workers", SimpleNamespace(broken=True))  # as ControlChannel marks itself
        raise WorkerError("the worker group at tcp://x failed 'verify': it did not answer within 30 s")

    monkeypatch.setattr(SequenceBatch, "step", group_gone)
    fatal, seen, done = [], [], threading.Event()
    scheduler = Scheduler(llm, on_fatal=fatal.append)
    job = parse("completion", {"prompt": PROMPT, "max_tokens": 8, "temperature": 0}, llm, "tiny")
    scheduler.submit(job, lambda kind, data: (seen.append((kind, data.status)), done.set()))
    assert done.wait(60) and seen == [("error", 503)]  # the server's failure, not the request's (400)
    scheduler._thread.join(10)
    assert fatal and isinstance(fatal[0], WorkerError) and not scheduler.alive
    with pytest.raises(ApiError, match="did not answer") as refused:
        scheduler.submit(job, lambda *_: None)
    assert refused.value.status == 503
    client = TestClient(create_app(llm, "tiny"))
    client.app.state.scheduler._stop_for_good(fatal[0])
    health = client.get("/health")
    assert health.status_code == 503 and "did not answer" in health.json()["error"]["message"]
    client.app.state.scheduler.stop()


def test_a_group_lost_as_a_request_is_admitted_runs_no_step_over_the_closed_ones(llm, monkeypatch):
    """The group is lost as the second of two choices builds its Request: every request is told and its run
    closed, and the batch, which still held the first, ran one more step over it (its forwards, and a
    request to the dead group)."""
    import triforce.serve.scheduler as scheduler_module
    from triforce.coordinator.channel import WorkerError
    from triforce.request import Request

    built, steps_after_loss = [], []

    def request(*args, **kwargs):
        built.append(1)
        if len(built) == 2:
            monkeypatch.setattr(llm, "workers", SimpleNamespace(broken=True))  # as ControlChannel marks itself
            raise WorkerError("the worker group at tcp://x failed 'start': it did not answer within 30 s")
        return Request(*args, **kwargs)

    step = SequenceBatch.step
    monkeypatch.setattr(scheduler_module, "Request", request)
    monkeypatch.setattr(SequenceBatch, "step", lambda self: (steps_after_loss.append(scheduler.fatal is not None),
                                                             step(self))[1])
    fatal, seen, told = [], [], threading.Semaphore(0)
    scheduler = Scheduler(llm, on_fatal=fatal.append)
    two = parse("completion", {"prompt": [PROMPT, PROMPT], "max_tokens": 4, "temperature": 0}, llm, "tiny")
    scheduler.submit_choices(two, [lambda kind, data: (seen.append(kind), told.release())] * 2)
    assert told.acquire(timeout=30) and told.acquire(timeout=30) and seen == ["error", "error"]
    scheduler._thread.join(10)
    assert fatal and not scheduler.alive and len(built) == 2 and True not in steps_after_loss


def test_a_failure_of_the_schedulers_own_work_ends_every_request_and_the_server(llm, monkeypatch):
    """The scheduler's thread failed outside any one request (free_memory on a device a sticky CUDA error
    broke): the thread died and every request queued stayed waiting, the server up. Now each gets an error
    and the server ends (on_fatal). A failure counting a request's metrics is logged, its answer sent."""
    class BrokenMetrics:
        def finished(self, *args):
            raise RuntimeError("a metrics backend that failed")

    fatal, seen, told = [], [], threading.Semaphore(0)
    scheduler = Scheduler(llm, metrics=BrokenMetrics(), on_fatal=fatal.append)
    job = parse("completion", {"prompt": PROMPT, "max_tokens": 2, "temperature": 0}, llm, "tiny")
    scheduler.submit(job, lambda kind, data: (seen.append(kind), told.release()))
    assert told.acquire(timeout=30) and seen == ["done"] and scheduler.alive
    free = llm.free_memory

    def broken_device():
        if threading.current_thread().name == "triforce-scheduler" and scheduler.waiting:  # as it admits them
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return free()

    monkeypatch.setattr(llm, "free_memory", broken_device)
    two = parse("completion", {"prompt": [PROMPT, PROMPT], "max_tokens": 2, "temperature": 0}, llm, "tiny")
    scheduler.submit_choices(two, [lambda kind, data: (seen.append((kind, data.status)), told.release())] * 2)
    assert told.acquire(timeout=30) and told.acquire(timeout=30), seen
    assert seen[1:] == [("error", 500)] * 2
    scheduler._thread.join(10)
    assert fatal and "illegal memory access" in str(fatal[0]) and not scheduler.alive


def test_a_request_submitted_as_the_group_is_lost_is_refused_not_left_waiting(llm, monkeypatch):
    """The group is lost between a submit's first check and its queueing: the loss empties the queue and
    tells what it held, so a request queued after it would wait forever; it gets the 503 instead. And a
    request of more choices than the queue holds is refused before its choices are built (2,048 prompts x
    n 128 took seconds on the event loop)."""
    from triforce.coordinator.channel import WorkerError

    scheduler = Scheduler(llm)
    job = parse("completion", {"prompt": PROMPT, "max_tokens": 8, "temperature": 0}, llm, "tiny")
    sizing = llm.cache_bytes_for

    def lost_while_sizing(*args):  # the scheduler's thread meets the loss meanwhile
        if scheduler.fatal is None:
            scheduler._stop_for_good(WorkerError("the worker group at tcp://x did not answer"))
        return sizing(*args)

    monkeypatch.setattr(llm, "cache_bytes_for", lost_while_sizing)
    with pytest.raises(ApiError, match="did not answer") as refused:
        scheduler.submit(job, lambda *_: None)
    assert refused.value.status == 503 and not scheduler.waiting
    scheduler.stop()
    monkeypatch.undo()
    many = parse("completion", {"prompt": [PROMPT] * 8, "max_tokens": 4, "n": 16}, llm, "tiny")
    monkeypatch.setattr(type(many), "choices", lambda self: pytest.fail("choices built for a refused request"))
    scheduler = Scheduler(llm, max_queue=64)
    with pytest.raises(ApiError, match="128 choices") as refused:
        scheduler.submit_choices(many, [lambda *_: None] * 128)
    assert refused.value.status == 400
    scheduler.stop()


def test_requests_a_lost_group_ends_are_counted_as_failures(llm, monkeypatch):
    """The requests waiting or running when the worker group is lost are told 503, and counted among the
    failures (/metrics) and closed, as any failed request is (they were told only)."""
    from triforce.coordinator.channel import WorkerError

    failed, told = [], []
    monkeypatch.setattr(Scheduler, "_admit", lambda self: None)  # they wait (patched before its thread starts)
    scheduler = Scheduler(llm, metrics=SimpleNamespace(failed=lambda: failed.append(1)))
    job = parse("completion", {"prompt": PROMPT, "max_tokens": 4, "n": 2}, llm, "tiny")
    scheduler.submit_choices(job, [lambda kind, data: told.append((kind, data.status))] * 2)
    scheduler._stop_for_good(WorkerError("the worker group at tcp://x did not answer"))
    assert told == [("error", 503)] * 2 and len(failed) == 2
    scheduler.stop()


def test_time_to_first_token_counts_building_the_caches(llm, monkeypatch):
    """A request's wait is counted up to its run, whose prefill clock starts there: allocating its caches
    (seconds for a long context on a CPU; a worker group's sequence too) fell in neither."""
    import threading

    import triforce.serve.scheduler as scheduler_module

    class SlowToBuild(scheduler_module.Request):
        def __init__(self, *args, **kwargs):
            time.sleep(0.3)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(scheduler_module, "Request", SlowToBuild)
    waits, done = [], threading.Event()
    metrics = SimpleNamespace(finished=lambda reason, m, queued_s, *_: waits.append(queued_s), failed=lambda: None)
    scheduler = Scheduler(llm, metrics=metrics)
    job = parse("completion", {"prompt": PROMPT, "max_tokens": 2}, llm, "tiny")
    scheduler.submit(job, lambda kind, data: done.set() if kind in ("done", "error") else None)
    assert done.wait(60) and waits and waits[0] >= 0.3
    scheduler.stop()


def test_a_failure_is_told_as_whose_it_is():
    """A request its own settings failed as it ran is a 400 (413: caches too large), the worker group's
    failure a 503 and anything else a 500, though some of those are UserErrors too (a cache that ran out of
    room is a bug)."""
    from triforce.cache.base import CacheCapacityError
    from triforce.coordinator.channel import WorkerError
    from triforce.errors import TooLarge
    from triforce.serve.tickets import failure
    from triforce.speculation.rules import RulesContradict

    for exc, status in ((RulesContradict("x"), 400), (TooLarge("x"), 413), (WorkerError("x"), 503),
                        (CacheCapacityError("x"), 500), (RuntimeError("x"), 500)):
        assert failure(exc).status == status, exc


def test_a_seeded_server_repeats_the_samples_of_unseeded_requests(tiny_dir):
    """vLLM's --seed: requests without a seed draw theirs from the LLM's, so a server started again with
    the same seed answers the same requests the same way (and another seed otherwise)."""
    target = tiny_dir("serve-target", tokenizer=True, seed=71)
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 8, "temperature": 1.0, "ignore_eos": True, "n": 2}
    answers = []
    for seed in (5, 5, 6):
        with TestClient(create_app(LLM(target, mode="ar", dtype="float32", seed=seed), "tiny")) as c:
            answers.append([choice["text"] for choice in c.post("/v1/completions", json=body).json()["choices"]])
    assert answers[0] == answers[1] != answers[2] and answers[0][0] != answers[0][1]


def test_the_scheduler_hands_freed_memory_back_as_requests_finish(llm, monkeypatch):
    """glibc keeps freed heap blocks for reuse: a soak of the server grew to 4.8 GiB in 20 minutes and kept
    it when idle. Requests' caches, once they finish, go back to the system (malloc_trim, at most once a
    second: memory.release_freed)."""
    import platform

    from triforce import memory
    from triforce.serve import admission

    if platform.libc_ver()[0] == "glibc":
        assert memory._libc() is not None  # the call is there where the heaps keep what is freed
    memory.release_freed()  # and returns (a no-op without glibc)
    calls = []
    monkeypatch.setattr(memory, "_libc", lambda: type("Libc", (), {"malloc_trim": lambda self, pad: calls.append(pad)})())
    monkeypatch.setattr(memory, "_released", [0.0])
    memory.release_freed(), memory.release_freed()
    assert calls == [0]  # once a second at most
    trims = []
    monkeypatch.setattr(admission, "release_freed", lambda every_s=None: trims.append(every_s))
    with TestClient(create_app(llm, "tiny")) as c:
        for _ in range(2):
            r = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 3})
            assert r.status_code == 200
            time.sleep(0.5)  # the scheduler goes idle
    assert trims == [None, 0, None, 0]  # as each finished (rate-bound), and once idle (always)
