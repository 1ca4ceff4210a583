"""Conversations as prompts: OpenAI's chat messages laid out by a tokenizer's chat template, for
`LLM.chat`, the server's /v1/chat/completions and /v1/responses, and the draft's generated data."""
from __future__ import annotations

import inspect
import json

from .errors import UserError

# what `conversation_ids` passes the chat template itself, which template_kwargs may not change (besides the
# tokenizer's own options: apply_chat_template's parameters)
RESERVED = {"messages", "tools", "add_generation_prompt", "continue_final_message"}
TEMPLATE_ARGUMENTS = {"documents"}  # apply_chat_template's that chat_template_kwargs may give (vLLM's: RAG templates)


def conversation_ids(tokenizer, messages, tools: list[dict] | None = None, add_generation_prompt: bool = True,
                     continue_final_message: bool = False, template_kwargs: dict | None = None,
                     chat_template: str | None = None) -> list[int]:
    """The token ids of a conversation (OpenAI's messages: {role, content} with text content, a string or
    text parts; an assistant's may hold tool_calls instead), checked: UserError, naming what is wrong, for
    messages of another shape, a tokenizer without a chat template (`chat_template`: one given instead of
    the tokenizer's), contradicting flags, template_kwargs that would change what this function passes, and
    messages the template itself refuses."""
    if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and (message_text(m.get("content")) is not None or (
                m.get("content") is None and isinstance(m.get("tool_calls"), list))) for m in messages):
        raise UserError("'messages' must be a non-empty list of {role, content} objects with text content (a "
                        "string or text parts; or an assistant's tool_calls)")
    if tokenizer is None:
        raise UserError("this model has no tokenizer: give the prompt as token ids (/v1/completions, "
                        "LLM.generate)")
    if chat_template is not None and (not isinstance(chat_template, str) or not chat_template.strip()):
        got = repr(chat_template) if isinstance(chat_template, str) else type(chat_template).__name__
        raise UserError(f"chat_template must be a Jinja template's text (got {got})")
    if not (chat_template or getattr(tokenizer, "chat_template", None)):
        raise UserError("this model has no chat template: give one (LLM.chat's chat_template, serve's "
                        "--chat-template) or the prompt as text (/v1/completions, LLM.generate)")
    if add_generation_prompt and continue_final_message:
        raise UserError("'continue_final_message' needs 'add_generation_prompt' false")
    kwargs = {} if template_kwargs is None else template_kwargs
    if not isinstance(kwargs, dict):
        raise UserError(f"'chat_template_kwargs' must be an object of the template's variables, not a "
                        f"{type(kwargs).__name__}")
    reserved = RESERVED | {name for name, p in inspect.signature(tokenizer.apply_chat_template).parameters.items()
                           if p.kind is not p.VAR_KEYWORD and name not in TEMPLATE_ARGUMENTS}
    if reserved & set(kwargs):
        raise UserError(f"'chat_template_kwargs' must be an object of the template's variables, not "
                        f"{', '.join(sorted(reserved & set(kwargs)))}")
    try:
        return chat_ids(tokenizer, template_messages(messages), tools, add_generation_prompt, continue_final_message,
                        kwargs, chat_template)
    except Exception as exc:  # noqa: BLE001 (the template's own checks: roles, order; the caller's fault)
        raise UserError(f"the chat template refused these messages: {exc}") from None


def chat_ids(tokenizer, messages: list[dict], tools: list[dict] | None = None, add_generation_prompt: bool = True,
             continue_final_message: bool = False, template_kwargs: dict | None = None,
             chat_template: str | None = None) -> list[int]:
    """The token ids of `messages` ({role, content}) laid out by the tokenizer's chat template, ending
    where the assistant's answer begins (or, with continue_final_message, inside the last message, which
    the answer continues; without add_generation_prompt, after the last message); `tools` (OpenAI's
    function tools) as the template shows them; `template_kwargs`: more of the template's variables;
    `chat_template`: a template to use instead of the tokenizer's."""
    ids = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                        continue_final_message=continue_final_message, tokenize=True,
                                        chat_template=chat_template, **(template_kwargs or {}))
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)  # a BatchEncoding, or the ids


def message_text(content) -> str | None:
    """A message's text: a string, or OpenAI's text parts joined by newlines (as vLLM joins them); None
    for anything else (images, audio: triforce reads text)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content and all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
        return "\n".join(p["text"] for p in content)
    return None


def template_messages(messages: list[dict]) -> list[dict]:
    """OpenAI chat messages as chat templates take them: their text (message_text), an assistant's tool calls
    with their arguments as objects (OpenAI sends JSON text), a tool's answer with its call id, and no
    content as "" (what OpenAI clients send back with calls, and our own answers carry: templates that add
    strings to the content, SmolLM2's among them, failed on it); OpenAI's `developer` role (its newer name
    for `system`, which the templates know) as `system`."""
    out = []
    for m in messages:
        text = message_text(m.get("content"))
        message = {"role": "system" if m["role"] == "developer" else m["role"], "content": text or ""}
        if m.get("tool_calls"):
            message["tool_calls"] = [{**call, "function": {**call["function"], "arguments": _arguments(call)}}
                                     for call in m["tool_calls"]]
        for key in ("tool_call_id", "name"):
            if key in m:
                message[key] = m[key]
        out.append(message)
    return out


def _arguments(call: dict):
    arguments = call["function"].get("arguments", {})
    try:
        return json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        return arguments
