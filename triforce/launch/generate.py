"""`triforce generate`: one prompt (text, a file or standard input) through the hierarchy, its text streamed
as it is committed, or one JSON object with --json; a summary of the run on stderr."""
from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
from pathlib import Path

from ..errors import UserError
from ..files import read_standard_input, read_user_text, user_path
from ..sampling_params import SamplingParams, StructuredOutputs
from .cli import llm_from_args, settings_named_by_flags
from .exit_status import OutputFailed
from .flags import add_distributed_args, add_engine_args, add_mode_arg, add_model_args, add_penalty_args, penalty_settings


def add_generate_parser(gen: argparse.ArgumentParser) -> None:
    gen.description = ("Generate a continuation. Output is distributed exactly as plain sampling from the target "
                       "(identical tokens when --temperature 0).")
    add_generate_args(gen)
    gen.set_defaults(func=generate_command, precheck=checked_request)


def add_generate_args(gen: argparse.ArgumentParser) -> None:
    """The flags of `triforce generate` (the torchrun entry, launch/distributed.py, parses them too)."""
    src = gen.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text, taken as written (no backslash escapes: bash's $'a\\nb' for a newline)")
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
    samp.add_argument("--seed", type=int, default=None, help="makes sampled output reproducible in a fixed --mode (in auto only where the same "
                      "plans run: they follow measured times); -1, as none, draws a random one")
    samp.add_argument("--stop", action="append", default=[], type=escaped_text,
                      help="stop string (repeatable); escapes such as \\n are read as llama.cpp reads them")
    samp.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-sequence")
    samp.add_argument("--stop-token-id", type=int, action="append", default=[], metavar="ID",
                      help="a token id that ends generation, as end-of-sequence does (repeatable)")
    samp.add_argument("--min-tokens", type=int, default=0,
                      help="generate at least this many tokens before end-of-sequence, a stop token id or a stop "
                           "string may end it")
    samp.add_argument("--include-stop-str", action="store_true",
                      help="keep the stop string (or the stop token's text) that ended generation in the text")
    add_penalty_args(samp)
    samp.add_argument("--bad-word", action="append", default=[], type=utf8_text, metavar="WORD",
                      help="never generate this word, alone or after a space (vLLM's bad_words; repeatable)")
    samp.add_argument("--allowed-token-id", type=int, action="append", default=None, metavar="ID",
                      help="generate only these token ids (repeatable; default: any)")
    guided = gen.add_argument_group("structured output (every tier keeps only the tokens it allows)")
    shape = guided.add_mutually_exclusive_group()
    shape.add_argument("--json-schema", metavar="SCHEMA",
                       help="the text is JSON that follows this JSON schema (the schema, or a file holding it)")
    shape.add_argument("--json-object", action="store_true", help="the text is a JSON object")
    shape.add_argument("--regex", type=utf8_text, help="the text matches this regular expression (Rust's regex syntax)")
    shape.add_argument("--choice", action="append", type=utf8_text, metavar="TEXT", help="the text is one of these (repeatable)")
    shape.add_argument("--grammar", metavar="GRAMMAR",
                       help="the text follows this Lark or GBNF (root ::= ...) grammar (or a file holding it)")
    add_engine_args(gen)
    gen.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    gen.add_argument("--logprobs", type=int, default=None, metavar="K",
                     help="with --json: each generated token's log-probability under the target (before "
                          "temperature, top-k and top-p) and the K most likely tokens there")
    gen.add_argument("--no-progress", action="store_true", help="hide the prefill progress bar")
    add_distributed_args(gen)


def utf8_text(value: str) -> str:
    """A text flag's value: bytes the locale could not decode (kept by Python as surrogates) are refused
    here, where a stop string or banned word carrying them ended in a traceback from the tokenizer."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError("not valid UTF-8 text") from None
    return value


ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "'": "'", '"': '"', "\\": "\\"}  # llama.cpp's, and \xHH


def escaped_text(value: str) -> str:
    """A text flag's value (utf8_text) with the backslash escapes llama.cpp reads in its stop strings read
    (\\n, \\r, \\t, \\', \\", \\\\ and \\xHH below 0x80), any other backslash kept as written (`\\begin`):
    `--stop '\\n'` stopped nowhere, at a backslash and an n."""
    return re.sub(r"\\(x[0-7][0-9a-fA-F]|[nrt'\"\\])",
                  lambda m: chr(int(m.group(1)[1:], 16)) if m.group(1)[0] == "x" else ESCAPES[m.group(1)],
                  utf8_text(value))


def _utf8(value: str, flag: str) -> str:
    """utf8_text for --json-schema and --grammar, checked once they are not a file's name (any bytes)."""
    try:
        return utf8_text(value)
    except argparse.ArgumentTypeError as exc:
        raise UserError(f"{flag}: {exc}") from None


def generate_command(args) -> int:
    request = checked_request(args)  # a prompt file or a flag that is wrong is said before the model loads
    if hasattr(sys.stdout, "reconfigure"):  # a character the terminal's encoding lacks (a Latin-1 locale,
        sys.stdout.reconfigure(errors="replace")  # PYTHONIOENCODING=ascii) as "?", not a traceback mid-text
    return run_generation(args, llm_from_args(args), request)


def checked_request(args) -> tuple[str, SamplingParams] | None:
    """The prompt and settings, checked before the model loads. With --workers, before the group starts,
    where a prompt that is not a regular file (standard input, a pipe) is left for rank 0 to read: only
    the settings are checked then, and None returned."""
    if args.logprobs is not None and not args.json:
        raise UserError("--logprobs needs --json (the log-probabilities are printed in the JSON object)")
    if getattr(args, "workers", 0) and args.prompt_file is not None and not_a_file(args.prompt_file):
        sampling_params(args)
        return None
    return prepared_request(args)


def read_prompt(args) -> str:
    """--prompt, or --prompt-file's text (`-`: standard input), UTF-8 with or without a byte-order mark."""
    if args.prompt_file is not None:
        try:
            prompt = read_standard_input("the prompt") if args.prompt_file == "-" else \
                read_user_text(args.prompt_file)
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
    def text_or_file(value: str, flag: str) -> str:
        try:
            if not user_path(value).is_file():  # (read_user_text expands ~ alike)
                return _utf8(value, flag)
        except OSError:  # too long to name a file: the text itself
            return _utf8(value, flag)
        try:
            return read_user_text(value)
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"cannot read {value}: {exc}") from None

    if args.json_schema is not None:
        schema = text_or_file(args.json_schema, "--json-schema")
        if schema is args.json_schema and not schema.lstrip().startswith("{"):
            raise UserError(f"--json-schema {schema}: no such file, nor a JSON schema (an object)")
        return StructuredOutputs(json=schema)
    if args.grammar is not None:
        grammar = text_or_file(args.grammar, "--grammar")
        if grammar is args.grammar and not any(mark in grammar for mark in ("::=", ":", "\n")):  # no rule in it
            raise UserError(f"--grammar {grammar}: no such file, nor a grammar (GBNF's rule ::= ..., or Lark's)")
        return StructuredOutputs(grammar=grammar)
    if args.json_object or args.regex is not None or args.choice:
        return StructuredOutputs(json_object=args.json_object, regex=args.regex, choice=args.choice)
    return None


def not_a_file(path: str) -> bool:
    """Standard input (`-`), a pipe or a device: read once, by whoever reads it first (a missing path is
    read, and said to be missing)."""
    return path == "-" or (Path(path).exists() and not Path(path).is_file())


def prepared_request(args) -> tuple[str, SamplingParams]:
    """The prompt and sampling settings of `args`, read and checked."""
    return read_prompt(args), sampling_params(args)


def sampling_params(args) -> SamplingParams:
    with settings_named_by_flags():
        return SamplingParams(max_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                              top_k=args.top_k, min_p=args.min_p, seed=args.seed, stop=tuple(args.stop),
                              ignore_eos=args.ignore_eos, logprobs=args.logprobs,
                              stop_token_ids=tuple(args.stop_token_id), min_tokens=args.min_tokens,
                              structured_outputs=structured_outputs(args), bad_words=tuple(args.bad_word),
                              allowed_token_ids=args.allowed_token_id,
                              include_stop_str_in_output=args.include_stop_str, **penalty_settings(args))


def run_generation(args, llm, request: tuple[str, SamplingParams]) -> int:
    """Generates `request` (prepared_request's) with `llm`; streams text or prints the JSON object."""
    prompt, params = request
    streamed: list[str] = []
    stream = None if args.json else (
        lambda piece: (streamed.append(piece), sys.stdout.write(piece), sys.stdout.flush()))
    try:
        with settings_named_by_flags():  # rules that contradict each other, named as set
            out = llm.generate(prompt, params, stream=stream, show_progress=not args.no_progress)[0]
    except (KeyboardInterrupt, UserError) as exc:
        # the error, or the shell's prompt after Ctrl-C, on a line of its own after the text so far
        if streamed or (stream is not None and isinstance(exc, KeyboardInterrupt)):
            with contextlib.suppress(OutputFailed):  # (an output that fails: the Ctrl-C or error is the news)
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
                          "rope_scaling": llm.rope_scaling_applied, "proposer_weights": llm.proposer_weights,
                          "metrics": metrics, **extra}))
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


def plans_text(plans: list[dict]) -> str:
    """Mode auto's plans for the summary line: 'draft(2) -> ar -> triforce(4, 6)' (it printed draft(2,))."""
    return " -> ".join(d["mode"] + (f"({', '.join(map(str, d['gammas']))})" if d["gammas"] else "") for d in plans)
