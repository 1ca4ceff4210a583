"""`triforce bench`'s runs: what it measures and its flags are in bench_flags.py (which loads no torch, so
that `triforce bench --help` answers at once)."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from .. import __version__
from ..config import IGNORED_BY, OWN_WEIGHTS, EngineConfig, runs_tier
from ..sampling_params import LOWEST_SAMPLED, SamplingParams
from ..errors import UserError
from ..files import read_user_text, write_whole
from ..kernels.cpu import cpu_isa, cpu_model, isa_level, kernel_path
from ..models.vocab import read_draft_metadata
from .bench_plan import (TIER_SETTINGS, batch_prompt, check_plan, check_tier_settings, parse_sweep,
                         passkey_prompt, runs)
from .bench_rows import batch_row, compare, medians
from .flags import engine_settings, penalty_settings
from .peers import LlamaCppPeer, TransformersPeer, llama_cpp_available


def run_bench(args) -> int:
    from ..api import LLM
    from .cli import settings_named_by_flags

    sweep_name, sweep_values = parse_sweep(args.sweep, args.modes)
    taken = [LOWEST_SAMPLED if 0 < t < LOWEST_SAMPLED else t for t in args.temperatures]  # as SamplingParams runs them
    for name, values in (("--modes", args.modes), ("--lengths", args.lengths), ("--batch", args.batch),
                         ("--temperatures", taken), ("--workloads", args.workloads), ("--peers", args.peers),
                         (f"--sweep {sweep_name}", sweep_values)):
        if len(set(values)) < len(values):  # a group run twice (and for --modes: which ar would speedups divide by?)
            raise UserError(f"{name} names a value twice ({' '.join(map(str, values))}, as run); --repeats runs "
                            f"each again")
    with settings_named_by_flags():
        check_tier_settings(args, sweep_name, sweep_values)
    texts = [_read_text(f) for f in args.text]
    text = "\n".join(texts)
    needs_draft = any(runs_tier(m, "draft") for m in args.modes) or "assisted" in args.peers
    if args.draft is not None and not needs_draft:
        raise UserError(f"--draft {args.draft}: none of --modes runs a draft (draft, triforce or auto do)")
    for name, values in (("--lengths", args.lengths), ("--batch", args.batch), ("--repeats", [args.repeats]),
                         ("--max-new-tokens", [args.max_new_tokens])):
        if min(values) < 1:
            raise UserError(f"{name} must be at least 1 (got {min(values)})")
    if {"transformers", "assisted"} & set(args.peers) and args.max_new_tokens < 2:  # (its rate: tokens after the first)
        raise UserError("the transformers peers time the tokens after the first: --max-new-tokens must be at least 2")
    if args.rope_scaling and args.peers:
        raise UserError("the peers run the model as its config says: leave out --peers with --rope-scaling")
    if args.peers and SamplingParams(**penalty_settings(args)).penalized:
        raise UserError("the peers decode without penalties: leave out --peers with the penalty flags")
    if args.peers and 1 not in args.batch:
        raise UserError("the peers run at batch 1, and --batch does not hold it: add 1, or leave out --peers")
    if args.gguf is not None and "llamacpp" not in args.peers:
        raise UserError(f"--gguf {args.gguf} is the llama.cpp peer's model: add --peers llamacpp, or leave it out")
    if "llamacpp" in args.peers and args.gguf is not None and not Path(args.gguf).is_file():
        raise UserError(f"--gguf {args.gguf}: no such file (the llama.cpp peer's model)")
    # One config serves every mode's runs (a run sets its mode; the tree flags go to the runs of the modes they
    # shape): checked whole first, the LLM is made without the settings of tiers its own mode may not run
    # (LLM refuses them), which then join it
    mode = "triforce" if needs_draft else "retrieval" if "retrieval" in args.modes else "ar"  # (its LLM checks
    # the settings of the tiers it runs: --full-layers against the target's layers)
    settings = {**engine_settings(args), "tree1": 0, "tree2": 0}
    for tier, own in OWN_WEIGHTS.items():  # a tier no mode runs (the LLM's mode may),
        # or whose weights a sweep without "auto" sets: its model's own weights as the LLM loads, no twin timed
        name = f"{tier}_weights"
        if not any(runs_tier(m, tier) for m in args.modes) or (sweep_name == name and "auto" not in sweep_values):
            settings[name] = own
    tiers = {name: settings[name] for name in (*TIER_SETTINGS, *IGNORED_BY.get(mode, ())) if name in settings}
    with settings_named_by_flags():
        EngineConfig(mode=mode, **settings)  # before anything loads
        llm = LLM(args.model, args.draft if needs_draft else None, mode, args.dtype, args.device,
                  rope_scaling=args.rope_scaling, revision=args.revision, draft_revision=args.draft_revision,
                  prefix_cache_gb=args.prefix_cache_gb, generation_config="vllm",
                  **{**settings, **{name: getattr(EngineConfig, name) for name in tiers}})
        llm.config = dataclasses.replace(llm.config, **tiers)
    if "assisted" in args.peers and llm.draft_path is None:
        raise UserError("the assisted peer needs a draft model" + (" of its own (transformers' assistant_model), "
                                                                   "not `self`" if llm.self_draft else ""))
    if "assisted" in args.peers and llm.draft.config.vocab_size != llm.target.config.vocab_size and \
            read_draft_metadata(llm.draft_path).get("token_ids") is None:
        raise UserError("the assisted peer needs a draft with the target's vocabulary rows (transformers refuses "
                        "a draft padded to another size)")
    hf = None
    if {"transformers", "assisted"} & set(args.peers):
        hf = TransformersPeer(llm.model_path, llm.dtype, llm.draft_path if "assisted" in args.peers else None,
                              llm.device)
    cpp = None
    if "llamacpp" in args.peers:
        if not llama_cpp_available() or args.gguf is None:
            print("bench: llama.cpp peer skipped (needs llama-cpp-python and --gguf)", file=sys.stderr)
        else:
            cpp = LlamaCppPeer(Path(args.gguf), max(args.lengths) + args.max_new_tokens + 16)
    if llm.tokenizer is None:
        raise UserError(f"bench cuts its prompts from --text with the model's tokenizer, and {args.model} has none")
    ids = llm.tokenizer(text).input_ids
    files = [llm.tokenizer(t).input_ids for t in texts]
    base = llm.config
    with settings_named_by_flags():
        check_plan(args, llm, ids, files, base, sweep_name, sweep_values)
    llm.config = dataclasses.replace(base, mode="ar")
    llm.generate([ids[:64]], SamplingParams(max_tokens=8))  # warm up kernels and allocator
    results = []
    try:
        _run_groups(args, llm, hf, cpp, ids, files, base, sweep_name, sweep_values, results)
    except BaseException as exc:  # Ctrl-C, or a later group that does not fit: the groups that ended are kept
        if results:
            _write(args, _report(args, llm, base, texts, results, stopped_by=exc))
        raise
    _write(args, _report(args, llm, base, texts, results))
    return 0


def _run_groups(args, llm, hf, cpp, ids, files, base, sweep_name, sweep_values, results: list[dict]) -> None:
    """Runs every (workload, length, batch, temperature) group, appending each group's rows to `results`."""
    for workload in args.workloads:
        for length in args.lengths:
            key = None
            prompt = ids[:length]
            if workload == "passkey":
                prompt, key = passkey_prompt(llm.tokenizer, ids, length, args.seed)
            for batch in args.batch:
                prompts = [prompt] + [batch_prompt(files, i, length) for i in range(1, batch)]
                # (prompt 0, the joined texts' start, lies in file 1 where batch > 1: check_plan saw it fit)
                if llm.prefixes is not None:
                    fill_prefix_store(llm, base, prompts)
                for temperature in args.temperatures:
                    params = SamplingParams(max_tokens=args.max_new_tokens, temperature=temperature,
                                            top_p=args.top_p, seed=args.seed, ignore_eos=True, **penalty_settings(args))
                    temperature = params.temperature  # (as SamplingParams took it: vLLM's floor of 0.01)
                    group = {"workload": workload, "prompt_tokens": length, "temperature": temperature,
                             "batch": batch}
                    rows = []
                    for repeat in range(args.repeats):
                        for mode, overrides in runs(args, sweep_name, sweep_values):
                            llm.config = dataclasses.replace(base, mode=mode, **overrides)
                            print(f"bench: {mode}{''.join(f' {k}={v}' for k, v in overrides.items())}, {workload} "
                                  f"{length} tokens x {batch}, temperature {temperature:g}, repeat {repeat + 1} of "
                                  f"{args.repeats}", file=sys.stderr)
                            outs = llm.generate(prompts, params, show_progress=True)
                            ran = {name: getattr(llm.config, name) for name in overrides}  # (as the config cast them)
                            weights = {role: c["weights"] for role, c in llm.proposer_weights.items()}
                            rows.append({**group, "run": mode, **ran, **batch_row(outs), "proposer_weights": weights})
                            _show(rows[-1], repeat)
                        for peer in args.peers if batch == 1 else []:
                            if peer == "llamacpp" and cpp is None:
                                continue
                            runner = cpp.run if peer == "llamacpp" else hf.run
                            extra = {"assisted": True} if peer == "assisted" else {}
                            got = runner(prompt, args.max_new_tokens, temperature, args.top_p, args.seed, **extra)
                            rows.append({**group, "run": peer, **got, "token_ids": [got["token_ids"]]})
                            _show(rows[-1], repeat)
                    results.extend(compare(medians(rows, sweep_name), llm.tokenizer, key))


def _report(args, llm, base: EngineConfig, texts: list[str], results: list[dict],
            stopped_by: BaseException | None = None) -> dict:
    sweep = dict(zip(("setting", "values"), parse_sweep(args.sweep, args.modes))) if args.sweep else None
    report = {"argv": getattr(args, "argv", sys.argv[1:]), "version": __version__, "commit": source_commit(),
              "seed": args.seed,
              "texts": [{"path": path, "sha256": hashlib.sha256(text.encode()).hexdigest()[:16]}
                        for path, text in zip(args.text, texts)],  # (another text: other prompts)
              "model": str(args.model), "draft": llm.draft_name,
              "dtype": llm.dtype, "rope_scaling": llm.rope_scaling_applied, "device": str(llm.device),
              "proposer_weights": _proposer_weights(llm, base, args.modes, sweep and sweep["setting"]),  # (and each row)
              "max_new_tokens": args.max_new_tokens, "prefix_cache_gb": args.prefix_cache_gb,
              "top_p": args.top_p, "penalties": penalty_settings(args),
              # (the tree flags' values: the base config holds 0, and the runs of their modes take them; neither
              # the mode nor a swept setting, which each row names)
              "engine": {name: value for name, value in {**dataclasses.asdict(base), "lookup": base.lookup_n,
                                                          "tree1": args.tree1, "tree2": args.tree2}.items()
                         if name not in ("mode", sweep["setting"] if sweep else None)},
              "sweep": sweep,
              "torch": torch.__version__,
              "gpu": torch.cuda.get_device_name(llm.device) if llm.device.type == "cuda" else None,
              "cuda_graphs": (os.environ.get("TRIFORCE_CUDA_GRAPHS", "1") != "0") if llm.device.type == "cuda" else None,
              "cpu": {"model": cpu_model(), "threads": torch.get_num_threads(), "isa": cpu_isa(),
                      "isa_level": isa_level(),  # the CPU kernels are built only where they run (22 s on a GPU's host)
                      "kernel_path": kernel_path() if llm.device.type == "cpu" else None,
                      "torch_cpu_capability": torch.backends.cpu.get_cpu_capability()},
              "results": results}
    if stopped_by is not None:  # the groups that ended before it
        report["interrupted"] = "Ctrl-C" if isinstance(stopped_by, KeyboardInterrupt) else \
            f"{type(stopped_by).__name__}: {stopped_by}"
    return report


def _proposer_weights(llm, base: EngineConfig, modes: list[str], swept: str | None) -> dict:
    """The weights of the proposing tiers that `modes` run, and why (base: its LLM's mode, which runs the
    tiers of all of them), but a tier whose weights are `swept` (each row names its own)."""
    ran, llm.config = llm.config, base
    try:
        return {role: chosen for role, chosen in llm.proposer_weights.items()
                if any(runs_tier(m, role) for m in modes) and swept != f"{role}_weights"}
    finally:
        llm.config = ran


def source_commit() -> str | None:
    """The git commit of the code that ran (with "+changes" where the package's files differ from it), or None
    where this file is not one git tracks (an install, even one inside a checkout or a home kept in git): a
    report names the code behind its numbers."""
    here = Path(__file__).resolve()
    package = here.parent.parent

    def git(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *argv], cwd=here.parent, capture_output=True, text=True, timeout=10)
    try:
        if git("ls-files", "--error-unmatch", here.name).returncode != 0:
            return None
        head, dirty = git("rev-parse", "HEAD"), git("status", "--porcelain", "--untracked-files=no", "--", str(package))
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def _write(args, report: dict) -> None:
    """--out first, then standard output: a reader of that which has gone (`| head`) ended the program
    with a broken pipe before the file was written, after all the runs."""
    text_out, failed = json.dumps(report, indent=1), None
    if args.out:
        try:
            out = Path(args.out)
            if out.is_symlink() or (out.exists() and not out.is_file()):  # a link, a FIFO, /dev/stdout: into it
                out.write_text(text_out)
            else:  # a report that stopped halfway would replace the last whole
                write_whole(out, text_out)
        except OSError as exc:  # a disk that filled during the runs
            failed = UserError(f"cannot write --out {args.out} ({exc.strerror or exc}); the report is above")
    print(text_out)
    if failed is not None:
        raise failed


def _read_text(path: str) -> str:
    try:
        return read_user_text(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read --text {path}: {exc.strerror if isinstance(exc, OSError) else exc}") from None


def _show(row: dict, repeat: int) -> None:
    print(json.dumps({"repeat": repeat, **{k: v for k, v in row.items() if k != "token_ids"}}), file=sys.stderr)


def fill_prefix_store(llm, base, prompts: list[list[int]]) -> None:
    """Prefills `prompts` into the LLM's prefix store, untimed, and checks that it holds every block of them
    it may restore, so that each later run restores them all and none decodes beside a batchmate's prefill
    (a store too small for the batch would leave some to prefill, and their prefill in the others' decode)."""
    llm.config = dataclasses.replace(base, mode="ar")
    llm.generate(prompts, SamplingParams(max_tokens=1))
    restored = sum(o.metrics.cached_prompt_tokens for o in llm.generate(prompts, SamplingParams(max_tokens=1)))
    wanted = sum(llm.prefixes.reusable_blocks(p[:-1]) for p in prompts) * llm.prefixes.block  # (the prefills')
    if restored < wanted:
        raise UserError(f"--prefix-cache-gb holds {restored} of the batch's {wanted} reusable prompt tokens: "
                        f"raise it to hold a whole batch's prompts, or leave it at 0")


