"""OpenAI's Responses API (serve/responses.py) through the `openai` client: a response is the chat
answer to its instructions and input, whole and streamed as Response events; text.format constrains it as
response_format does; function tools answer function_call items; a conversation's call items reach the
chat template; what the server cannot do is a 400 that names the field."""
import json

import httpx
import pytest

from servers import Server, chars_llm
from triforce.serve.app import create_app

PARAMETERS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer"}},
              "required": ["city", "days"], "additionalProperties": False}
TOOL = {"type": "function", "name": "get_weather", "description": "today's weather", "parameters": PARAMETERS}
CHAT_TOOL = {"type": "function", "function": {k: TOOL[k] for k in ("name", "description", "parameters")}}


@pytest.fixture(scope="module")
def server(tiny_dir):
    llm = chars_llm(tiny_dir)
    served = Server(create_app(llm, "tiny"))
    yield served
    served.close()


def chat(server, **body) -> dict:
    r = httpx.post(f"{server.url}/v1/chat/completions", json={"model": "tiny", "temperature": 0, **body}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def streamed(client, **fields) -> list:
    return list(client.responses.create(model="tiny", temperature=0, stream=True, **fields))


def test_a_response_is_the_chat_answer_to_its_instructions_and_input(server):
    client = server.client()
    expected = chat(server, messages=[{"role": "system", "content": "be brief"},
                                      {"role": "user", "content": "what is the weather?"}], max_tokens=5)
    r = client.responses.create(model="tiny", instructions="be brief", input="what is the weather?",
                                max_output_tokens=5, temperature=0)
    assert r.output_text == expected["choices"][0]["message"]["content"] and r.object == "response"
    assert expected["choices"][0]["finish_reason"] == "length" and r.status == "incomplete"
    assert r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.input_tokens == expected["usage"]["prompt_tokens"]
    assert r.usage.output_tokens == expected["usage"]["completion_tokens"]
    assert r.instructions == "be brief" and r.max_output_tokens == 5
    assert r.output[0].status == "incomplete" and r.tool_choice == "none"  # as the response is; no tools ran
    events = streamed(client, instructions="be brief", input="what is the weather?", max_output_tokens=5)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events[:4]] == ["response.created", "response.in_progress", "response.output_item.added",
                                            "response.content_part.added"]
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == r.output_text == events[-1].response.output_text
    assert events[-1].type == f"response.{r.status}" and events[-1].response.usage.input_tokens == r.usage.input_tokens
    assert [e.item.status for e in events if e.type == "response.output_item.done"] == ["incomplete"]


def test_text_format_constrains_the_answer_as_response_format_does(server):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    expected = chat(server, messages=[{"role": "user", "content": "fine?"}], max_tokens=40,
                    response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}})
    r = server.client().responses.create(model="tiny", input="fine?", max_output_tokens=40, temperature=0,
                                         text={"format": {"type": "json_schema", "name": "answer", "schema": schema}})
    assert r.status == "completed" and r.output_text == expected["choices"][0]["message"]["content"] and json.loads(r.output_text)["ok"] in (
        True, False)


def test_a_named_function_tool_answers_a_function_call_item(server):
    client = server.client()
    question = "what is the weather in paris for 3 days?"
    expected = chat(server, messages=[{"role": "user", "content": question}], max_tokens=120, tools=[CHAT_TOOL],
                    tool_choice={"type": "function", "function": {"name": "get_weather"}})
    arguments = expected["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    fields = dict(input=question, max_output_tokens=120, tools=[TOOL],
                  tool_choice={"type": "function", "name": "get_weather"})
    r = client.responses.create(model="tiny", temperature=0, **fields)
    call, = r.output
    assert call.type == "function_call" and call.name == "get_weather" and call.arguments == arguments
    assert set(json.loads(call.arguments)) == {"city", "days"} and r.tools[0].name == "get_weather"
    events = streamed(client, **fields)
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [(i.type, i.name, i.arguments) for i in done] == [("function_call", "get_weather", arguments)]
    assert events[-1].response.output[0].call_id == done[0].call_id
    # arguments cut by max_output_tokens: the call item is incomplete, as its response is (it said completed)
    cut = client.responses.create(model="tiny", temperature=0, **{**fields, "max_output_tokens": 5})
    assert cut.status == "incomplete" and [(i.type, i.status) for i in cut.output] == [("function_call", "incomplete")]
    events = streamed(client, **{**fields, "max_output_tokens": 5})
    assert [e.item.status for e in events if e.type == "response.output_item.done"] == ["incomplete"]


@pytest.mark.parametrize("output", ["sunny", [{"type": "input_text", "text": "sun"}, {"type": "input_text", "text": "ny"}]])
def test_a_conversations_call_items_reach_the_template_as_chat_messages(server, output):
    """function_call and function_call_output items are the assistant's tool_calls and a tool message:
    the prompt counts what the chat request with those messages counts. An output of text parts (OpenAI's
    newer shape) is their text (the model read the parts' JSON)."""
    call = {"name": "get_weather", "arguments": '{"city": "bath", "days": 1}'}
    items = [{"role": "user", "content": [{"type": "input_text", "text": "weather in bath?"}]},
             {"type": "function_call", "call_id": "call_1", **call},
             {"type": "function_call_output", "call_id": "call_1", "output": output}]
    messages = [{"role": "user", "content": "weather in bath?"},
                {"role": "assistant", "content": None,
                 "tool_calls": [{"id": "call_1", "type": "function", "function": call}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    expected = chat(server, messages=messages, max_tokens=8, tools=[CHAT_TOOL], tool_choice="none")
    r = server.client().responses.create(model="tiny", input=items, max_output_tokens=8, temperature=0,
                                         tools=[TOOL], tool_choice="none")
    assert r.usage.input_tokens == expected["usage"]["prompt_tokens"]
    assert r.output_text == expected["choices"][0]["message"]["content"]


@pytest.mark.parametrize("body,param", [
    ({"input": "hi", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": "hi", "store": True}, "store"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools"),
    ({"input": "hi", "tools": 5}, "tools"),
    ({"input": "hi", "tool_choice": "required"}, "tool_choice"),  # no tools: answered free text
    ({"input": "hi", "tools": [TOOL], "tool_choice": {"type": "function", "name": ["get_weather"]}}, "tool_choice"),
    ({"input": 5}, "input"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": [{"type": "input_image"}]}]}, "input"),
    ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "hi", "text": {"format": {"type": "xml"}}}, "text"),
    ({"input": "hi", "model": "gpt-5"}, "model"),
])
def test_what_the_server_cannot_do_is_a_400_naming_the_field(server, body, param):
    r = httpx.post(f"{server.url}/v1/responses", json=body, timeout=60)
    assert r.status_code in (400, 404) and r.json()["error"]["param"] == param, r.text


@pytest.mark.parametrize("tools", [None, []])
def test_auto_without_tools_is_a_free_text_answer(server, tools):
    """tool_choice auto is the Responses API's default, so clients send it without tools."""
    body = {"input": "hi", "tool_choice": "auto", "max_output_tokens": 4, **({} if tools is None else {"tools": tools})}
    r = httpx.post(f"{server.url}/v1/responses", json=body, timeout=60)
    assert r.status_code == 200 and r.json()["status"] in ("completed", "incomplete"), r.text
    if tools == []:  # and "required" with an empty list: free text, as chat answers it (a 400 before)
        r = httpx.post(f"{server.url}/v1/responses", json={**body, "tool_choice": "required"}, timeout=60)
        assert r.status_code == 200 and r.json()["output"][0]["type"] == "message", r.text


def test_a_response_ended_before_its_limit_is_incomplete_and_says_why(tiny_dir):
    """A request a shutdown ended (finish_reason "abort") is an incomplete response, "interrupted"; it was
    reported "completed", with its text cut short."""
    import dataclasses

    from triforce.serve import responses

    llm = chars_llm(tiny_dir)
    job = responses.parse({"input": "what is the weather?", "max_output_tokens": 5, "temperature": 0}, llm, "tiny")
    out = llm.generate(job.prompts[0], job.params)[0]
    def ended_by(reason):
        return dataclasses.replace(out, outputs=[dataclasses.replace(out.outputs[0], finish_reason=reason)])

    ended = responses.response(job, "tiny", [ended_by("abort")])
    assert ended["status"] == "incomplete" and ended["incomplete_details"] == {"reason": "interrupted"}
    whole = responses.response(job, "tiny", [ended_by("stop")])
    assert whole["status"] == "completed" and whole["incomplete_details"] is None


def test_an_empty_answer_is_an_empty_message_not_no_output(tiny_dir):
    """An answer that ends at once (EOS first) is a message with empty text, streamed or not: it was a
    Response with no output at all, and the suite's tiny model drew one now and then."""
    import asyncio
    import dataclasses

    from triforce.serve import responses

    llm = chars_llm(tiny_dir)
    job = responses.parse({"input": "hi", "max_output_tokens": 3, "temperature": 0}, llm, "tiny")
    out = llm.generate(job.prompts[0], job.params)[0]
    empty = dataclasses.replace(out, outputs=[dataclasses.replace(out.outputs[0], text="", token_ids=[],
                                                                  finish_reason="stop")])
    whole = responses.response(job, "tiny", [empty])
    assert [(item["type"], item["content"][0]["text"]) for item in whole["output"]] == [("message", "")], whole

    async def chunks():
        yield {"choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]}
        yield {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
        yield "[DONE]"

    async def streamed():
        return [event async for event in responses.events(job, "tiny", chunks())]

    events = asyncio.run(streamed())
    kinds = [event["type"] for event in events]
    assert kinds[2:] == ["response.output_item.added", "response.content_part.added", "response.output_text.done",
                         "response.content_part.done", "response.output_item.done", "response.completed"], kinds
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == ""


def test_only_a_call_max_output_tokens_may_have_cut_is_incomplete():
    """An incomplete response's function calls: under auto each came whole from a closed block, and of a
    required list only the last may be cut (every one was marked incomplete)."""
    from types import SimpleNamespace

    from triforce.serve.responses import _call_items

    calls = [{"id": f"c{i}", "function": {"name": "f", "arguments": "{}"}} for i in range(2)]
    for choice, statuses in (("auto", ["completed", "completed"]), ("required", ["completed", "incomplete"]),
                             ("function", ["completed", "incomplete"])):
        job = SimpleNamespace(tools=SimpleNamespace(choice=choice))
        assert [item["status"] for item in _call_items(job, calls, "length")] == statuses
        assert {item["status"] for item in _call_items(job, calls, "stop")} == {"completed"}


def test_metadata_and_user_of_their_types_are_taken_and_metadata_echoed(server):
    """OpenAI's metadata (a map of strings, echoed in the Response) and user (a string); other types are 400s
    (test_server.py: they were taken, and a metadata of "x" echoed back)."""
    body = {"input": "hi", "max_output_tokens": 4, "metadata": {"run": "7"}, "user": "u-1"}
    r = httpx.post(f"{server.url}/v1/responses", json=body, timeout=60)
    assert r.status_code == 200 and r.json()["metadata"] == {"run": "7"}, r.text
