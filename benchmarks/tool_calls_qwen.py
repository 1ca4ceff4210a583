"""Tool calls with a model that knows tools: Qwen2.5-Coder-1.5B-Instruct (`triforce fetch-model
qwen2.5-coder-1.5b`), whose chat template writes calls as Hermes <tool_call> blocks, through the server
(TestClient), mode retrieval, greedy: tool_choice auto, required, a named function and none, a turn after
a tool result, and a stream. Prints each answer.

    python benchmarks/tool_calls_qwen.py
"""
import json
import time

from fastapi.testclient import TestClient
from triforce import LLM
from triforce.serve.app import create_app
llm = LLM("qwen2.5-coder-1.5b", mode="retrieval")
print("<tool_call>" in llm.tokenizer.chat_template)
tools = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}]
msgs = [{"role": "user", "content": "What's the weather like in Bath, in celsius?"}]
with TestClient(create_app(llm, "qwen")) as c:
    for extra in ({}, {"tool_choice": "required"}, {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, {"tool_choice": "none"}):
        t = time.perf_counter()
        r = c.post("/v1/chat/completions", json={"messages": msgs, "tools": tools, "max_tokens": 80, "temperature": 0, **extra})
        print(json.dumps(extra), round(time.perf_counter() - t, 1), "s", json.dumps(r.json()["choices"][0])[:400])
    r = c.post("/v1/chat/completions", json={"messages": msgs + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Bath\", \"unit\": \"celsius\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 14, \"sky\": \"light rain\"}"}], "tools": tools, "max_tokens": 60, "temperature": 0})
    print("after the result:", json.dumps(r.json()["choices"][0])[:400])
    r = c.post("/v1/chat/completions", json={"messages": msgs, "tools": tools, "max_tokens": 80, "temperature": 0, "stream": True})
    print("stream:", [l[:200] for l in r.text.split("\n") if l.startswith("data")][:3])
