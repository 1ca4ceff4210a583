"""OpenAI's Responses API (POST /v1/responses), on the chat path: a request becomes a chat request
(`parse`: `input` and `instructions` as messages, `text.format` as response_format, function tools and
`tool_choice` in chat's shape, `max_output_tokens` as max_completion_tokens; vLLM's sampling extensions
pass through), and the chat answer becomes a Response object (`response`: an output message of
`output_text`, a `function_call` item per tool call, `status` "incomplete" at max_output_tokens) or,
streamed, the Response events (`events`: response.created ... response.output_text.delta ...
response.completed). The server keeps no responses: `store` true and `previous_response_id` are refused;
a conversation is sent whole in `input`, its earlier calls as `function_call` and `function_call_output`
items.
"""
from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from . import openai
from .fields import ApiError, checked_body, flag

# Taken as they are, or passed through to the chat request (vLLM's sampling extensions)
FIELDS = {"model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "stream", "text", "tools",
          "tool_choice", "parallel_tool_calls", "metadata", "user", "store", "truncation", "include",
          "top_logprobs", "reasoning", "background"}
PASSED = {"top_k", "min_p", "seed", "stop", "ignore_eos", "logit_bias", "presence_penalty", "frequency_penalty",
          "repetition_penalty", "stop_token_ids", "min_tokens", "allowed_token_ids", "bad_words",
          "chat_template_kwargs", "skip_special_tokens"}
HARMLESS = {"store": (None, False), "truncation": (None, "disabled"), "include": (None, []), "top_logprobs": (None, 0),
            "reasoning": (None,), "background": (None, False)}
# a chat request's field -> the Responses field it came from, for errors
SOURCES = {"messages": "input", "max_completion_tokens": "max_output_tokens", "response_format": "text",
           "stream_options": "stream"}
TEXT_PARTS = ("input_text", "output_text", "text")  # content parts read as text (chat's text parts)


@dataclass
class ResponsesJob(openai.Job):
    """A chat Job, and what its Response repeats of the request."""
    request: dict = field(default_factory=dict)


def parse(body: object, llm, model_name: str, chat_max_tokens: int = 1024) -> ResponsesJob:
    body = checked_body(body, FIELDS | PASSED, model_name)
    for name, allowed in HARMLESS.items():
        if body.get(name) not in allowed:
            raise ApiError(400, f"'{name}' other than {json.dumps(allowed[-1])} is not supported by this server "
                                f"(it keeps no responses and returns text)", param=name)
    chat = {name: body[name] for name in PASSED & set(body)}
    chat["messages"] = _messages(body)
    chat["stream"] = flag(body, "stream", False)
    if chat["stream"]:
        chat["stream_options"] = {"include_usage": True}
    for ours, theirs in (("max_output_tokens", "max_completion_tokens"), ("temperature", "temperature"),
                         ("top_p", "top_p"), ("parallel_tool_calls", "parallel_tool_calls")):
        if body.get(ours) is not None:
            chat[theirs] = body[ours]
    if body.get("tools") is not None and not isinstance(body["tools"], list):
        raise ApiError(400, "'tools' must be a list of function tools", param="tools")
    if body.get("tools") is not None:  # ([] too: with "required", a free-text answer, as chat gives one)
        chat["tools"] = [_tool(t) for t in body["tools"]]
    if body.get("tools") or body.get("tool_choice") not in (None, "auto", "none"):  # without tools, the chat
        chat["tool_choice"] = _tool_choice(body.get("tool_choice", "auto"))  # path refuses one that asks a call
        # (it was dropped: a free-text answer to "required"); auto, the Responses API's default, stays free text
    if not isinstance(body.get("text") or {}, dict):
        raise ApiError(400, "'text' must be an object ({format: ...})", param="text")
    format_ = (body.get("text") or {}).get("format")
    if format_ is not None:
        chat["response_format"] = _response_format(format_)
    try:
        job = openai.parse("chat", chat, llm, model_name, chat_max_tokens)
    except ApiError as exc:  # named as this request named it
        exc.param = SOURCES.get(exc.param, exc.param)
        for theirs, ours in SOURCES.items():
            exc.message = exc.message.replace(f"'{theirs}'", f"'{ours}'")
        raise
    metadata = body.get("metadata")  # echoed in the Response: OpenAI's map of strings
    if metadata is not None and not (isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())):
        raise ApiError(400, "'metadata' must be an object of strings", param="metadata")
    request = {name: body.get(name) for name in ("instructions", "metadata")}
    params = job.params  # what ran: the request's, else the model's generation_config's, else OpenAI's
    request.update(temperature=params.temperature, top_p=params.top_p, max_output_tokens=params.max_tokens,
                   parallel_tool_calls=body.get("parallel_tool_calls", True),
                   tool_choice=body.get("tool_choice", "auto") if body.get("tools") else "none",  # as it ran
                   tools=body.get("tools") or [],
                   text=body.get("text") or {"format": {"type": "text"}})
    fields = {name: getattr(job, name) for name in openai.Job.__dataclass_fields__}
    return ResponsesJob(**{**fields, "id": f"resp_{uuid.uuid4().hex}"}, request=request)


def _messages(body: dict) -> list[dict]:
    """`instructions` and `input` (a string, or a list of messages and function call items) as chat
    messages."""
    given = body.get("input")
    if isinstance(given, str):
        given = [{"role": "user", "content": given}]
    if not isinstance(given, list) or not given or not all(isinstance(item, dict) for item in given):
        raise ApiError(400, "'input' must be a string or a non-empty list of items", param="input")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise ApiError(400, "'instructions' must be a string", param="instructions")
    messages = [] if instructions is None else [{"role": "system", "content": instructions}]
    for item in given:
        kind = item.get("type", "message")
        if kind == "message":
            messages.append({"role": item.get("role"), "content": _content(item.get("content"))})
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments", "{}")}}
            if messages and messages[-1]["role"] == "assistant" and messages[-1].get("tool_calls") is not None:
                messages[-1]["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"),
                             "content": _tool_output(item.get("output"))})
        else:
            raise ApiError(400, f"input items of type '{kind}' are not supported (messages, function_call and "
                                f"function_call_output are)", param="input")
    return messages


def _content(content):
    """A message's content: a string, or input_text / output_text parts as chat's text parts."""
    if isinstance(content, list):
        return [{"type": "text", "text": part.get("text")} if isinstance(part, dict)
                and part.get("type") in TEXT_PARTS else part for part in content]
    return content


def _tool_output(output) -> str:
    """A function call's output as the model reads it: its text; a list of parts (OpenAI's newer shape) as
    their texts joined (it was written as the parts' JSON); anything else as JSON text."""
    if isinstance(output, list) and output and all(isinstance(part, dict) and "type" in part for part in output):
        if any(part["type"] not in TEXT_PARTS or not isinstance(part.get("text"), str) for part in output):
            raise ApiError(400, "a function_call_output's parts must be text (input_text); this server reads no "
                                "images or files", param="input")
        return "".join(part["text"] for part in output)
    return output if isinstance(output, str) else json.dumps(output)


def _tool(tool) -> dict:
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("name"), str):
        raise ApiError(400, "'tools' must be function tools ({type: 'function', name, parameters}); this server "
                            "runs no built-in tools", param="tools")
    return {"type": "function", "function": {key: tool[key] for key in ("name", "description", "parameters")
                                             if tool.get(key) is not None}}


def _tool_choice(choice):
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def _response_format(format_) -> dict:
    kind = format_.get("type") if isinstance(format_, dict) else None
    if kind in ("text", "json_object"):
        return {"type": kind}
    if kind == "json_schema":
        return {"type": "json_schema", "json_schema": {key: format_[key] for key in ("name", "schema", "strict")
                                                       if key in format_}}
    raise ApiError(400, "'text.format' must have type text, json_object or json_schema", param="text")


def response(job: ResponsesJob, model: str, outputs: list) -> dict:
    """The Response of a request that does not stream (`outputs`: its one RequestOutput)."""
    chat = openai.response(job, model, outputs)
    choice = chat["choices"][0]
    message = choice["message"]
    finish = choice["finish_reason"]
    calls = message.get("tool_calls") or []
    # a message unless the answer is calls alone: an empty answer (EOS first) is an empty message, not no output
    said = message.get("content") or ""
    items = [_message_item(job, said, _item_status(finish))] if said or not calls else []
    items += _call_items(job, calls, finish)
    return _response(job, model, items, chat["usage"], finish)


# why a response is incomplete, by its finish_reason: max_output_tokens reached, or ended first (a shutdown)
INCOMPLETE = {"length": "max_output_tokens", "abort": "interrupted"}


def _response(job: ResponsesJob, model: str, output: list, usage: dict | None, finish: str | None) -> dict:
    """The Response object: in progress (`finish` None), else completed or incomplete by its finish_reason."""
    status = "in_progress" if finish is None else "incomplete" if finish in INCOMPLETE else "completed"
    return {"id": job.id, "object": "response", "created_at": job.created, "status": status, "error": None,
            "incomplete_details": {"reason": INCOMPLETE[finish]} if finish in INCOMPLETE else None,
            "model": model, "output": output, "usage": None if usage is None else _usage(usage), **job.request}


def _usage(usage: dict) -> dict:
    return {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"],
            "total_tokens": usage["total_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
            "input_tokens_details": {"cached_tokens": usage["prompt_tokens_details"]["cached_tokens"]}}


def _item_status(finish: str) -> str:
    """A finished message item's status: incomplete where its response is (OpenAI's)."""
    return "incomplete" if finish in INCOMPLETE else "completed"


def _message_item(job: ResponsesJob, text: str, status: str = "completed") -> dict:
    return {"type": "message", "id": f"msg_{job.id[len('resp_'):]}", "status": status, "role": "assistant",
            "content": [] if status == "in_progress" else [_text_part(text)]}


def _text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _call_items(job: ResponsesJob, calls: list[dict], finish: str) -> list[dict]:
    """Function call items; the last one incomplete where max_output_tokens may have cut its arguments: a
    named or required answer's (a call the model chose under auto came whole, from a closed block)."""
    cut = _item_status(finish) == "incomplete" and job.tools is not None and job.tools.choice in ("function", "required")
    return [{"type": "function_call", "id": f"fc_{call['id']}", "call_id": call["id"], "name": call["function"]["name"],
             "arguments": call["function"]["arguments"], "status": "incomplete" if cut and i == len(calls) - 1
             else "completed"} for i, call in enumerate(calls)]


async def events(job: ResponsesJob, model: str, chunks: AsyncIterator) -> AsyncIterator[dict]:
    """The Response events of a streamed request, from its chat stream's chunks (dicts; "[DONE]" last)."""
    number = 0

    def event(kind: str, **data) -> dict:
        nonlocal number
        number += 1
        return {"type": kind, "sequence_number": number - 1, **data}

    text, calls, finish, usage, item = "", [], None, None, _message_item(job, "", "in_progress")

    def opened_message() -> list[dict]:
        return [event("response.output_item.added", output_index=0, item=item),
                event("response.content_part.added", item_id=item["id"], output_index=0, content_index=0,
                      part=_text_part(""))]

    yield event("response.created", response=_response(job, model, [], None, None))
    yield event("response.in_progress", response=_response(job, model, [], None, None))
    try:
        async for chunk in chunks:
            if chunk == "[DONE]":
                break
            if "error" in chunk:
                yield event("error", code=chunk["error"].get("code"), message=chunk["error"]["message"], param=None)
                return
            usage = chunk.get("usage") or usage
            for choice in chunk["choices"]:
                delta = choice["delta"]
                if delta.get("content"):
                    if not text:
                        for opened in opened_message():
                            yield opened
                    text += delta["content"]
                    yield event("response.output_text.delta", item_id=item["id"], output_index=0, content_index=0,
                                delta=delta["content"], logprobs=[])
                calls += delta.get("tool_calls") or []
                finish = choice["finish_reason"] or finish
    finally:
        await chunks.aclose()  # its choices end with it
    output = []
    if text or not calls:  # an empty answer (EOS first) is an empty message, as in `response`
        if not text:
            for opened in opened_message():
                yield opened
        yield event("response.output_text.done", item_id=item["id"], output_index=0, content_index=0, text=text,
                    logprobs=[])
        yield event("response.content_part.done", item_id=item["id"], output_index=0, content_index=0,
                    part=_text_part(text))
        output.append(_message_item(job, text, _item_status(finish or "stop")))
        yield event("response.output_item.done", output_index=0, item=output[-1])
    for done in _call_items(job, calls, finish or "stop"):
        yield event("response.output_item.added", output_index=len(output), item={**done, "arguments": "",
                                                                                 "status": "in_progress"})
        yield event("response.function_call_arguments.delta", item_id=done["id"], output_index=len(output),
                    delta=done["arguments"])
        yield event("response.function_call_arguments.done", item_id=done["id"], output_index=len(output),
                    name=done["name"], arguments=done["arguments"])
        yield event("response.output_item.done", output_index=len(output), item=done)
        output.append(done)
    done = _response(job, model, output, usage, finish or "stop")
    yield event(f"response.{done['status']}", response=done)
