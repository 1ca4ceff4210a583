"""`triforce` command line: generate, serve, batch, bench, fetch-model, train-draft. One layer that maps flags
(flags.py: those several commands share) onto the config dataclasses; errors in the user's input print one
line and exit 2."""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import sys
from pathlib import Path

from ..config import MODES_WITH_DRAFT, PROPOSAL_TREE, ConfigError, EngineConfig
from ..sampling_params import SamplingParams, StructuredOutputs
from ..errors import UserError
from ..models.hub import DEFAULT_MODEL, KNOWN_MODELS
from .flags import (DefaultsShown, RawDefaultsShown, add_distributed_args, add_engine_args, add_mode_arg,
                    add_model_args, add_penalty_args, engine_settings, penalty_settings, read_chat_template,
                    take_model_tag)


def add_generate_args(gen: argparse.ArgumentParser) -> None:
    """The flags of `triforce generate`, shared with the torchrun entry (launch/distributed.py)."""
    src = gen.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text")
    src.add_argument("--prompt-file", help="file holding the prompt text (UTF-8); - reads standard input")
    add_model_args(gen)
    add_mode_arg(gen)
    samp = gen.add_argument_group("sampling")
    samp.add_argument("--max-new-tokens", type=int, default=128, help="tokens to generate at most")
    samp.add_argument("--temperature", type=float, default=0.6, help="0 = greedy (default %(default)s)")
    samp.add_argument("--top-p", type=float, default=0.9,
                      help="nucleus sampling: the most likely tokens that reach this probability (1 = off)")
    samp.add_argument("--top-k", type=int, default=0, help="0 disables top-k")
    samp.add_argument("--min-p", type=float, default=0.0,
                      help="drop tokens less likely than this times the most likely one (0 disables)")
    samp.add_argument("--seed", type=int, default=None, help="makes sampled output reproducible")
    samp.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    samp.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-sequence")
    samp.add_argument("--stop-token-id", type=int, action="append", default=[], metavar="ID",
                      help="a token id that ends generation, as end-of-sequence does (repeatable)")
    samp.add_argument("--min-tokens", type=int, default=0,
                      help="generate at least this many tokens before end-of-sequence, a stop token id or a stop "
                           "string may end it")
    samp.add_argument("--include-stop-str", action="store_true",
                      help="keep the stop string (or the stop token's text) that ended generation in the text")
    add_penalty_args(samp)
    samp.add_argument("--bad-word", action="append", default=[], metavar="WORD",
                      help="never generate this word, alone or after a space (vLLM's bad_words; repeatable)")
    samp.add_argument("--allowed-token-id", type=int, action="append", default=None, metavar="ID",
                      help="generate only these token ids (repeatable; default: any)")
    guided = gen.add_argument_group("structured output (every tier keeps only the tokens it allows)")
    shape = guided.add_mutually_exclusive_group()
    shape.add_argument("--json-schema", metavar="SCHEMA",
                       help="the text is JSON that follows this JSON schema (the schema, or a file holding it)")
    shape.add_argument("--json-object", action="store_true", help="the text is a JSON object")
    shape.add_argument("--regex", help="the text matches this regular expression (Rust's regex syntax)")
    shape.add_argument("--choice", action="append", metavar="TEXT", help="the text is one of these (repeatable)")
    shape.add_argument("--grammar", metavar="GRAMMAR",
                       help="the text follows this Lark or GBNF (root ::= ...) grammar (or a file holding it)")
    add_engine_args(gen)
    gen.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    gen.add_argument("--logprobs", type=int, default=None, metavar="K",
                     help="with --json: each generated token's log-probability under the target (before "
                          "temperature, top-k and top-p) and the K most likely tokens there")
    gen.add_argument("--no-progress", action="store_true", help="hide the prefill progress bar")
    add_distributed_args(gen)


FIELD_FLAGS = {"max_tokens": "--max-new-tokens", "stop_token_ids": "--stop-token-id", "bad_words": "--bad-word",
               "allowed_token_ids": "--allowed-token-id", "include_stop_str_in_output": "--include-stop-str"}


@contextlib.contextmanager
def settings_named_by_flags():
    """A ConfigError about settings made from the flags of generate, serve, batch or bench (SamplingParams,
    EngineConfig, the LLM's prefix_cache_gb), with the fields it names as the Python API does (max_tokens,
    top_k, gamma1) written as those flags (--max-new-tokens, --top-k, --gamma1). Only field names with an
    underscore or a digit, outside quotes and paths: window or budget are words as well."""
    try:
        yield
    except ConfigError as exc:
        commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
        options = {o for command in ("generate", "serve", "batch", "bench")
                   for a in commands.choices[command]._actions for o in a.option_strings}
        names = {f.name for f in (*dataclasses.fields(SamplingParams), *dataclasses.fields(EngineConfig))}
        names.update(("prefix_cache_gb", "generation_config", "max_model_len", "gpu_memory_utilization",
                      "tensor_parallel_size", "enable_prefix_caching"))
        flags = {name: FIELD_FLAGS.get(name, "--" + name.replace("_", "-")) for name in names
                 if re.search(r"_|\d", name)}
        flags = {name: flag for name, flag in flags.items() if flag in options}
        pattern = r"(?<![\w/.'\"-])(" + "|".join(sorted(flags, key=len, reverse=True)) + r")(?![\w/.'\"-])"
        raise ConfigError(re.sub(pattern, lambda m: flags[m.group(1)], str(exc))) from None


def plans_text(plans: list[dict]) -> str:
    """Mode auto's plans for the summary line: 'draft(2) -> ar -> triforce(4, 6)' (it printed draft(2,))."""
    return " -> ".join(d["mode"] + (f"({', '.join(map(str, d['gammas']))})" if d["gammas"] else "") for d in plans)


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
        _refuse_unused_settings(EngineConfig(mode=args.mode, **engine_settings(args)), args.draft)
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


def _refuse_unused_settings(config: EngineConfig, draft: str | None) -> None:
    """A draft or a tree flag whose tier the user's mode does not run would be ignored without a word (the
    bench's sweeps and the triforce -> retrieval fallback reuse one config across modes, so EngineConfig and
    LLM let them be)."""
    if draft is not None and config.mode not in MODES_WITH_DRAFT:
        raise UserError(f"--draft names a tier that mode {config.mode} does not run: it takes mode "
                        f"{', '.join(MODES_WITH_DRAFT)}")
    for name in ("tree1", "tree2"):
        if getattr(config, name) and PROPOSAL_TREE.get(config.mode) != name:
            takes = " or ".join(mode for mode, tree in PROPOSAL_TREE.items() if tree == name)
            raise UserError(f"--{name} shapes a tier that mode {config.mode} does not run: it takes mode {takes}")


def _generate(args) -> int:
    if args.logprobs is not None and not args.json:
        raise UserError("--logprobs needs --json (the log-probabilities are printed in the JSON object)")
    return run_generation(args, llm_from_args(args))


def read_prompt(args) -> str:
    """--prompt, or --prompt-file's text (`-`: standard input), UTF-8 with or without a byte-order mark."""
    if args.prompt_file is not None:
        try:
            if args.prompt_file == "-":
                prompt = sys.stdin.buffer.read().decode("utf-8-sig")
            else:
                prompt = Path(args.prompt_file).read_text(encoding="utf-8-sig")
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"cannot read prompt file {args.prompt_file}: {exc}") from exc
    else:
        prompt = args.prompt
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError:  # bytes the locale could not decode, kept as surrogates by Python
            raise UserError("--prompt is not valid UTF-8 text") from None
    if not prompt:
        raise UserError("empty prompt")
    return prompt


def structured_outputs(args) -> StructuredOutputs | None:
    """The constraint of the structured-output flags (None without one)."""
    def text_or_file(value: str) -> str:
        try:
            if not Path(value).is_file():
                return value
        except OSError:  # too long to name a file: the text itself
            return value
        try:
            return Path(value).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"cannot read {value}: {exc}") from None

    if args.json_schema is not None:
        schema = text_or_file(args.json_schema)
        if schema is args.json_schema and not schema.lstrip().startswith("{"):
            raise UserError(f"--json-schema {schema}: no such file, nor a JSON schema (an object)")
        return StructuredOutputs(json=schema)
    if args.grammar is not None:
        return StructuredOutputs(grammar=text_or_file(args.grammar))
    if args.json_object or args.regex is not None or args.choice:
        return StructuredOutputs(json_object=args.json_object, regex=args.regex, choice=args.choice)
    return None


def run_generation(args, llm) -> int:
    """Generates from the prompt of `args` with `llm`; streams text or prints the JSON object."""
    prompt = read_prompt(args)
    with settings_named_by_flags():
        params = SamplingParams(max_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                                top_k=args.top_k, min_p=args.min_p, seed=args.seed, stop=tuple(args.stop),
                                ignore_eos=args.ignore_eos, logprobs=args.logprobs,
                                stop_token_ids=tuple(args.stop_token_id), min_tokens=args.min_tokens,
                                structured_outputs=structured_outputs(args), bad_words=tuple(args.bad_word),
                                allowed_token_ids=args.allowed_token_id,
                                include_stop_str_in_output=args.include_stop_str, **penalty_settings(args))
    streamed: list[str] = []
    stream = None if args.json else (
        lambda piece: (streamed.append(piece), sys.stdout.write(piece), sys.stdout.flush()))
    try:
        with settings_named_by_flags():  # rules that contradict each other, named as set
            out = llm.generate(prompt, params, stream=stream, show_progress=not args.no_progress)[0]
    except (KeyboardInterrupt, UserError) as exc:
        # the error, or the shell's prompt after Ctrl-C, on a line of its own after the text so far
        if streamed or (stream is not None and isinstance(exc, KeyboardInterrupt)):
            sys.stdout.write("\n")
            sys.stdout.flush()
        raise
    m = out.metrics
    if args.json:
        metrics = m.to_dict()
        extra = {} if out.logprobs is None else {"logprobs": [
            {"token": e.token, "logprob": e.logprob, "top": [[t, lp] for t, lp in e.top]} for e in out.logprobs]}
        print(json.dumps({"text": out.text, "token_ids": out.token_ids, "prompt_tokens": len(out.prompt_token_ids),
                          "finish_reason": out.finish_reason, "stop_reason": out.stop_reason, "mode": llm.config.mode,
                          "rope_scaling": llm.rope_scaling, "metrics": metrics, **extra}))
    else:
        sys.stdout.write("\n")
        sys.stdout.flush()  # before the summary on stderr, which shares a file or pipe under `2>&1`
        tiers = "; ".join(f"{t.name} accepted {t.accepted}/{t.proposed} from {t.drafter}" for t in m.tiers)
        plans = plans_text(m.auto or [])
        print(f"[{llm.config.mode}{': ' + plans if plans else ''}] prompt {m.prompt_tokens} tok, prefill {m.prefill_s:.2f}s; "
              f"{m.generated_tokens} tok in {m.decode_s:.2f}s = {m.tokens_per_s:.1f} tok/s"
              + (f"; {tiers}" if tiers else "") + (f"; {m.retrieval_rebuilds} retrieval rebuilds"
                                                   if m.retrieval_rebuilds else ""), file=sys.stderr)
    return 0


def _fetch(args) -> int:
    from ..models.hub import fetch_model

    print(fetch_model(args.name, args.again))  # a folder it returns has loaded once already (folders.convert_gguf)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="triforce", description="Lossless hierarchical speculative decoding (TriForce) for long contexts.")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate text from a prompt",
                         description="Generate a continuation. Output is distributed exactly as plain sampling "
                                     "from the target (identical tokens when --temperature 0).")
    add_generate_args(gen)
    gen.set_defaults(func=_generate)

    fetch = sub.add_parser("fetch-model", help="download and convert a known model into $TRIFORCE_HOME")
    fetch.add_argument("name", nargs="?", default=DEFAULT_MODEL, choices=sorted(KNOWN_MODELS),
                       help=f"the model to fetch (default {DEFAULT_MODEL})")
    fetch.add_argument("--again", action="store_true",
                       help="fetch and convert it anew, however it is now (a damaged file that will not load)")
    fetch.set_defaults(func=_fetch)

    from .batch_jobs import add_batch_parser
    from .bench import add_bench_parser
    from .serve import add_serve_parser
    from .train_draft import add_train_draft_parser

    add_bench_parser(sub)
    add_serve_parser(sub)
    add_batch_parser(sub)
    add_train_draft_parser(sub)
    for command in sub.choices.values():  # a description of several lines (a module's docstring) as written
        command.formatter_class = RawDefaultsShown if "\n" in (command.description or "") else DefaultsShown
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    try:
        take_model_tag(args)
        if getattr(args, "workers", 0):
            from .with_workers import launch_with_torchrun

            code = launch_with_torchrun(args)
        else:
            code = args.func(args)
        sys.stdout.flush()  # here, where a reader gone is caught below, not at exit
        return code
    except UserError as exc:
        print(f"triforce: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return reader_gone()


def reader_gone() -> int:
    """The exit status once stdout's reader has left (`| head`): quiet, as other commands are."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more to flush at exit
    return 141  # 128 + SIGPIPE, what a shell reports for such a command


if __name__ == "__main__":
    sys.exit(main())
