"""`triforce` command line: generate, serve, batch, bench, fetch-model, train-draft (each command's flags and
run in their own modules: generate.py, serve.py, batch_jobs.py, bench_flags.py and bench.py,
train_draft_flags.py and train_draft.py). One layer that maps
flags (flags.py: those several commands share) onto the config dataclasses; errors in the user's input print
one line and exit 2."""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import re
import sys

from ..config import ConfigError, EngineConfig
from ..sampling_params import SamplingParams
from ..errors import UserError
from .exit_status import exit_status
from ..models.hub import DEFAULT_MODEL, KNOWN_MODELS
from .flags import (DefaultsShown, RawDefaultsShown, engine_settings, read_chat_template, refuse_worker_flags,
                    take_model_tag)


STRUCTURED_FLAGS = {"json": "--json-schema", "json_object": "--json-object", "regex": "--regex", "choice": "--choice",
                    "grammar": "--grammar"}
FIELD_FLAGS = {"max_tokens": "--max-new-tokens", "stop_token_ids": "--stop-token-id", "bad_words": "--bad-word",
               "allowed_token_ids": "--allowed-token-id", "include_stop_str_in_output": "--include-stop-str"}


@contextlib.contextmanager
def settings_named_by_flags():
    """A ConfigError about settings made from the flags of generate, serve, batch or bench (SamplingParams,
    EngineConfig, the LLM's prefix_cache_gb), with the fields it names as the Python API does (max_tokens,
    top_k, gamma1) written as those flags (--max-new-tokens, --top-k, --gamma1): those with an underscore or a
    digit outside quotes and paths, and any other (temperature, budget) that begins the message: window or
    budget are words as well. "or None" goes: a flag is None where it is left out."""
    try:
        yield
    except ConfigError as exc:
        commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
        options = {o for command in ("generate", "serve", "batch", "bench")
                   for a in commands.choices[command]._actions for o in a.option_strings}
        names = {f.name for f in (*dataclasses.fields(SamplingParams), *dataclasses.fields(EngineConfig))}
        names.update(("prefix_cache_gb", "generation_config", "max_model_len", "gpu_memory_utilization",
                      "tensor_parallel_size", "enable_prefix_caching"))
        flags = {name: FIELD_FLAGS.get(name, "--" + name.replace("_", "-")) for name in names}
        flags = {name: flag for name, flag in flags.items() if flag in options}
        anywhere = sorted((name for name in flags if re.search(r"_|\d", name)), key=len, reverse=True)
        pattern = r"(?<![\w/.'\"-])(" + "|".join(anywhere) + r")(?![\w/.'\"-])"
        message = re.sub(r"^structured_outputs (json_object|json|regex|choice|grammar)\b",
                         lambda m: STRUCTURED_FLAGS[m.group(1)], str(exc))  # (its kinds' flags)
        message = message.replace("enable_prefix_caching=False", "--no-enable-prefix-caching")
        message = re.sub(r"\bNone or | or None\b", "", message)  # (the Python API's unset: a flag left out)
        message = re.sub(r"^(" + "|".join(sorted(flags, key=len, reverse=True)) + r")(?= )",
                         lambda m: flags[m.group(1)], message)
        raise ConfigError(re.sub(pattern, lambda m: flags[m.group(1)], message)) from None


def llm_from_args(args):
    """The LLM that the model, mode and engine flags of `args` describe, its settings checked before any
    weights load; verifying on the worker group of `args.worker_channel` when the torchrun entry
    (launch/distributed.py) set one, where the workers keep the prompt blocks."""
    from ..api import LLM

    workers = getattr(args, "worker_channel", None)
    prefix_cache_gb = getattr(args, "prefix_cache_gb", 0) if workers is None else 0
    template = getattr(args, "chat_template", None)
    if template is not None and getattr(args, "skip_tokenizer_init", None):
        raise UserError("--chat-template lays conversations out as tokens, and --skip-tokenizer-init loads no "
                        "tokenizer to do it with")
    template = None if template is None else read_chat_template(template)
    with settings_named_by_flags():
        llm = LLM(args.model, args.draft, args.mode, args.dtype, args.device, workers=workers,
                  rope_scaling=args.rope_scaling, revision=args.revision, draft_revision=args.draft_revision,
                  prefix_cache_gb=prefix_cache_gb, generation_config=getattr(args, "generation_config", "vllm"),
                  **engine_settings(args), **vllm_settings(args))
    if template is not None:
        if llm.tokenizer is None:
            raise UserError(f"--chat-template: {args.model} has no tokenizer to lay conversations out with")
        llm.tokenizer.chat_template = template  # every chat request's, tools' and /tokenize's
    return llm


def vllm_settings(args) -> dict:
    """The vLLM engine arguments that serve's and batch's flags give (engine_args.py; generate's --seed seeds
    its requests alone)."""
    if not hasattr(args, "max_model_len"):  # not a command with add_serving_args' flags
        return {}
    return {name: getattr(args, name) for name in ("max_model_len", "gpu_memory_utilization", "seed",
                                                   "tensor_parallel_size", "enable_prefix_caching", "tokenizer",
                                                   "tokenizer_revision", "skip_tokenizer_init")
            if getattr(args, name) is not None}


def _fetch(args) -> int:
    from ..models.hub import fetch_model

    print(fetch_model(args.name, args.again))  # a folder it returns has loaded once already (folders.convert_gguf)
    return 0


# Each command: the module and function that fill its flags (None: this module's), its line in `triforce --help`
COMMANDS = {
    "generate": ("generate", "add_generate_parser", "generate text from a prompt"),
    "fetch-model": (None, None, "download and convert a known model into $TRIFORCE_HOME"),
    "bench": ("bench_flags", "add_bench_parser", "compare modes and peers on the same prompts; prints JSON"),
    "serve": ("serve", "add_serve_parser", "serve the model over an OpenAI-compatible HTTP API"),
    "batch": ("batch_jobs", "add_batch_parser", "run OpenAI Batch API requests from a JSONL file (resumable, shardable)"),
    "train-draft": ("train_draft_flags", "add_train_draft_parser", "distil a small tier-1 draft LM from a target"),
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command; with `only` (a command's name, or "" for none) the others are names
    and their lines alone, so that `triforce --help` and a command's own flags import only what that
    command needs (no command's flags load torch: bench's and train-draft's runs did, 2.3 s of `triforce
    --help` on a Zen 4, and their flags are modules of their own)."""
    parser = argparse.ArgumentParser(
        prog="triforce", description="Lossless hierarchical speculative decoding (TriForce) for long contexts.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, fill, line) in COMMANDS.items():
        command = sub.add_parser(name, help=line)
        if only is not None and name != only:
            continue
        if module is None:
            _add_fetch_parser(command)
        else:
            getattr(importlib.import_module(f".{module}", __package__), fill)(command)
        # a description of several lines (a module's docstring) as written
        command.formatter_class = RawDefaultsShown if "\n" in (command.description or "") else DefaultsShown
    return parser


def _add_fetch_parser(fetch: argparse.ArgumentParser) -> None:
    fetch.add_argument("name", nargs="?", default=DEFAULT_MODEL, choices=sorted(KNOWN_MODELS),
                       help=f"the model to fetch (default {DEFAULT_MODEL})")
    fetch.add_argument("--again", action="store_true",
                       help="fetch and convert it anew, however it is now (a damaged file that will not load)")
    fetch.set_defaults(func=_fetch)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    named = next((a for a in argv if not a.startswith("-")), "")  # the command, where one comes first
    args = build_parser(named if named in COMMANDS else "").parse_args(argv)
    args.argv = argv
    try:
        return exit_status(lambda: _run(args))
    except KeyboardInterrupt:
        return 130


def _run(args) -> int:
    take_model_tag(args)
    if getattr(args, "workers", 0):
        from .with_workers import launch_with_torchrun

        # The command's own checks, before any rank loads; an exit status where they found it done
        ended = args.precheck(args) if getattr(args, "precheck", None) is not None else None
        return ended if isinstance(ended, int) else launch_with_torchrun(args)
    refuse_worker_flags(args)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
