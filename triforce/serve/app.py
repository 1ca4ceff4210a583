"""`triforce serve`: an OpenAI-compatible HTTP server (FastAPI), for the clients users already have.

Endpoints: GET /health, GET /metrics (Prometheus, metrics.py), GET /v1/models and /v1/models/{id}, POST /v1/completions and
/v1/chat/completions (the tokenizer's chat template), each whole or streamed as server-sent events ending
in `data: [DONE]`, with `usage`; POST /tokenize and /detokenize (vLLM's: tokens.py). Requests run on one
continuous batch (scheduler.py), a request's `n` choices as n of its sequences. With an API key, /v1/ wants
`Authorization: Bearer KEY` (as in vLLM, the other paths do not). Every error is OpenAI's JSON with its
status: 400 bad parameters, 401 bad key, 404 unknown model or path (400 a prompt longer than the model, 413
than the memory allows, or a body past max_body_bytes), 503 queue full, 500 a failure of the server (logged, never a traceback to the
client). A client that disconnects cancels its request.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from .. import __version__
from ..api import LLM
from . import openai, responses, tokens
from .logprobs import StreamedLogprobs
from .fields import MAX_BODY_MIB, request_json
from .openai import ApiError
from .metrics import ServerMetrics
from .scheduler import Scheduler

log = logging.getLogger("triforce.serve")
POLL_S = 0.25  # how often a request that does not stream checks that its client is still there


class ApiKey:
    """Refuses /v1/ requests without `Authorization: Bearer KEY` (401). Plain ASGI: Starlette's
    BaseHTTPMiddleware (`app.middleware("http")`) hands the endpoint a wrapped `receive` that never
    reports the client's disconnect, so a request whose client had gone stayed queued and then ran."""

    def __init__(self, app, key: str):
        self.app, self.want = app, f"Bearer {key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            given = next((value for name, value in scope["headers"] if name == b"authorization"), b"")
            if not hmac.compare_digest(given, self.want):
                body = ApiError(401, "invalid or missing API key (Authorization: Bearer KEY)",
                                code="invalid_api_key").body()
                await JSONResponse(body, status_code=401)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class InternalErrors:
    """A route's unexpected exception as OpenAI's 500, logged once, inside the other middleware: Starlette's
    handler of exceptions sits outside all of it, so with CORS a browser saw a CORS failure instead of the
    error, and Starlette raised it again after answering (a second traceback). A response already begun (a
    stream) has nothing more to answer with: its exception goes on."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def sending(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception as exc:
            if started:
                raise
            log.exception("unexpected error", exc_info=exc)
            body = ApiError(500, f"internal error: {type(exc).__name__}: {exc}", "server_error").body()
            await JSONResponse(body, status_code=500)(scope, receive, send)


def create_app(llm: LLM, model_name: str, api_key: str | None = None, max_queue: int = 64,
               chat_max_tokens: int = 1024, allowed_origins: tuple[str, ...] = (),
               max_body_bytes: int = MAX_BODY_MIB * 2**20) -> FastAPI:
    """The app serving `llm` as `model_name`. chat_max_tokens: what a chat request without max_tokens gets;
    allowed_origins: the web pages (origins; '*': any) whose scripts may call it (CORS); max_body_bytes: a
    larger request body is refused (413) as it arrives."""
    scheduler = Scheduler(llm, max_queue)
    scheduler.metrics = metrics = ServerMetrics(model_name, scheduler)

    # Requests are checked and tokenized one at a time off the event loop: a long prompt, or a list of
    # thousands, would otherwise hold every stream and /health while it is encoded.
    parsing = ThreadPoolExecutor(max_workers=1, thread_name_prefix="triforce-parse")

    @asynccontextmanager
    async def lifespan(_):
        yield
        scheduler.stop()
        parsing.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="triforce", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.scheduler = scheduler
    started = int(time.time())

    @app.exception_handler(ApiError)
    async def api_error(_, exc: ApiError):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(HTTPException)
    async def http_error(_, exc: HTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(ApiError(exc.status_code, str(exc.detail), kind).body(), status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))  # (a 405's Allow)

    @app.exception_handler(RequestValidationError)
    async def invalid(_, exc: RequestValidationError):
        return JSONResponse(ApiError(400, f"invalid request: {exc.errors()}").body(), status_code=400)

    app.add_middleware(InternalErrors)  # added first: inside the key check and CORS
    if api_key is not None:
        app.add_middleware(ApiKey, key=api_key)
    if allowed_origins:  # added last, so outermost: a browser's preflight carries no key, and needs none
        app.add_middleware(CORSMiddleware, allow_origins=list(allowed_origins), allow_methods=["*"],
                           allow_headers=["*"])

    @app.get("/health")
    async def health():
        if not scheduler.alive:
            why = f": {scheduler.fatal}" if scheduler.fatal is not None else ""
            return JSONResponse(ApiError(503, f"the scheduler has stopped{why}", "server_error").body(),
                                status_code=503)
        return {"status": "ok", "waiting": scheduler.queued, "running": len(scheduler.running)}

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    card = {"id": model_name, "object": "model", "created": started, "owned_by": "triforce",
            "root": str(llm.model_path), "parent": None, "max_model_len": llm.target.config.max_positions,
            "permission": []}  # vLLM's fields

    @app.get("/version")
    async def version():
        return {"version": __version__}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [card]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str):
        if name != model_name:
            raise ApiError(404, f"the model '{name}' does not exist; this server serves '{model_name}'",
                           param="model", code="model_not_found")
        return card

    async def complete(request: Request, parse, answer, stream):
        """A generation request: `parse(body)` -> a Job; `answer(job, outputs)` -> the whole answer, or
        `stream(job, chunks)` -> the events of a streamed one from its chat or completion chunks."""
        raw = await _body(request, max_body_bytes)  # read as JSON, then parsed, off the event loop (a body of
        # megabytes took seconds, every stream held meanwhile)
        loop, events = asyncio.get_running_loop(), asyncio.Queue()
        job = await loop.run_in_executor(parsing, lambda: parse(request_json(raw)))
        tickets = scheduler.submit_choices(job, [  # events arrive as (choice, kind, data)
            lambda event, data, i=i: loop.call_soon_threadsafe(events.put_nowait, (i, event, data))
            for i in range(len(job.prompts) * job.n)])
        if job.stream:
            chunks = _stream(job, model_name, tickets, events, parsing)
            return StreamingResponse(_sse_events(stream(job, chunks)), media_type="text/event-stream")
        outputs, left = [None] * len(tickets), len(tickets)
        try:
            while left:
                try:
                    index, event, data = await asyncio.wait_for(events.get(), POLL_S)
                except asyncio.TimeoutError:
                    if await request.is_disconnected():
                        return JSONResponse({}, status_code=499)  # nobody reads it
                    continue
                if event == "error":
                    raise data
                if event == "done":
                    outputs[index], left = data, left - 1
            # off the event loop, JSON too: the texts of a long echo's or many choices' tokens take a while,
            # and FastAPI encoded a dict returned on the loop (0.8 s for a 4,000-token prompt's logprobs, timed once
            # by a review on the 2-core EPYC)
            return await loop.run_in_executor(parsing, lambda: JSONResponse(answer(job, outputs)))
        finally:
            _cancel(tickets)  # no effect on those done

    def openai_kind(kind: str):
        return (lambda body: openai.parse(kind, body, llm, model_name, chat_max_tokens),
                lambda job, outputs: openai.response(job, model_name, outputs), lambda job, chunks: chunks)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await complete(request, *openai_kind("completion"))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await complete(request, *openai_kind("chat"))

    @app.post("/v1/responses")
    async def create_response(request: Request):
        return await complete(request, lambda body: responses.parse(body, llm, model_name, chat_max_tokens),
                              lambda job, outputs: responses.response(job, model_name, outputs),
                              lambda job, chunks: responses.events(job, model_name, chunks))

    async def answer(handler, request: Request) -> JSONResponse:
        """A small request's answer, its body read and its answer computed and encoded off the event loop."""
        raw = await _body(request, max_body_bytes)
        return await asyncio.get_running_loop().run_in_executor(
            parsing, lambda: JSONResponse(handler(request_json(raw), llm, model_name)))

    @app.post("/tokenize")
    async def tokenize(request: Request):
        return await answer(tokens.tokenize, request)

    @app.post("/detokenize")
    async def detokenize(request: Request):
        return await answer(tokens.detokenize, request)

    return app


async def _body(request: Request, most: int) -> bytes:
    """The request's body, or ApiError 413 where it is longer than `most` bytes, said by its Content-Length
    or found as it arrives (read no further: a client's body of gigabytes, held whole and then parsed, took
    the server's memory, and every request with it)."""
    too_large = ApiError(413, f"the request body is larger than this server reads ({most / 2**20:g} MiB; "
                              "--max-request-mb)", code="request_too_large")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > most:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > most:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


def _sse(obj: dict | str) -> str:
    """A server-sent event: a Responses event names its type, as OpenAI's do."""
    head = f"event: {obj['type']}\n" if isinstance(obj, dict) and "sequence_number" in obj else ""
    return f"{head}data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n"


async def _sse_events(objects):
    async for obj in objects:
        yield _sse(obj)


def _cancel(tickets) -> None:
    for ticket in tickets:
        ticket.cancel()


async def _stream(job: openai.Job, model: str, tickets, events: asyncio.Queue, formatting: ThreadPoolExecutor):
    """The chunks of one request's choices (dicts; "[DONE]" last), each choice's in its order (choices
    interleave); cancels them if the client goes away. An echo's log-probabilities (a whole prompt's
    token texts) are formatted off the event loop, in `formatting`."""
    first, outputs, left = [True] * len(tickets), [None] * len(tickets), len(tickets)
    logprobs = [StreamedLogprobs(job.kind, job.texts, job.prompts[i // job.n]) for i in range(len(tickets))]
    streamed = [openai.StreamedContent(job.tools) if job.tools is not None else None for _ in tickets]
    generated = [0] * len(tickets)  # each choice's tokens so far: usage in every chunk (vLLM's), ids sent
    loop = asyncio.get_running_loop()
    try:
        while left:
            index, event, data = await events.get()
            sent = generated[index]  # the ids sent before this event's (return_token_ids)
            if event != "error":
                generated[index] = sent + len(data[2]) if event == "text" else len(data.token_ids)
            usage = openai.running_usage(job, index, generated[index]) if job.continuous_usage else None
            if first[index] and job.echoed is not None and event != "error":  # the prompt, before the text
                echoed = None
                if job.params.logprobs is not None:
                    entries = data.prompt_logprobs if event == "done" else tickets[index].request.prompt_logprobs
                    echoed = await loop.run_in_executor(formatting, logprobs[index].prompt,
                                                        job.prompts[index // job.n], entries)
                yield openai.chunk(job, model, job.echoed[index // job.n], first=True, index=index, logprobs=echoed,
                                   usage=openai.running_usage(job, index, sent) if usage else None)  # (before the text's)
                first[index] = False
            held = job.tools is not None and job.tools.may_call  # the text may hold calls: sent as known
            if event == "text" and held:
                piece = streamed[index].add(data[0])
                if piece:
                    yield openai.chunk(job, model, piece, first=first[index], index=index, usage=usage)
                    first[index] = False
            elif event == "done" and held:
                for event_chunk in openai.held_chunks(job, model, data, index, first[index], streamed[index],
                                                      logprobs[index].rest(data.logprobs), usage):
                    yield event_chunk
                first[index] = False
                outputs[index], left = data, left - 1
            elif event == "text":
                piece, entries, ids = data
                yield openai.chunk(job, model, piece, first=first[index], index=index,
                                   logprobs=logprobs[index].take(entries), usage=usage, token_ids=ids)
                first[index] = False
            elif event == "done":
                yield openai.chunk(job, model, None, data.finish_reason, first=first[index], index=index,
                                   logprobs=logprobs[index].rest(data.logprobs), stop_reason=data.stop_reason,
                                   usage=usage, token_ids=data.token_ids[sent:])
                outputs[index], left = data, left - 1
            else:
                yield data.body()
                yield "[DONE]"
                return
        if job.include_usage:
            yield openai.usage_chunk(job, model, outputs)
        yield "[DONE]"
    finally:
        _cancel(tickets)
