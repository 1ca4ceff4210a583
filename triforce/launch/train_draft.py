"""`triforce train-draft`: the run of draft distillation (see triforce/draft/; its flags: train_draft_flags.py)."""
from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from ..draft import sources
from ..draft.data import check_readable, choose_vocabulary, read_texts, split_heldout
from ..draft.evaluate import decode_ms_per_token, evaluate_genres
from ..draft.settings import DraftShape, GenerationSettings, TrainSettings
from ..draft.train import ORDER_VERSION, export, fingerprint, grow_draft, init_draft, train, trained_draft
from ..errors import UserError
from ..files import user_path, write_whole
from ..models.folders import probe_writes, triforce_home, writable_folder
from ..models.loader import load_model
from ..models.vocab import DRAFT_FILE, ReducedVocabulary, tokenizer_fingerprint
from .train_draft_flags import HELDOUT_FRACTION, SHAPE_FLAGS

_SHAPE = DraftShape()

def _log(message: str) -> None:
    print(f"train-draft: {message}", file=sys.stderr)


def _data(args, llm, work: Path, target_key: str) -> tuple[dict, dict]:
    """-> (training sources, held-out genres), each a name -> [N, seq_len] sequences."""
    tokenizer, seq_len, n_heldout = llm.tokenizer, args.seq_len, args.heldout_sequences
    answers = GenerationSettings(args.answers, args.answer_tokens, tuple(args.answer_temperatures),
                                 args.answer_batch)  # their own seed: another training seed reuses them
    continued = replace(answers, samples=args.continuations) if args.continuations > 0 else None
    train_sources = {}
    texts = read_texts(args.text)
    if args.heldout is None:  # the ends of the training texts (none: a fraction of 0)
        texts, heldout_texts = split_heldout(tokenizer, texts, args.heldout_fraction) if args.heldout_fraction else \
            (texts, [])
        heldout_prose = {"prose": heldout_texts} if texts and heldout_texts else {}
    else:  # each file a genre of its own, named by the file
        heldout_prose = {Path(f).stem: read_texts([f]) for f in args.heldout}
        if len(heldout_prose) < len(args.heldout) or {"code", "chat", "continuations"} & set(heldout_prose):
            raise UserError("held-out files need different names, and not 'code', 'chat' or 'continuations' "
                            "(genres of their own)")
    held = {}  # built first: a held-out text too short failed after the answers were made, blaming --text
    for name, held_texts in heldout_prose.items():
        try:
            held[name] = sources.prose(tokenizer, held_texts, seq_len, n_heldout * seq_len)
        except UserError as exc:
            where = f"--heldout {name}" if args.heldout else f"the held-out {args.heldout_fraction:g} of --text"
            raise UserError(f"{where}: {exc}") from None
    if texts:
        train_sources["prose"] = sources.prose(tokenizer, texts, seq_len, args.max_train_tokens)
    if continued is not None:
        train_sources["continuations"] = sources.continuations(llm, work, continued, train_sources["prose"],
                                                               args.passage_tokens, seq_len, target_key)
    if args.local_tokens > 0:
        train_sources["code"] = sources.installed(tokenizer, args.local_tokens, seq_len, work, target_key)
    if args.answers > 0:
        train_sources["chat"] = sources.answers(llm, work, answers, seq_len, target_key)
    train_sources = {name: seqs for name, seqs in train_sources.items() if seqs.shape[0]}
    if not train_sources:
        raise UserError(f"no training data: give --text files, --local-tokens or --answers that make at least "
                        f"one sequence of {seq_len} tokens")
    genres = sources.heldout_genres(llm, work, held, n_heldout, seq_len, args.local_tokens > 0,
                                    answers if args.answers > 0 else None, target_key, continued, args.passage_tokens)
    for name, seqs in genres.items():
        short = f" (of the {n_heldout} sequences asked for, {seqs.shape[0]})" if seqs.shape[0] < n_heldout else ""
        _log(f"held-out {name}: {seqs.numel():,} tokens{short}")
    return train_sources, genres


def _repeats(args) -> dict[str, int]:
    """--repeat SOURCE=N ... -> {source: N}, only the ones that differ from 1; checked before any data is
    built."""
    train_sources = [name for name, asked in [("prose", args.text), ("code", args.local_tokens > 0),
                                              ("chat", args.answers > 0), ("continuations", args.continuations > 0)]
                     if asked]
    if not train_sources:
        raise UserError("no training sources: give --text files, --local-tokens > 0 or --answers > 0")
    if args.continuations > 0 and not args.text:
        raise UserError("--continuations continues passages of the --text prose: give --text files")
    repeat = {}
    for spec in args.repeat:
        name, _, count = spec.partition("=")
        if name not in train_sources or not count.isdecimal():
            raise UserError(f"--repeat {spec}: expected SOURCE=N with N >= 0 and SOURCE one of this run's "
                            f"sources ({', '.join(train_sources)})")
        repeat[name] = int(count)
    if not any(repeat.get(name, 1) for name in train_sources):
        raise UserError("--repeat leaves every source out of training")
    return {name: n for name, n in repeat.items() if n != 1}


def _shape_flags(args, out: Path) -> None:
    """Fills in the shape flags left out with their defaults, or refuses them beside --init (whose draft has
    its own shape; --layers, a multiple of its layers, grows it: train.grow_draft), and an --init that is
    --out (the export replaces it: a rerun would train on from the result)."""
    given = [name for name in SHAPE_FLAGS if getattr(args, name) is not None and name != "layers"]
    if args.init:
        if given:
            raise UserError(f"--init {args.init} trains that draft on, in its own shape: leave out "
                            f"--{given[0].replace('_', '-')}")
        if user_path(args.init).resolve() == out:
            raise UserError(f"--init {args.init} is --out too: the export replaces it, so write the draft to "
                            "another folder")
        if not (user_path(args.init) / "config.json").is_file():
            raise UserError(f"--init {args.init}: no draft there (no config.json)")
        if args.layers is not None:
            try:
                layers = json.loads((user_path(args.init) / "config.json").read_text()).get("num_hidden_layers")
            except (ValueError, AttributeError):  # (not JSON, or not an object)
                layers = None
            if not isinstance(layers, int) or layers < 1:
                raise UserError(f"--init {args.init}: its config.json names no layer count for --layers to grow")
            if args.layers <= layers or args.layers % layers:
                raise UserError(f"--layers {args.layers} beside --init grows that draft's {layers} layers: give a "
                                f"multiple of {layers} above it")
    for name in SHAPE_FLAGS if not args.init else ():
        if getattr(args, name) is None:
            setattr(args, name, getattr(_SHAPE, name))


def _weights_digest(folder: str) -> str:
    """What names an --init draft in a run's key and in the new draft's record: its weight files' bytes."""
    digest = hashlib.sha1()
    for f in sorted(user_path(folder).glob("*.safetensors")):
        digest.update(f.read_bytes())
    return digest.hexdigest()


TARGET_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")


def _target_key(folder: Path, tokenizer) -> str:
    """What a target's cached data, answers, labels and checkpoints are named by: its folder, its weight
    files (names, sizes and times: a target fine-tuned in place is another model, whose data was reused
    before), its tokenizer, and the contents of the files that say how it runs and tokenizes (TARGET_FILES:
    a config whose RoPE scaling or end ids changed, a tokenizer that splits otherwise, reused stale data)."""
    weights = [(f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in sorted(folder.glob("*.safetensors"))]
    files = [(name, hashlib.sha1((folder / name).read_bytes()).hexdigest()) for name in TARGET_FILES
             if (folder / name).is_file()]
    return fingerprint(str(folder.resolve()), weights, tokenizer_fingerprint(tokenizer), files)


def _final_loss(out: Path, run_key: str) -> float | None:
    """The final loss the draft in `out` recorded where it is this run's (`run_key`: a rerun of a finished run
    trains no step, and keeps it; another run's draft there is not this one's)."""
    try:
        meta = json.loads((out / "triforce_draft.json").read_text())
        return meta.get("final_loss") if meta.get("run_key") == run_key else None
    except (OSError, ValueError, AttributeError):
        return None


def _check_work_dir(work: Path) -> None:
    """Refuses a --work-dir that cannot be made or written, before anything runs (it was a traceback once
    the target's answers were generated), without making it yet (a run refused later leaves none)."""
    existing = next(p for p in (work, *work.parents) if p.exists())
    if not existing.is_dir():
        raise UserError(f"--work-dir {work}: {existing} is a file")
    try:
        probe_writes(existing)
    except OSError as exc:
        raise UserError(f"--work-dir {work}: cannot write in {existing} ({exc.strerror or exc})") from None


def _out_folder(name: str) -> Path:
    """--out, resolved; the export replaces it, so it must be new, empty or an earlier draft (never a folder of
    other files, nor the working directory or one above it)."""
    out = Path(name).resolve()
    if out == Path.cwd() or out in Path.cwd().parents:
        raise UserError(f"--out {name}: the draft replaces its folder; name a folder below this one")
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {name} is a file; the draft is written as a folder")
    if out.is_dir() and any(out.iterdir()) and not (out / DRAFT_FILE).is_file():
        raise UserError(f"--out {name} holds files that are not a draft; the draft replaces its folder, so name "
                        "a new folder, an empty one or an earlier draft's")
    above = next(folder for folder in out.parents if folder.exists())  # the export makes the rest
    try:  # found now, not when the draft is written at the end of the run
        probe_writes(above)
    except OSError as exc:
        raise UserError(f"--out {name}: cannot write the draft in {above} ({exc.strerror or exc})") from None
    return out


def run_train_draft(args) -> int:
    """train-draft; a disk that fills and a Ctrl-C end it in a line that says what is kept (each
    checkpoint and cached part is written whole: a rerun resumes from them)."""
    try:
        return _train_draft(args)
    except OSError as exc:
        raise UserError(f"train-draft: {exc.strerror or exc}{': ' + str(exc.filename) if exc.filename else ''}; "
                        "the checkpoints and data made so far are kept, and a rerun resumes from them") from None
    except KeyboardInterrupt:
        print("\ntrain-draft: stopped; the checkpoints and data made so far are kept, and a rerun with the same "
              "flags resumes from them", file=sys.stderr)
        return 130


def _train_draft(args) -> int:
    from .. import LLM

    started = time.time()
    for flag, least in (("seq_len", 16), ("heldout_sequences", 1), ("steps", 1), ("batch_size", 1),
                        ("checkpoint_every", 1), ("top_k", 1), ("answers", 0), ("answer_tokens", 1),
                        ("answer_batch", 1), ("local_tokens", 0), ("max_train_tokens", 1), ("continuations", 0),
                        ("passage_tokens", 1)):
        if getattr(args, flag) < least:
            raise UserError(f"--{flag.replace('_', '-')} must be >= {least} (got {getattr(args, flag)})")
    if args.continuations > 0 and args.passage_tokens >= args.seq_len:
        raise UserError(f"--passage-tokens {args.passage_tokens} must be below --seq-len {args.seq_len}: a "
                        "passage is cut from a sequence of the prose")
    if not 0 < args.lr < float("inf"):
        raise UserError(f"--lr must be a number > 0 (got {args.lr})")
    if args.heldout is not None and args.heldout_fraction is not None:  # (it would be ignored)
        raise UserError("--heldout-fraction keeps the end of each --text file for the held-out evaluation, and "
                        "--heldout names its files instead: give one of them")
    if args.heldout_fraction is None and args.heldout is None:  # (recorded as 0.03 beside --heldout files too)
        args.heldout_fraction = HELDOUT_FRACTION
    trained = {user_path(f).resolve() for f in args.text}
    shared = [f for f in args.heldout or [] if user_path(f).resolve() in trained]
    if shared:  # (its held-out figures were the training text's)
        raise UserError(f"--heldout {shared[0]} is a --text file too: held-out text must be text the draft "
                        "does not train on")
    if args.heldout_fraction is not None and not 0 <= args.heldout_fraction < 1:
        raise UserError(f"--heldout-fraction must be in [0, 1) (got {args.heldout_fraction})")
    if not all(0 < t < float("inf") for t in args.acceptance_at) or not 0 <= args.acceptance_weight < float("inf"):
        raise UserError(f"--acceptance-at needs temperatures > 0 and --acceptance-weight a number >= 0 (got "
                        f"{args.acceptance_at} and {args.acceptance_weight})")
    if not all(0 <= t < float("inf") for t in args.answer_temperatures):
        raise UserError(f"--answer-temperatures must be numbers >= 0 (got {args.answer_temperatures})")
    repeat = _repeats(args)
    out = _out_folder(args.out)
    _shape_flags(args, out)
    work = Path(args.work_dir) if args.work_dir else triforce_home() / "train-draft" / out.name
    if work.resolve() == out or out in work.resolve().parents:
        raise UserError(f"--work-dir {work} lies in --out {args.out}, which the draft replaces")
    if args.work_dir is None:
        writable_folder(work.parent)
    else:
        _check_work_dir(work)
    check_readable([*args.text, *(args.heldout or [])])  # before the target loads (a minute for a large one),
    if not args.init:  # checked as the shape is (the vocabulary's bound: after)
        DraftShape(args.layers, args.hidden, args.intermediate, args.heads, args.kv_heads, args.vocab or 2,
                   max_positions=max(2048, args.seq_len)).check(0)
    llm = LLM(args.target, mode="ar", dtype="bfloat16", device="cpu", prefix_cache_gb=0)
    if llm.tokenizer is None:
        raise UserError(f"{llm.model_path} has no tokenizer; train-draft needs one")
    target, tokenizer = llm.target, llm.tokenizer
    vocab_total = target.config.vocab_size
    if args.top_k > vocab_total:
        raise UserError(f"--top-k {args.top_k} is more than the target's {vocab_total} tokens")
    if args.init:
        model, kept, shape = trained_draft(user_path(args.init), vocab_total, tokenizer_fingerprint(tokenizer))
        if args.layers is not None:
            model, shape = grow_draft(model, args.layers, args.seed), replace(shape, layers=args.layers)
    else:
        shape = DraftShape(args.layers, args.hidden, args.intermediate, args.heads, args.kv_heads,
                           min(args.vocab or vocab_total, vocab_total), max_positions=max(2048, args.seq_len))
        shape.check(vocab_total)
    if args.seq_len > target.config.max_positions:  # labels past them would be the target's guesses
        raise UserError(f"--seq-len {args.seq_len} is past the target's {target.config.max_positions} positions")
    settings = TrainSettings(args.steps, args.batch_size, args.seq_len, args.lr, min(60, args.steps // 10 + 1),
                             seed=args.seed, checkpoint_every=args.checkpoint_every,
                             acceptance_at=tuple(args.acceptance_at), acceptance_weight=args.acceptance_weight)
    target_key = _target_key(llm.model_path, tokenizer)
    train_sources, genres = _data(args, llm, work, target_key)
    # a source at --repeat 0 is left out of the labels, the kept tokens and the record too
    train_sources = {name: seqs for name, seqs in train_sources.items() if repeat.get(name, 1)}
    if not train_sources:  # (the sources kept made no sequence)
        raise UserError("no training sequences: the sources --repeat keeps made none (--local-tokens, --answers "
                        "or the texts too short)")
    for name, seqs in train_sources.items():  # (prose at --repeat 0 is built for --continuations' passages)
        _log(f"{name}: {seqs.numel():,} training tokens")
    sequences, label_ids, label_logp = sources.labelled(target, train_sources, work, args.top_k, target_key)
    if args.data_only:
        _log(f"data ready in {work}")
        return 0

    if not args.init:
        kept = None if shape.vocab >= vocab_total else choose_vocabulary(sequences, shape.vocab, vocab_total,
                                                                         llm.eos_ids())
        model = init_draft(shape, target, kept, args.seed)
    if kept is None:
        to_draft, n_kept = torch.arange(vocab_total), vocab_total
    else:
        vocab = ReducedVocabulary(kept, vocab_total)  # the mapping the loaded draft will use
        to_draft, n_kept = vocab.to_draft, vocab.size
        for name, seqs in train_sources.items():
            _log(f"the {n_kept} kept tokens cover {(to_draft[seqs] < n_kept).float().mean().item():.1%} of {name}")

    trains = {k: v for k, v in asdict(settings).items() if k != "checkpoint_every"}  # (not how it trains)
    if not settings.acceptance_at:  # (the distillation loss alone: a run keeps the key it had before these)
        del trains["acceptance_at"], trains["acceptance_weight"]
    init_weights = _weights_digest(args.init) if args.init else None  # (its path may hold another draft later)
    run_key = fingerprint(target_key, sources.digest(sequences), args.top_k, asdict(shape), trains, repeat,
                          None if kept is None else sources.digest(torch.as_tensor(kept)),  # the rows' tokens
                          ORDER_VERSION, *([init_weights] if init_weights else []))
    per_sequence = torch.cat([torch.full((seqs.shape[0],), repeat.get(name, 1)) for name, seqs in train_sources.items()])
    losses = train(model, sequences, label_ids, label_logp, to_draft, n_kept, settings, work, run_key, per_sequence)
    mix = {name: seqs.numel() for name, seqs in train_sources.items()}
    export(model, out, kept, vocab_total, {
        "target_tokenizer": tokenizer_fingerprint(tokenizer), "shape": asdict(shape), "training": asdict(settings),
        "data_tokens": mix, "repeat": repeat, "arguments": {k: v for k, v in vars(args).items() if k not in ("func", "command")},
        "init_weights": init_weights, "run_key": run_key, "final_loss": sum(losses[-20:]) / len(losses[-20:]) if losses else _final_loss(out, run_key)})

    draft = load_model(out, "bfloat16")
    report = {"draft": str(out), "parameters": sum(p.numel() for p in model.parameters()),
              "bytes": sum(f.stat().st_size for f in out.iterdir()), "data_tokens": mix,
              "genres": evaluate_genres(draft, target, genres), "draft_ms_per_token": decode_ms_per_token(draft),
              "target_ms_per_token": decode_ms_per_token(target),
              "train_minutes_this_run": (time.time() - started) / 60}
    meta_path = out / "triforce_draft.json"
    meta = json.loads(meta_path.read_text())
    meta["heldout_eval"] = report
    write_whole(meta_path, json.dumps(meta, indent=1))  # the draft reads it
    print(json.dumps(report))
    return 0
