"""What `triforce bench` runs, checked before the first run (a bad value met in a later group threw away
the groups before it): the sweep, the tree flags, each run's settings, the batches' prompts and the
passkey prompt, the memory each batch needs, the --out file."""
from __future__ import annotations

import dataclasses
import os
import random
from pathlib import Path

from ..config import DRAFT_TIER, IGNORED_BY, PROPOSAL_TREE, ConfigError, EngineConfig, runs_tier, sets_tier
from ..coordinator.hierarchy import check_draft_window
from ..errors import UserError
from ..models.folders import probe_writes
from ..sampling_params import SamplingParams
from .flags import engine_settings, penalty_settings


def parse_sweep(specs: list[str] | None, modes: list[str]) -> tuple[str | None, list]:
    """--sweep's setting and values, checked against the modes that would run them."""
    if not specs:
        return None, [None]
    if len(specs) > 1:  # the last replaced the others, silently
        raise UserError(f"one --sweep at a time (got {', '.join(specs)})")
    spec = specs[0]
    name, _, values = spec.partition("=")
    if set(modes) == {"ar"}:
        raise UserError(f"--sweep {spec} varies the modes other than ar, and --modes runs ar alone")
    field_types = {f.name: f.type for f in dataclasses.fields(EngineConfig) if f.name != "mode"}  # --modes
    if name not in field_types or not values:
        raise UserError(f"--sweep needs SETTING=V1,V2 with SETTING an engine setting other than the mode "
                        f"(--modes; got {spec!r})")
    kind = str(field_types[name])
    if kind == "bool":
        truth = {"true": True, "false": False}
        if any(v.lower() not in truth for v in values.split(",")):
            raise UserError(f"--sweep {name} takes true and false (got {values!r})")
        return name, [truth[v.lower()] for v in values.split(",")]
    cast = float if "float" in kind else int if kind == "int" else str
    try:
        return name, [int(v) if v.isdecimal() and "int" in kind else cast(v) for v in values.split(",")]
    except ValueError:
        raise UserError(f"--sweep {name} takes {kind} values (got {values!r})") from None


def passkey_prompt(tokenizer, filler: list[int], length: int, seed: int) -> tuple[list[int], str]:
    """`length` tokens: filler text with a key planted a tenth of the way in, and the question at the end."""
    key = str(random.Random(seed).randrange(10000, 100000))
    # (no special tokens: a Llama or Mistral tokenizer puts BOS before each, mid-prompt)
    plant = tokenizer(f"\nThe pass key is {key}. Remember it. {key} is the pass key.\n", add_special_tokens=False).input_ids
    question = tokenizer("\nWhat is the pass key? The pass key is", add_special_tokens=False).input_ids
    body = length - len(plant) - len(question)
    if body <= 0:
        raise UserError(f"--lengths {length}: a passkey prompt holds its key and question, "
                        f"{len(plant) + len(question)} tokens, and at least one of text")
    if body > len(filler):
        raise UserError(f"passkey prompt of {length} tokens is past the {len(filler)} tokens of --text")
    at = body // 10
    return filler[:at] + plant + filler[at:body] + question, key


# settings of tiers that only some modes run
TIER_SETTINGS = ("tree1", "tree2", "rounds2", "tree_shape", "stop_below", "lookup", "auto_self_draft")


def check_tier_settings(args, sweep_name: str | None, sweep_values: list) -> None:
    """Flags and swept values of a tier that only some modes run, refused where none of --modes would use
    them (each run sets its mode; they would be ignored without a word): EngineConfig.refuse_unused asked of
    every mode. --tree1 / --tree2 go to the runs of the modes whose bottom tier they shape (`runs`). A flag
    beside --sweep of its setting, and a sweep that no mode of --modes runs, are refused too."""
    flags = engine_settings(args)
    if sweep_name in flags and flags[sweep_name] != getattr(EngineConfig, sweep_name):  # (the runs took the
        flag = "--" + sweep_name.replace("_", "-")  # swept values, and the report the flag's)
        raise UserError(f"{flag} {flags[sweep_name]} and --sweep {sweep_name} both set it: leave out {flag}")
    for name in IGNORED_BY["ar"]:  # a draft or retrieval tier's flag: by the tiers the modes run (asked of
        # refuse_unused alone, a value valid only beside another flag, --budget 12 with --chunk-size 4, failed)
        if name in flags and sets_tier(name, flags[name]) and \
                all(name in IGNORED_BY.get(mode, ()) for mode in args.modes):
            tier = "draft" if name in DRAFT_TIER else "retrieval"
            raise UserError(f"--{name.replace('_', '-')} {flags[name]}: none of --modes runs the {tier} tier")
    given = {name: flags[name] for name in TIER_SETTINGS if flags[name] != getattr(EngineConfig, name)}
    trees = {name: value for name, value in given.items() if name in ("tree1", "tree2")}
    if sweep_name in ("tree1", "tree2"):
        trees[sweep_name] = next((v for v in sweep_values if v), 0)  # a tree shape takes any swept tree
    asked = [(f"--{name.replace('_', '-')} {value}", {name: value}) for name, value in given.items()]
    if sweep_name in TIER_SETTINGS:
        asked += [(f"--sweep '{sweep_name}={value}'", {sweep_name: value}) for value in sweep_values
                  if value != getattr(EngineConfig, sweep_name)]  # (quoted: the CLI would write it as a flag)
    for named, setting in asked:
        reasons = [_refused(mode, {**trees, **setting} if "tree_shape" in setting else setting) for mode in args.modes]
        if all(reasons):  # (a ConfigError: the CLI names the settings in it by their flags)
            raise ConfigError(f"{named}: none of --modes runs it ({reasons[-1]})")
    if sweep_name is not None and not any(_takes_sweep(args, mode, sweep_name, sweep_values) for mode in args.modes):
        raise UserError(f"--sweep {sweep_name}: none of --modes ({' '.join(args.modes)}) runs it (each would run "
                        f"once, its rows labelled with values it never ran)")


def _refused(mode: str, settings: dict) -> str | None:
    """Why mode `mode` would not use `settings` (EngineConfig.refuse_unused), or None where it would."""
    try:
        EngineConfig(mode=mode, **settings).refuse_unused()
    except ConfigError as exc:
        return str(exc)
    return None


def runs(args, sweep_name: str | None, sweep_values: list):
    """(mode, engine settings over the base's) of each run of a group: every non-ar mode once per swept value,
    with --tree1 / --tree2 in the runs of the modes whose bottom tier they shape (PROPOSAL_TREE). A mode that
    would not use a swept setting (tree1 in mode retrieval, gamma1 there, the budget in mode draft) runs once,
    as ar does: given the value, its rows were labelled with settings it never ran, their noise shown as the
    setting's effect (and a mode that refuses a tier setting failed after the loads)."""
    for mode in args.modes:
        tree = PROPOSAL_TREE.get(mode)
        own = {tree: getattr(args, tree)} if tree and getattr(args, tree) else {}
        for value in (sweep_values if _takes_sweep(args, mode, sweep_name, sweep_values) else [None]):
            yield mode, {**own, **({sweep_name: value} if value is not None else {})}


def _takes_sweep(args, mode: str, sweep_name: str | None, sweep_values: list) -> bool:
    """Whether mode `mode` runs every swept value (not ar, not a setting of a tier it lacks, none refused)."""
    if mode == "ar" or sweep_name is None or sweep_name in IGNORED_BY.get(mode, ()):
        return False
    if sweep_name not in TIER_SETTINGS:
        return True
    # (the swept value alone, as check_tier_settings asks it, but a tree shape with the mode's tree: a value
    # invalid beside the mode's own tree, rounds2 4 with --tree1 auto, is check_plan's error, not one the mode
    # ignores, which it ran once without a word)
    tree = PROPOSAL_TREE.get(mode)
    beside = {tree: getattr(args, tree)} if sweep_name == "tree_shape" and tree and getattr(args, tree) else {}
    return not any(_refused(mode, {**beside, sweep_name: value}) for value in sweep_values)


def check_plan(args, llm, ids: list[int], files: list[list[int]], base: EngineConfig, sweep_name, sweep_values) -> None:
    """Every setting of the run checked before the first one runs (a bad value met late threw away the runs
    before it), the --out file included."""
    if "passkey" in args.workloads and max(args.batch) > 1:
        raise UserError("the passkey workload runs at batch 1: run it apart from --batch > 1")
    for length in args.lengths:
        if length + args.max_new_tokens > llm.target.config.max_positions:
            raise UserError(f"prompt length {length} + {args.max_new_tokens} new tokens is past the model's "
                            f"{llm.target.config.max_positions} positions")
        if length > len(ids):
            raise UserError(f"prompt length {length} is past the {len(ids)} tokens of --text")
        for i in range(max(args.batch) if max(args.batch) > 1 else 0):
            batch_prompt(files, i, length)
        if "passkey" in args.workloads:
            passkey_prompt(llm.tokenizer, ids, length, args.seed)
    for temperature in args.temperatures:
        SamplingParams(max_tokens=args.max_new_tokens, temperature=temperature, top_p=args.top_p, seed=args.seed,
                       **penalty_settings(args))
    length, batch = max(args.lengths), max(args.batch)
    if llm.prefixes is not None:  # each group's fill_prefix_store checks it again, as the store then holds
        wanted = batch * llm.prefixes.reusable_blocks(ids[:length - 1])  # of the prefill: all but the last token
        held = llm.prefixes.blocks_held(llm.target.kv_bytes_per_token)
        if held < wanted:
            raise UserError(f"--prefix-cache-gb {args.prefix_cache_gb:g} holds {held * llm.prefixes.block} of the "
                            f"{wanted * llm.prefixes.block} reusable prompt tokens of a batch of {batch} x {length}: "
                            f"raise it to hold a whole batch's prompts, or leave it at 0")
    for mode, overrides in runs(args, sweep_name, sweep_values):
        llm.config = dataclasses.replace(base, mode=mode, **overrides)
        if mode in ("draft", "triforce") and llm.draft is None:
            why = llm.draft_unavailable or f"{args.model} has no default one"
            raise UserError(f"--modes {mode} runs a draft, and {why}: name one with --draft")
        if runs_tier(mode, "draft", llm.draft is not None):  # (a run's trees, rounds2: its slack)
            check_draft_window(llm.config, llm.draft.config)
        _ = llm.retrieval_model, llm.draft_model  # the run's int8 twins, made (or refused) before any run, so
        # that the memory they take counts below
        # A batch whose caches do not fit at once runs in parts, one after another (LLM.generate): its
        # tokens/s, all its tokens over the longest decode, would count the parts as running together.
        parts = llm._parts_that_fit([(length, args.max_new_tokens)] * batch)
        if len(parts) > 1:
            raise UserError(f"a batch of {batch} prompts of {length} tokens does not fit the memory free at once "
                            f"in mode {mode} (it would run in {len(parts)} parts, and its tokens/s count them as "
                            f"together): lower --batch, --lengths or --prefix-cache-gb")
    llm.config = base
    if args.out:
        out = Path(args.out)
        if out.is_dir():
            raise UserError(f"--out {out} is a folder; name a file")
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            probe_writes(out.parent)
        except OSError as exc:
            raise UserError(f"cannot write --out {out}: {exc.strerror or exc}") from None
        if out.exists() and not os.access(out, os.W_OK):
            raise UserError(f"cannot write --out {out}: permission denied")


def batch_prompt(files: list[list[int]], i: int, length: int) -> list[int]:
    """Prompt i of a batch: `length` tokens of file i mod F, from token (i // F) * length on."""
    tokens = files[i % len(files)]
    start = (i // len(files)) * length
    if start + length > len(tokens):
        raise UserError(f"text file {i % len(files) + 1} is too short for prompt {i + 1} of the batch "
                        f"({length} tokens from token {start}): give more or longer --text files")
    return tokens[start:start + length]
