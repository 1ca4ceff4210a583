"""vLLM's /tokenize and /detokenize: a prompt's or chat's token ids as this server would generate from
them, and token ids' text, so that clients can count tokens and check templates without generating."""
from __future__ import annotations

from .fields import ApiError, checked_body, flag, prompts, token_ids

TOKENIZE_FIELDS = {"model", "prompt", "messages", "tools", "add_special_tokens", "return_token_strs",
                   "add_generation_prompt", "continue_final_message", "chat_template_kwargs", "documents"}


def tokenize(body: object, llm, model_name: str) -> dict:
    """{"prompt": text} (`add_special_tokens`, default true: the beginning-of-sequence token a completion's
    prompt gets) or {"messages": [...], "tools": [...]} (laid out by the chat template as a chat request is,
    with its add_generation_prompt, continue_final_message and chat_template_kwargs) -> {"count",
    "max_model_len", "tokens", "token_strs" (with `return_token_strs`, else None)}."""
    body = checked_body(body, TOKENIZE_FIELDS, model_name)
    if ("prompt" in body) == ("messages" in body):
        raise ApiError(400, "give either 'prompt' or 'messages'", param="prompt")
    if llm.tokenizer is None:
        raise ApiError(400, "this model has no tokenizer", param="prompt")
    if "messages" in body:
        tools = body.get("tools")
        if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
            raise ApiError(400, "'tools' must be a list of function tools", param="tools")
        ids = prompts("chat", body, llm, tools)[0][0]
    else:
        text = body["prompt"]
        if not isinstance(text, str):  # ("" too: [BOS] where the tokenizer adds one, else no ids, as vLLM's)
            raise ApiError(400, "'prompt' must be a string", param="prompt")
        ids = llm.tokenizer(text, add_special_tokens=flag(body, "add_special_tokens", True)).input_ids
    strs = llm.tokenizer.convert_ids_to_tokens(ids) if flag(body, "return_token_strs", False) else None
    return {"count": len(ids), "max_model_len": llm.target.config.max_positions, "tokens": ids, "token_strs": strs}


def detokenize(body: object, llm, model_name: str) -> dict:
    """{"tokens": [ids]} -> {"prompt": their text} (special tokens' text included, as vLLM gives it)."""
    body = checked_body(body, {"model", "tokens"}, model_name)
    ids = token_ids(body, "tokens")
    vocab = llm.target.config.vocab_size
    if any(not 0 <= t < vocab for t in ids):
        raise ApiError(400, f"'tokens' must lie in [0, {vocab})", param="tokens")
    if llm.tokenizer is None:
        raise ApiError(400, "this model has no tokenizer", param="tokens")
    return {"prompt": llm.tokenizer.decode(ids)}
