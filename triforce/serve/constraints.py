"""What a request asks its answer to follow: structured outputs (`structured_outputs`, from OpenAI's
`response_format` or vLLM's fields) and tool calls.

Tool calls: OpenAI's `tools` and `tool_choice` on /v1/chat/completions, built on structured outputs. The
tools reach the model through its chat template (transformers' `tools`), and `tool_choice` decides
what the answer may be:
- {"type": "function", "function": {"name": N}}: N's arguments, constrained to its `parameters` schema
  (speculation/guided.py: exact at every tier), answered as one call of N (as vLLM does; finish_reason
  "stop", as OpenAI's);
- "required": a JSON list of one or more calls (one with parallel_tool_calls false), each {"name": a
  tool's, "arguments": its parameters, whose $defs move to the list's root}, constrained likewise;
- "auto" (the default with tools): the model decides. Where the chat template writes calls as Hermes'
  `<tool_call>{"name": ..., "arguments": ...}</tool_call>` blocks (Qwen2.5's does), the answer's blocks
  become tool calls and the rest its content, and an answer that is nothing but one such object naming a
  tool (bare, or in a ```json fence, as Qwen2.5-Coder-1.5B writes it) is that call; a template without a
  call format leaves the model no way to call, and the answer is its content;
- "none": the answer is content.
A call's `arguments` is JSON text, as OpenAI's; a call cut short by max_tokens keeps what was generated.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from ..config import ConfigError
from ..sampling_params import StructuredOutputs

GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}
HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
FENCE = re.compile(r"^```(?:json)?\s*|\s*```$")  # a Markdown code fence around an answer
# a call of a "required" answer's list cut short after its name (the list's schema puts the name first)
CUT_CALL = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*(.*)', re.DOTALL)
NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class ConstraintError(ValueError):
    """A request's constraint, tools or tool_choice is malformed; `param` names the field."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


def constraints(body: dict, chat_template: str | None, chat: bool) -> tuple[ToolPlan | None, str | None,
                                                                             StructuredOutputs | None]:
    """A request's tools (chat only), the constraint its answer must follow and the field that asked for it
    (tool_choice where it names a function or is "required"); ConstraintError where one is malformed, or
    two ask."""
    tools = ToolPlan.parse(body, chat_template) if chat else None
    source, structured = structured_outputs(body)
    if tools is not None and tools.constraint is not None:
        if structured is not None:
            raise ConstraintError(source, f"'tool_choice' {tools.forced or tools.choice} constrains the answer; '{source}' cannot too")
        source, structured = "tool_choice", tools.constraint
    return tools, source, structured


def structured_outputs(body: dict) -> tuple[str | None, StructuredOutputs | None]:
    """The constraint a request asks for, and the field it came in: OpenAI's response_format (json_object,
    json_schema), vLLM's structured_outputs object, or vLLM's older guided_json, guided_regex, guided_choice
    and guided_grammar."""
    asked: dict[str, dict] = {}
    fmt = body.get("response_format")
    if fmt is not None:
        kinds = ("text", "json_object", "json_schema")
        if not isinstance(fmt, dict) or fmt.get("type") not in kinds:
            raise ConstraintError("response_format",
                                  "'response_format' must be an object whose type is text, json_object or json_schema")
        if fmt["type"] == "json_object":
            asked["response_format"] = {"json_object": True}
        elif fmt["type"] == "json_schema":
            schema = fmt.get("json_schema")
            if not isinstance(schema, dict) or not isinstance(schema.get("schema"), dict):
                raise ConstraintError("response_format",
                                      "'response_format' of type json_schema needs json_schema.schema, an object")
            asked["response_format"] = {"json": schema["schema"]}
    for name, field in GUIDED.items():
        if body.get(name) is not None:
            asked[name] = {field: body[name]}
    if body.get("structured_outputs") is not None:
        if not isinstance(body["structured_outputs"], dict):
            raise ConstraintError("structured_outputs", "'structured_outputs' must be an object")
        asked["structured_outputs"] = body["structured_outputs"]
    if len(asked) > 1:
        raise ConstraintError(list(asked)[-1], f"give one constraint, not {' and '.join(asked)}")
    if not asked:
        return None, None
    (source, fields), = asked.items()
    try:
        return source, StructuredOutputs(**fields)
    except (ConfigError, TypeError) as exc:
        raise ConstraintError(source, f"'{source}' is not a valid constraint: {exc}") from None


@dataclass(frozen=True)
class ToolPlan:
    tools: dict[str, dict]  # name -> its parameters' JSON schema
    choice: str  # "none", "auto", "required" or "function" (a named tool: `forced`)
    hermes: bool  # the chat template writes calls as <tool_call> blocks
    parallel: bool = True  # more than one call per answer (OpenAI's parallel_tool_calls)
    # The tool a named tool_choice forces, apart from `choice`: a tool may be named auto, none or required
    forced: str | None = None

    @classmethod
    def parse(cls, body: dict, chat_template: str | dict | None) -> ToolPlan | None:
        """The request's plan (None without tools); ConstraintError where tools or tool_choice is malformed.
        `chat_template`: the tokenizer's, one or named ones (transformers' dict: Hermes-3's default and
        tool_use templates)."""
        tools, choice, parallel = body.get("tools"), body.get("tool_choice"), body.get("parallel_tool_calls")
        if parallel is not None and not isinstance(parallel, bool):  # (0 == False: 0 allowed parallel calls)
            raise ConstraintError("parallel_tool_calls", "'parallel_tool_calls' must be true or false")
        if not tools:  # an empty list with auto or required answers in free text (vLLM's, after OpenAI's)
            if choice not in (None, "none") and not (tools == [] and choice in ("auto", "required")):
                raise ConstraintError("tool_choice", "'tool_choice' needs 'tools'")
            return None
        if not isinstance(tools, list) or not all(isinstance(t, dict) and t.get("type") == "function"
                                                  and isinstance(t.get("function"), dict) for t in tools):
            raise ConstraintError("tools", "'tools' must be a list of {type: function, function: {name, parameters}}")
        schemas = {}
        for tool in tools:
            function = tool["function"]
            name, schema = function.get("name"), function.get("parameters")
            if not schema:  # left out, null (vLLM's Optional) or {} (any JSON value to a grammar: `"arguments":
                # 5` fitted it; vLLM's "required" takes any falsy one so): a function of no arguments
                schema = {"type": "object", "properties": {}}
            if not isinstance(name, str) or not NAME.match(name) or name in schemas:
                raise ConstraintError("tools", f"tool names must be distinct, of letters, digits, _ and - (got {json.dumps(name)})")
            if not isinstance(schema, dict):
                raise ConstraintError("tools", f"the parameters of {name} must be a JSON schema (an object)")
            for key in ("$defs", "definitions"):
                if not isinstance(schema.get(key, {}), dict):
                    raise ConstraintError("tools", f"the parameters of {name}: '{key}' must be an object")
            schemas[name] = schema
        forced = None
        if choice is None:
            choice = "auto"
        elif isinstance(choice, dict):
            function = choice.get("function") if choice.get("type") == "function" else None
            forced = function.get("name") if isinstance(function, dict) else None
            if not isinstance(forced, str) or forced not in schemas:
                raise ConstraintError("tool_choice", f"'tool_choice' names no tool of this request ({json.dumps(forced)})")
            choice = "function"
        elif choice not in ("none", "auto", "required"):
            raise ConstraintError("tool_choice", "'tool_choice' must be none, auto, required or {type: function, "
                                           "function: {name}}")
        if isinstance(chat_template, dict):  # the one transformers renders with tools: tool_use, else default
            chat_template = chat_template.get("tool_use", chat_template.get("default"))  # (`in` read the names)
        hermes = "<tool_call>" in str(chat_template or "")
        return cls(schemas, choice, hermes, parallel is not False, forced)

    @property
    def constraint(self) -> StructuredOutputs | None:
        """What the answer must follow (None: free text)."""
        try:
            if self.forced is not None:
                return StructuredOutputs(json=self.tools[self.forced])
            if self.choice == "required":
                definitions: dict[str, dict] = {}
                calls = [{"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
                          "properties": {"name": {"const": name}, "arguments": _hoisted(name, schema, definitions)}}
                         for name, schema in self.tools.items()]
                listed = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
                if not self.parallel:
                    listed["maxItems"] = 1
                return StructuredOutputs(json={**listed, **({"$defs": definitions} if definitions else {})})
        except (ConfigError, RecursionError) as exc:  # a schema nested past Python's recursion limit: a 500
            raise ConstraintError("tools", f"the tools' parameters are no schema to constrain with "
                                           f"({type(exc).__name__}: {str(exc)[:200]})") from None
        return None

    @property
    def may_call(self) -> bool:
        """Whether an answer may hold calls (a stream then sends it whole at its end: only then is it known
        to be calls or content)."""
        return self.choice != "none" and (self.choice != "auto" or self.hermes)

    def _blocks(self, text: str) -> tuple[list[tuple[str, str]], str | None]:
        """The calls of an answer's <tool_call> blocks that call a tool of the request (the first alone
        without parallel calls), and its content: the text less those blocks, its trailing whitespace cut
        (None where nothing else is left). A block that is no such call stays in the content (it vanished,
        and a call of a tool the request did not offer was taken)."""
        calls, rest, at = [], [], 0
        for block in HERMES.finditer(text):
            call = _call(block.group(1))
            if call is not None and call[0] in self.tools:
                calls.append(call)
                rest.append(text[at:block.start()])
                at = block.end()
        if not calls:
            return [], text
        return (calls if self.parallel else calls[:1]), ("".join(rest) + text[at:]).rstrip() or None

    def message(self, text: str, finish_reason: str) -> tuple[dict, str]:
        """The assistant message of an answer's text, and its finish reason ("tool_calls" for calls that ended)."""
        if self.forced is not None:
            calls, content = [(self.forced, text)], None
        elif self.choice == "required":
            calls, content = _listed_calls(text), None
        elif self.choice == "auto" and self.hermes:
            calls, content = self._blocks(text)
            if not calls and (call := _call(FENCE.sub("", text.strip()))) is not None and call[0] in self.tools:
                calls, content = [call], None  # the whole answer one call, bare or in a ```json fence
        else:
            calls, content = [], text
        if not calls and self.choice == "required":  # cut short before its first call's name: no call, no content
            return {"role": "assistant", "content": None, "tool_calls": []}, finish_reason
        if not calls:
            return {"role": "assistant", "content": text}, finish_reason
        message = {"role": "assistant", "content": content, "tool_calls": [
            {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": {"name": name, "arguments": args}}
            for name, args in calls]}
        # a call the request named ends as "stop", as OpenAI's and vLLM's; calls the model chose, "tool_calls"
        named = self.forced is not None
        return message, "tool_calls" if finish_reason == "stop" and not named else finish_reason


class StreamedContent:
    """What a streamed answer that may hold tool calls sends as it comes: its content up to where a call may
    begin. An answer that opens with `{` or a code fence may be one call object, and waits whole; otherwise
    the text before a `<tool_call>` tag goes out, less a tail that may begin one and trailing whitespace
    (the message's content ends where its text before the calls does: sent, it joined the pieces wrongly)."""
    TAG = "<tool_call>"

    def __init__(self, plan: ToolPlan):
        self.text, self.sent = "", ""
        self.open = plan.choice == "auto"  # a named or required answer is the calls: none of it is content

    def add(self, piece: str) -> str:
        """Takes a piece of the answer's text; returns the content to send now ('' while held)."""
        self.text += piece
        head = self.text.lstrip()
        if not self.open or not head or head[0] in "{`":
            return ""
        end = self.text.find(self.TAG)
        if end < 0:
            end = len(self.text) - next((k for k in range(len(self.TAG) - 1, 0, -1)
                                         if self.text.endswith(self.TAG[:k])), 0)
        out = self.text[len(self.sent):max(len(self.text[:end].rstrip()), len(self.sent))]
        self.sent += out
        return out

    def rest(self, message: dict) -> dict:
        """The end's delta of `message` (ToolPlan.message of the whole text, whose content begins with what
        was sent): its calls, and the content not sent yet."""
        content = message.get("content")
        delta = {**message, "content": content[len(self.sent):] or None if content is not None else None}
        if "tool_calls" in delta:
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(delta["tool_calls"])]
        return delta


def _call(block: str) -> tuple[str, str] | None:
    """(name, arguments as JSON text) of one {"name", "arguments"} object's text; None where it is not one."""
    try:
        call = json.loads(block)
    except (ValueError, RecursionError):  # (nested past the decoder's depth: not a call either)
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    arguments = call.get("arguments", call.get("parameters", {}))  # (a call of parameters ran with none)
    if isinstance(arguments, str):  # JSON text already, or a bare string that is not
        try:
            json.loads(arguments)
            return call["name"], arguments
        except (ValueError, RecursionError):
            pass
    return call["name"], json.dumps(arguments, ensure_ascii=False)  # (vLLM's: "café", not "caf\u00e9")


def _listed_calls(text: str) -> list[tuple[str, str]]:
    """The calls of a "required" answer (a JSON list of them); of a list cut short by max_tokens, its whole
    calls and the one it cut, as its name and the text of its arguments so far (as a named call cut short
    has them, and OpenAI's)."""
    decoder, calls = json.JSONDecoder(), []
    at = text.find("[") + 1
    while 0 < at < len(text):
        while at < len(text) and text[at] in " \t\r\n,":
            at += 1
        try:
            call, at = decoder.raw_decode(text, at)
        except (ValueError, RecursionError):
            if (cut := CUT_CALL.match(text, at)) is not None:
                calls.append((json.loads(f'"{cut[1]}"'), cut[2]))
            break
        calls.append((call["name"], json.dumps(call["arguments"], ensure_ascii=False)))
    return calls


def _hoisted(name: str, schema: dict, definitions: dict[str, dict]) -> dict:
    """A tool's parameters schema to nest in a list of calls: its definitions ($defs, definitions) moved
    into `definitions` (the list's root $defs) under the tool's name, its references rewritten to them."""
    local = {**schema.get("definitions", {}), **schema.get("$defs", {})}

    def rewrite(node):
        if isinstance(node, list):
            return [rewrite(item) for item in node]
        if not isinstance(node, dict):
            return node
        out = {key: rewrite(value) for key, value in node.items()}
        ref = node.get("$ref")
        for prefix in ("#/$defs/", "#/definitions/"):
            if isinstance(ref, str) and ref.startswith(prefix):
                out["$ref"] = f"#/$defs/{name}__{ref[len(prefix):]}"
                break
        else:
            if isinstance(ref, str) and ref.startswith("#"):  # "#" or "#/properties/...": nested in the list
                # of calls, it would name another part of that list
                raise ConstraintError("tools", f"the parameters of {name} refer to {ref!r}: with tool_choice "
                                               "required, references go to their $defs or definitions only")
        return out

    for key, value in local.items():
        definitions[f"{name}__{key}"] = rewrite(value)
    # the root's own definitions moved: a property of that name elsewhere stays (it was dropped everywhere)
    return rewrite({key: value for key, value in schema.items() if key not in ("$defs", "definitions")})
