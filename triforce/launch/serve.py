"""`triforce serve`: the OpenAI-compatible HTTP server (serve/app.py) on the models and engine settings of
`triforce generate`."""
from __future__ import annotations

import argparse
import asyncio
import copy
import functools
import importlib
import math
import os
import socket
import sys

from ..errors import UserError
from ..serve.fields import MAX_BODY_MIB, MAX_REQUEST_MIB
from .cli import llm_from_args
from .flags import (add_distributed_args, add_engine_args, add_mode_arg, add_model_args, add_serving_args,
                    check_serving_args)


SHUTDOWN_GRACE_S = 5  # seconds open streams get to end on Ctrl-C or SIGTERM before they are cut
WORKERS_GRACE_S = 3  # of them, how long a round may wait on a worker group before it fails (the signal that
# ends the server ends its ranks too): its streams then end with an error before they are cut
ABORT_AFTER_S = 2.5  # of them, how long running requests run on (those that end are answered whole, as
# vLLM lets them run out the grace) before they end after their round with finish_reason "abort"


def add_serve_parser(p: argparse.ArgumentParser) -> None:
    p.description = ("An OpenAI-compatible HTTP server: /v1/completions, /v1/chat/completions, /v1/responses "
                     "(each streaming as server-sent events), /v1/models, /tokenize, /detokenize, /health and "
                     "/metrics (Prometheus). Concurrent requests run together on one continuous batch; output is "
                     "distributed exactly as plain sampling from the target.")
    p.add_argument("model_tag", nargs="?", default=None, metavar="MODEL",
                   help="the target, as --model takes it (vLLM's `vllm serve MODEL`); default: --model's")
    add_model_args(p)
    add_mode_arg(p)
    add_engine_args(p)
    add_serving_args(p)
    add_distributed_args(p)
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    g.add_argument("--port", type=int, default=8000, help="port to listen on")
    g.add_argument("--api-key", default=os.environ.get("TRIFORCE_API_KEY"),
                   help="require `Authorization: Bearer KEY` on /v1/ (default: $TRIFORCE_API_KEY; none: open)")
    g.add_argument("--max-queue", type=int, default=64,
                   help="requests that may wait for room in the batch; more get 503")
    g.add_argument("--max-request-mb", type=float, default=MAX_BODY_MIB, metavar="MIB",
                   help="the largest request body read, in MiB; a larger one gets 413 as it arrives (its JSON is "
                        "held whole while it is parsed)")
    g.add_argument("--allowed-origin", action="append", default=[], metavar="ORIGIN",
                   help="a web page origin (https://host:port) whose scripts may call the server (CORS; "
                        "repeatable; '*': any; default: none, so browsers refuse other pages' scripts)")
    p.set_defaults(func=_serve, precheck=check_serving)


def check_serving(args) -> None:
    """What `serve` checks before the model loads (with --workers, before the group starts)."""
    if not 0 < args.port < 65536:
        raise UserError(f"--port must be from 1 to 65535 (got {args.port})")
    if args.max_queue < 1:
        raise UserError(f"--max-queue must be >= 1 (got {args.max_queue})")
    if not 0 < args.max_request_mb <= MAX_REQUEST_MIB:  # (nan fails too)
        raise UserError(f"--max-request-mb must be a positive number of MiB up to {MAX_REQUEST_MIB} "
                        f"(got {args.max_request_mb:g})")
    if args.api_key is not None and not args.api_key.strip():  # every request would need "Bearer " and no key
        raise UserError("the API key is empty (--api-key, else $TRIFORCE_API_KEY): give one, or leave both unset "
                        "to serve without a key")
    if args.api_key is not None and (args.api_key != args.api_key.strip() or not args.api_key.isprintable()):
        # (a key read from a file that ends in a newline: HTTP strips a header's whitespace, and every request
        # was refused)
        raise UserError("the API key (--api-key, else $TRIFORCE_API_KEY) begins or ends with whitespace, or holds "
                        "a character no HTTP header carries: no request could match it")
    check_serving_args(args)
    try:
        importlib.import_module("uvicorn")
        importlib.import_module("triforce.serve.app")  # fastapi
    except ImportError as exc:
        raise UserError(f"triforce serve needs fastapi and uvicorn ({exc}): pip install fastapi uvicorn") from None
    _check_address(args.host, args.port)  # before the model loads, and before "serving" is said


def _serve(args) -> int:
    check_serving(args)
    import uvicorn

    from ..serve.app import create_app

    llm = llm_from_args(args)
    name = args.served_model_name or str(args.model)
    app = create_app(llm, name, args.api_key, args.max_queue, args.chat_max_tokens, tuple(args.allowed_origin),
                     math.ceil(args.max_request_mb * 2**20))
    print(f"triforce: serving {name} at http://{args.host}:{args.port}/v1"
          + (" (API key required)" if args.api_key else ""), file=sys.stderr)
    logs = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    if sys.__stdout__ is None:  # started with stdout closed (`>&-`): the access log goes where the others go
        logs["handlers"]["access"]["stream"] = "ext://sys.stderr"
    server = draining_server(uvicorn)(uvicorn.Config(app, host=args.host, port=args.port, log_level="info",
                                                    log_config=logs, timeout_graceful_shutdown=SHUTDOWN_GRACE_S))
    scheduler = app.state.scheduler
    scheduler.on_fatal = lambda exc: setattr(server, "should_exit", True)  # torchrun then ends the group
    server.run()
    if scheduler.fatal is not None:
        raise UserError(f"the server stopped: {scheduler.fatal}")
    return 0


def _check_address(host: str, port: int) -> None:
    """A one-line error where --host/--port cannot be bound (a port in use was said to be served, then
    uvicorn exited 3); bound as uvicorn binds it, address reuse allowed, and let go at once."""
    if not host.strip():  # an unset $HOST: every interface, where the user meant one
        raise UserError("--host is empty: name an address (0.0.0.0 listens on every interface)")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise UserError(f"cannot listen on {host}:{port}: {exc.strerror}") from None


def draining_server(uvicorn):
    """uvicorn's Server, which on Ctrl-C or SIGTERM first drains the app's requests (Scheduler.drain: those
    running end, whole, within ABORT_AFTER_S, or after their round then), so that their streams close with
    a last chunk; uvicorn's own waited for each to run to its end. Streams still open SHUTDOWN_GRACE_S
    later are cut."""

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            scheduler = self.config.app.state.scheduler
            drain = functools.partial(scheduler.drain, abandon_after_s=WORKERS_GRACE_S, abort_after_s=ABORT_AFTER_S)
            try:  # in the event loop, not inside the signal handler (the scheduler takes a lock)
                asyncio.get_running_loop().call_soon_threadsafe(drain)
            except RuntimeError:
                drain()
            super().handle_exit(sig, frame)

    return Server
