"""Tool calls (serve/constraints.py): tool_choice naming a function or "required" constrains the answer to the
calls' JSON (structured outputs) and answers tool_calls, whole, streamed and through the `openai` client;
"auto" parses Hermes <tool_call> blocks where the chat template writes them; the tools reach the
template; malformed tools are 400s that name the field."""
import json

import pytest
from fastapi.testclient import TestClient

from servers import TOOLS_TEMPLATE as TEMPLATE, Server, chars_llm
from triforce import SamplingParams
from triforce.chat import chat_ids, template_messages
from triforce.sampling_params import StructuredOutputs
from triforce.serve.app import create_app
from triforce.serve.constraints import ConstraintError, StreamedContent, ToolPlan

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "today's weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer"}},
    "required": ["city", "days"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}}, "required": ["zone"],
    "additionalProperties": False}}}
TOOLS = [WEATHER, TIME]
MESSAGES = [{"role": "user", "content": "what is the weather in paris for 3 days?"}]


@pytest.fixture(scope="module")
def llm(tiny_dir):
    return chars_llm(tiny_dir)


@pytest.fixture
def client(llm):
    with TestClient(create_app(llm, "tiny")) as c:
        yield c


def ask(client, **fields):
    r = client.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 120, "temperature": 0,
                                                  "tools": TOOLS, **fields})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def test_a_named_tool_choice_answers_a_call_of_it_with_arguments_that_fit(llm, client):
    choice = ask(client, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    call, = choice["message"]["tool_calls"]
    assert choice["finish_reason"] == "stop" and choice["message"]["content"] is None  # named: as OpenAI's
    assert call["type"] == "function" and call["id"].startswith("call_") and call["function"]["name"] == "get_weather"
    arguments = json.loads(call["function"]["arguments"])
    assert set(arguments) == {"city", "days"} and isinstance(arguments["days"], int)
    # what the engine gives for the template's prompt with the tools, under the parameters' schema
    prompt = chat_ids(llm.tokenizer, MESSAGES, TOOLS)
    assert llm.tokenizer.decode(prompt).startswith("tools: get_weather get_time. user:")
    spec = StructuredOutputs(json=WEATHER["function"]["parameters"])
    assert call["function"]["arguments"] == llm.generate(prompt, SamplingParams(
        max_tokens=120, temperature=0, structured_outputs=spec))[0].text


def test_required_answers_one_or_more_calls_of_the_tools(client):
    choice = ask(client, tool_choice="required")
    calls = choice["message"]["tool_calls"]
    assert calls and all(c["function"]["name"] in ("get_weather", "get_time") for c in calls)
    for c in calls:
        json.loads(c["function"]["arguments"])
    assert choice["finish_reason"] in ("tool_calls", "length")
    plan = ToolPlan.parse({"tools": TOOLS, "tool_choice": "required"}, None)
    whole = '[{"name": "get_time", "arguments": {"zone": "cet"}}, {"name": "get_weather", "arguments": {}}]'
    message, finish = plan.message(whole, "stop")
    assert finish == "tool_calls" and [c["function"]["name"] for c in message["tool_calls"]] == [
        "get_time", "get_weather"]
    message, finish = plan.message(whole[:-20], "length")  # cut short: its whole calls
    assert finish == "length" and [c["function"]["name"] for c in message["tool_calls"]] == ["get_time"]
    # cut within its first call: that call's name and arguments so far (they came back as content, the
    # list's raw JSON); cut before any name: no call and no content
    for cut, calls in ((40, [("get_time", '{"zon')]), (9, [])):
        message, finish = plan.message(whole[:cut], "length")
        assert message["content"] is None and finish == "length"
        assert [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]] == calls
    one = {"messages": MESSAGES, "temperature": 0, "tools": TOOLS, "tool_choice": "required",
           "parallel_tool_calls": False}
    whole = client.post("/v1/chat/completions", json={**one, "max_tokens": 120}).json()
    assert whole["choices"][0]["finish_reason"] == "tool_calls"
    for stream in (False, True):  # through the server, whole and streamed: the one call cut within its arguments
        r = client.post("/v1/chat/completions", json={
            **one, "max_tokens": whole["usage"]["completion_tokens"] - 3, "stream": stream})
        if stream:
            deltas = [json.loads(line[6:])["choices"][0] for line in r.text.split("\n") if line.startswith("data: {")]
            message, finish = deltas[0]["delta"], deltas[-1]["finish_reason"]
        else:
            message, finish = r.json()["choices"][0]["message"], r.json()["choices"][0]["finish_reason"]
        assert finish == "length" and message["content"] is None and message["tool_calls"], message


def test_required_keeps_each_tools_definitions_and_parallel_false_allows_one_call(llm):
    """A tool whose parameters refer to their own $defs (as pydantic writes them) still compiles inside
    the list of calls; parallel_tool_calls false makes the list one call long."""
    located = {"type": "function", "function": {"name": "locate", "parameters": {
        "type": "object", "properties": {"where": {"$ref": "#/$defs/Place"}}, "required": ["where"],
        "$defs": {"Place": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}}}
    plan = ToolPlan.parse({"tools": [located, WEATHER], "tool_choice": "required",
                           "parallel_tool_calls": False}, None)
    spec = plan.constraint
    llm.grammars.check(spec)  # would fail: Pointer '/$defs/Place' does not exist
    schema = json.loads(spec.json)
    assert schema["maxItems"] == 1 and set(schema["$defs"]) == {"locate__Place"}
    guide = llm.grammars.guide(spec)
    text = '[{"name": "locate", "arguments": {"where": {"city": "bath"}}}]'
    assert guide.allowed(llm.tokenizer.encode(text)) is not None
    assert guide.allowed(llm.tokenizer.encode(text[:-1] + ', {"name"')) is None  # no second call


def test_required_keeps_a_property_named_definitions_and_named_templates_write_calls():
    """Only the root's $defs move into the list of calls: a parameter named `definitions` (or `$defs`) was
    dropped from every level, so any value passed for it. And a tokenizer's named templates (transformers'
    dict: Hermes-3's default and tool_use) are read for <tool_call>, where `in` read their names only."""
    glossary = {"type": "function", "function": {"name": "gloss", "parameters": {
        "type": "object", "properties": {"definitions": {"type": "array", "items": {"type": "string"}}},
        "required": ["definitions"], "additionalProperties": False}}}
    schema = json.loads(ToolPlan.parse({"tools": [glossary], "tool_choice": "required"}, None).constraint.json)
    arguments = schema["items"]["anyOf"][0]["properties"]["arguments"]
    assert arguments["properties"]["definitions"] == {"type": "array", "items": {"type": "string"}}
    named = {"default": "{{ messages }}", "tool_use": "{% for t in tools %}<tool_call>{% endfor %}"}
    assert ToolPlan.parse({"tools": TOOLS}, named).hermes and not ToolPlan.parse({"tools": TOOLS}, "plain").hermes
    unused = {"default": "{{ messages }}", "rag": "<tool_call>"}  # transformers renders tools with default here
    assert not ToolPlan.parse({"tools": TOOLS}, unused).hermes


def test_none_and_auto_without_a_call_format_answer_content(llm, client):
    for choice_field in ({"tool_choice": "none"}, {}):
        choice = ask(client, **choice_field)
        assert choice["message"]["content"] and "tool_calls" not in choice["message"]
        assert choice["finish_reason"] in ("stop", "length")


def test_a_streamed_call_comes_whole_before_its_end(client):
    r = client.post("/v1/chat/completions", json={
        "messages": MESSAGES, "max_tokens": 60, "temperature": 0, "tools": TOOLS, "stream": True,
        "tool_choice": {"type": "function", "function": {"name": "get_time"}}})
    chunks = [json.loads(line[6:]) for line in r.text.split("\n") if line.startswith("data: {")]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0]["role"] == "assistant" and deltas[0]["tool_calls"][0]["index"] == 0
    assert json.loads(deltas[0]["tool_calls"][0]["function"]["arguments"])["zone"] in ("utc", "cet")
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    r = client.post("/v1/chat/completions", json={  # a required list of calls: none of it is content
        "messages": MESSAGES, "max_tokens": 120, "temperature": 0, "tools": TOOLS, "stream": True,
        "tool_choice": "required"})
    deltas = [json.loads(line[6:])["choices"][0]["delta"] for line in r.text.split("\n") if line.startswith("data: {")]
    assert not any(d.get("content") for d in deltas) and deltas[0]["tool_calls"]


def test_a_conversation_with_earlier_calls_and_their_results_is_taken(llm, client):
    history = MESSAGES + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "paris", "days": 3}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    r = client.post("/v1/chat/completions", json={"messages": history, "max_tokens": 8, "tools": TOOLS})
    assert r.status_code == 200, r.text
    rendered = template_messages(history)
    assert rendered[1]["tool_calls"][0]["function"]["arguments"] == {"city": "paris", "days": 3}
    assert rendered[2]["tool_call_id"] == "call_1"
    text = llm.tokenizer.decode(chat_ids(llm.tokenizer, rendered, TOOLS))  # what the template made of them
    assert text.endswith('assistant: get_weather{"city": "paris", "days": 3}. tool: sunny. >')
    template, llm.tokenizer.chat_template = llm.tokenizer.chat_template, "{% for m in messages %}{{ m['role'] + ': ' + " \
        "m['content'] + '. ' }}{% endfor %}"  # adds strings to the content, as SmolLM2's does
    try:
        assert llm.tokenizer.decode(chat_ids(llm.tokenizer, rendered)).endswith("assistant: . tool: sunny. ")
    finally:
        llm.tokenizer.chat_template = template


@pytest.mark.parametrize("fields,param", [
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools"),
    ({"tools": [{"type": "retrieval"}]}, "tools"),
    ({"tools": [WEATHER, WEATHER]}, "tools"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "missing"}}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": ["get_time"]}}}, "tool_choice"),  # a 500
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "$defs": None}}}],
      "tool_choice": "required"}, "tools"),  # a 500
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {  # "#": the list of calls, nested
        "type": "object", "properties": {"next": {"$ref": "#"}}}}}], "tool_choice": "required"}, "tools"),
    ({"tools": TOOLS, "guided_json": "[" * 100000}, "guided_json"),  # a RecursionError: a 500
    ({"tools": TOOLS, "parallel_tool_calls": 0}, "parallel_tool_calls"),  # 0 == False: it allowed parallel calls
    ({"parallel_tool_calls": "x"}, "parallel_tool_calls"),  # without tools: taken, and echoed by /v1/responses
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
])
def test_bad_tools_get_a_400_naming_the_field(client, fields, param):
    r = client.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 8, **fields})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_tool_parameters_of_null_are_a_function_of_no_arguments_and_deep_text_is_no_call():
    """vLLM's FunctionDefinition.parameters is optional, null too (a 400 here); an answer nested past the
    JSON decoder's depth raised RecursionError out of the parse (a 500 after the whole generation)."""
    bare = {"type": "function", "function": {"name": "now"}}
    null = {"type": "function", "function": {"name": "now", "parameters": None}}
    assert ToolPlan.parse({"tools": [null]}, None).tools == ToolPlan.parse({"tools": [bare]}, None).tools
    empty = {"type": "function", "function": {"name": "now", "parameters": {}}}  # {}: any JSON value to a grammar
    assert ToolPlan.parse({"tools": [empty]}, None).tools == ToolPlan.parse({"tools": [bare]}, None).tools
    plan = ToolPlan.parse({"tools": TOOLS}, "... {# <tool_call> #} ...")
    deep = "<tool_call>\n" + "[" * 5000 + "\n</tool_call>"
    assert plan.message(deep, "stop") == ({"role": "assistant", "content": deep}, "stop")
    required = ToolPlan.parse({"tools": TOOLS, "tool_choice": "required"}, None)
    assert required.message("[" + "[" * 5000, "length")[0]["tool_calls"] == []


def test_auto_with_a_hermes_template_parses_its_blocks():
    plan = ToolPlan.parse({"tools": TOOLS}, "... {# <tool_call> #} ...")
    text = 'Let me check.\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "utc"}}\n</tool_call>'
    message, finish = plan.message(text, "stop")
    assert finish == "tool_calls" and message["content"] == "Let me check."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]] == [
        ("get_time", {"zone": "utc"})]
    assert plan.message("No call here.", "stop") == ({"role": "assistant", "content": "No call here."}, "stop")
    fenced = '```json\n{"name": "get_time", "arguments": {"zone": "cet"}}\n```'  # Qwen2.5-Coder-1.5B's way
    message, finish = plan.message(fenced, "stop")
    assert finish == "tool_calls" and message["tool_calls"][0]["function"]["name"] == "get_time"
    named = '<tool_call>\n{"name": "get_time", "parameters": {"zone": "utc"}}\n</tool_call>'  # (it ran with none)
    assert json.loads(plan.message(named, "stop")[0]["tool_calls"][0]["function"]["arguments"]) == {"zone": "utc"}
    accented = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "Zürich"}}\n</tool_call>'
    assert plan.message(accented, "stop")[0]["tool_calls"][0]["function"]["arguments"] == '{"zone": "Zürich"}'  # as vLLM
    required = ToolPlan.parse({"tools": TOOLS, "tool_choice": "required"}, None)
    listed = '[{"name": "get_time", "arguments": {"zone": "Zürich"}}]'
    assert required.message(listed, "stop")[0]["tool_calls"][0]["function"]["arguments"] == '{"zone": "Zürich"}'
    other = '{"name": "get_date", "arguments": {}}'  # names no tool of the request: content
    assert plan.message(other, "stop") == ({"role": "assistant", "content": other}, "stop")
    # a block that is no call of the request's tools stays content (it vanished; an unoffered tool was called)
    unoffered, broken = f"<tool_call>{other}</tool_call>", '<tool_call>{"name": "get_time", </tool_call>'
    message = plan.message(f"A.{text}B.{broken}C.{unoffered}", "stop")[0]
    assert message["content"] == f"A.Let me check.\nB.{broken}C.{unoffered}" and len(message["tool_calls"]) == 1
    assert plan.message(unoffered, "stop")[0] == {"role": "assistant", "content": unoffered}
    assert plan.constraint is None and plan.may_call
    assert not ToolPlan.parse({"tools": TOOLS}, "a template without calls").may_call
    with pytest.raises(ConstraintError):
        ToolPlan.parse({"tools": TOOLS, "tool_choice": {"type": "function"}}, None)


def test_the_openai_client_gets_its_tool_calls(llm):
    server = Server(create_app(llm, "tiny"))
    try:
        answer = server.client().chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=60, temperature=0, tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "get_weather"}})
    finally:
        server.close()
    call = answer.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and set(json.loads(call.function.arguments)) == {"city", "days"}


def test_a_completion_takes_the_defaults_clients_send_and_refuses_tools(client):
    """Clients send empty tools and tool_choice none with every request: a completion takes them (and has
    no tool calls), and refuses real tools by name."""
    body = {"prompt": "ab", "max_tokens": 4}
    assert client.post("/v1/completions", json={**body, "tools": [], "tool_choice": "none"}).status_code == 200
    r = client.post("/v1/completions", json={**body, "tools": TOOLS})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools"


def test_a_streamed_answer_sends_its_content_until_a_call_may_begin():
    """With tool_choice auto and a Hermes template, the content before a <tool_call> tag streams as it
    comes (a tail that may begin the tag waits), an answer that opens as a call object waits whole, and
    the end's delta holds the calls and only the content not yet sent."""
    plan = ToolPlan.parse({"tools": TOOLS}, "{# <tool_call> #}")
    pieces = ["Let me ", "check.\n<tool", '_call>\n{"name": "get_time", "arguments": {"zone": "utc"}}\n</tool_call>']
    streamed = StreamedContent(plan)  # (trailing whitespace waits: the message's content ends before it)
    assert [streamed.add(p) for p in pieces] == ["Let me", " check.", ""]
    end = streamed.rest(plan.message("".join(pieces), "stop")[0])
    assert end["content"] is None and end["tool_calls"][0]["index"] == 0
    call = '<tool_call>{"name": "get_time", "arguments": {"zone": "utc"}}</tool_call>'
    for text in ("Let me check.\n\n" + call, "  Sure " + call + " then text", "Sure\n" + call + "\n",
                 "No call, with space after.  "):  # the streamed pieces join to the message's content (the
        for cut in range(len(text) + 1):  # whitespace before a call went out, and the content left it out)
            streamed, message = StreamedContent(plan), plan.message(text, "stop")[0]
            sent = streamed.add(text[:cut]) + streamed.add(text[cut:])
            assert sent + (streamed.rest(message)["content"] or "") == (message["content"] or ""), (text, cut)
    assert plan.message("  Sure " + call + " then text", "stop")[0]["content"] == "  Sure  then text"
    streamed = StreamedContent(plan)  # content after the calls: the streamed pieces join to the message's
    text = 'Hi.\n<tool_call>{"name": "get_time", "arguments": {"zone": "utc"}}</tool_call>\nDone.'
    sent = streamed.add(text)
    message = plan.message(text, "stop")[0]
    assert sent + streamed.rest(message)["content"] == message["content"] == "Hi.\n\nDone."
    assert end["tool_calls"][0]["function"]["name"] == "get_time"
    streamed = StreamedContent(plan)
    whole = '```json\n{"name": "get_time", "arguments": {"zone": "cet"}}\n```'
    assert [streamed.add(p) for p in (whole[:9], whole[9:])] == ["", ""]  # may be one call object: waits
    assert streamed.rest(plan.message(whole, "stop")[0])["tool_calls"][0]["function"]["name"] == "get_time"
    streamed = StreamedContent(plan)  # a line break before the call: no content, streamed or whole
    text = '\n<tool_call>{"name": "get_time", "arguments": {"zone": "utc"}}</tool_call>'
    assert streamed.add(text[:3]) == "" and streamed.add(text[3:]) == ""
    assert plan.message(text, "stop")[0]["content"] is None and streamed.rest(plan.message(text, "stop")[0])["content"] is None
    streamed = StreamedContent(plan)  # (held whitespace goes with the content after it)
    assert streamed.add(" ") == "" and streamed.add("Hi") == " Hi"
    streamed = StreamedContent(plan)
    assert "".join(streamed.add(p) for p in ("It is ", "sunny <", "3")) == "It is sunny <3"
    end = streamed.rest(plan.message("It is sunny <3", "stop")[0])
    assert end["content"] is None and "tool_calls" not in end


def test_auto_with_a_hermes_template_streams_content_as_it_comes(llm, client):
    """The answer (this random model writes no call) streams in several pieces that join to the whole
    answer's content."""
    llm.tokenizer.chat_template = TEMPLATE + "{# <tool_call> #}"
    try:
        body = {"messages": MESSAGES, "max_tokens": 40, "temperature": 0, "tools": TOOLS}
        whole = client.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
        r = client.post("/v1/chat/completions", json={**body, "stream": True})
    finally:
        llm.tokenizer.chat_template = TEMPLATE
    deltas = [json.loads(line[6:])["choices"][0]["delta"] for line in r.text.split("\n") if line.startswith("data: {")]
    pieces = [d["content"] for d in deltas if d.get("content")]
    assert "tool_calls" not in whole and len(pieces) > 1 and "".join(pieces) == whole["content"]


@pytest.mark.parametrize("name", ["auto", "none", "required"])
def test_a_tool_may_be_named_as_a_tool_choice_word(name):
    """A tool named auto, none or required: its plan once collapsed a named tool_choice into the bare name
    and took it for the word (a forced call of `none` that still could not be called; every `auto` answer
    forced into a call of the tool `auto`)."""
    tool = {"type": "function", "function": {"name": name, "parameters": {
        "type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"], "additionalProperties": False}}}
    forced = ToolPlan.parse({"tools": [tool, TIME], "tool_choice": {"type": "function", "function": {"name": name}}},
                            None)
    assert forced.may_call and json.loads(forced.constraint.json)["properties"] == {"x": {"type": "integer"}}
    message, finish = forced.message('{"x": 3}', "stop")
    assert message["tool_calls"][0]["function"] == {"name": name, "arguments": '{"x": 3}'} and finish == "stop"
    auto = ToolPlan.parse({"tools": [tool, TIME]}, "a template without calls")
    assert auto.constraint is None and not auto.may_call
    assert auto.message("plain text", "stop")[0] == {"role": "assistant", "content": "plain text"}


def test_an_empty_tools_list_with_auto_or_required_answers_in_free_text():
    """vLLM takes `tools: []` with tool_choice auto (free text) and required (as none, after OpenAI's); a
    400 here, where /v1/responses already took auto without tools. A tool_choice without tools at all is
    still refused, as vLLM refuses it."""
    for choice in ("auto", "required", "none"):
        assert ToolPlan.parse({"tools": [], "tool_choice": choice}, None) is None
    for body in ({"tool_choice": "auto"}, {"tools": None, "tool_choice": "required"},
                 {"tools": [], "tool_choice": {"type": "function", "function": {"name": "get_time"}}}):
        with pytest.raises(ConstraintError):
            ToolPlan.parse(body, None)
