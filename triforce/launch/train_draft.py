"""`triforce train-draft`: the command line of draft distillation (see triforce/draft/)."""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from ..draft.data import TargetLabels, choose_vocabulary, read_texts, split_heldout, to_sequences
from ..draft.evaluate import decode_ms_per_token, evaluate
from ..draft.train import DraftShape, TrainSettings, export, fingerprint, init_draft, train
from ..errors import UserError
from ..models.hub import DEFAULT_MODEL, resolve_model, triforce_home
from ..models.loader import load_model
from ..models.vocab import ReducedVocabulary, tokenizer_fingerprint

_SHAPE, _TRAIN = DraftShape(), TrainSettings()


def add_train_draft_parser(sub) -> None:
    p = sub.add_parser(
        "train-draft", help="distil a small tier-1 draft LM from a target",
        description="Train a small Llama-architecture draft that shares the target's tokenizer, by "
                    "distillation from the target's next-token distributions on long text. The target's "
                    "top-k log-probabilities are computed once and cached; training checkpoints every "
                    "--checkpoint-every steps, and rerunning the same command resumes. Ends with a held-out "
                    "evaluation (top-1 agreement and expected acceptance at temperature 0.6).")
    p.add_argument("--target", default=DEFAULT_MODEL, help="target model folder, .gguf or known name")
    p.add_argument("--text", nargs="+", required=True, help="UTF-8 training text files")
    p.add_argument("--heldout", nargs="*", default=None,
                   help="held-out text files (default: the last --heldout-fraction of each --text file)")
    p.add_argument("--heldout-fraction", type=float, default=0.03)
    p.add_argument("--heldout-sequences", type=int, default=16, help="held-out sequences evaluated")
    p.add_argument("--out", required=True, help="folder the draft is written to (replaced)")
    p.add_argument("--work-dir", default=None,
                   help="cache of target labels and checkpoints (default $TRIFORCE_HOME/train-draft/<out name>)")
    shape = p.add_argument_group("draft shape (knobs for a smaller, faster draft)")
    shape.add_argument("--layers", type=int, default=_SHAPE.layers)
    shape.add_argument("--hidden", type=int, default=_SHAPE.hidden)
    shape.add_argument("--intermediate", type=int, default=_SHAPE.intermediate)
    shape.add_argument("--heads", type=int, default=_SHAPE.heads)
    shape.add_argument("--kv-heads", type=int, default=_SHAPE.kv_heads)
    shape.add_argument("--vocab", type=int, default=_SHAPE.vocab,
                       help="target tokens the draft can propose: the most frequent in the text (0 = all)")
    tr = p.add_argument_group("training")
    tr.add_argument("--steps", type=int, default=_TRAIN.steps)
    tr.add_argument("--batch-size", type=int, default=_TRAIN.batch_size, help="sequences per step")
    tr.add_argument("--seq-len", type=int, default=_TRAIN.seq_len)
    tr.add_argument("--lr", type=float, default=_TRAIN.lr)
    tr.add_argument("--top-k", type=int, default=32, help="target log-probabilities kept per position")
    tr.add_argument("--max-train-tokens", type=int, default=2_000_000, help="cap on training text tokens")
    tr.add_argument("--seed", type=int, default=_TRAIN.seed)
    tr.add_argument("--checkpoint-every", type=int, default=_TRAIN.checkpoint_every)
    p.set_defaults(func=run_train_draft)


def run_train_draft(args) -> int:
    from transformers import AutoTokenizer

    started = time.time()
    target_path = resolve_model(args.target)
    target = load_model(target_path, "bfloat16")
    try:
        tokenizer = AutoTokenizer.from_pretrained(target_path)
    except (OSError, ValueError, TypeError) as exc:
        raise UserError(f"{target_path} has no tokenizer; train-draft needs one ({exc})") from exc
    vocab_total = target.config.vocab_size
    shape = DraftShape(args.layers, args.hidden, args.intermediate, args.heads, args.kv_heads,
                       min(args.vocab or vocab_total, vocab_total), max_positions=max(2048, args.seq_len))
    shape.check(vocab_total)
    settings = TrainSettings(args.steps, args.batch_size, args.seq_len, args.lr, min(60, args.steps // 10 + 1),
                             seed=args.seed, checkpoint_every=args.checkpoint_every)
    texts = read_texts(args.text)
    if args.heldout is None:
        texts, heldout_texts = split_heldout(tokenizer, texts, args.heldout_fraction)
    else:
        heldout_texts = read_texts(args.heldout)
    sequences = to_sequences(tokenizer, texts, args.seq_len)
    sequences = sequences[: max(1, args.max_train_tokens // args.seq_len)]
    heldout = to_sequences(tokenizer, heldout_texts, args.seq_len)[: args.heldout_sequences]
    print(f"train-draft: {sequences.numel():,} training tokens, {heldout.numel():,} held out", file=sys.stderr)

    out = Path(args.out)
    work = Path(args.work_dir) if args.work_dir else triforce_home() / "train-draft" / out.resolve().name
    data_key = fingerprint(str(target_path.resolve()), sequences.shape, int(sequences.sum()), args.top_k)
    labels = TargetLabels(work / f"labels-{data_key}", args.top_k)
    labels.compute(target, sequences)
    label_ids, label_logp = labels.load(sequences.shape[0])

    eos = tuple(target.config.eos_token_ids) + tuple(t for t in (tokenizer.eos_token_id,) if t is not None)
    kept = None if shape.vocab >= vocab_total else choose_vocabulary(sequences, shape.vocab, vocab_total, eos)
    if kept is None:
        to_draft, n_kept = torch.arange(vocab_total), vocab_total
    else:
        vocab = ReducedVocabulary(kept, vocab_total)  # the mapping the loaded draft will use
        to_draft, n_kept = vocab.to_draft, vocab.size
        covered = (to_draft[sequences] < n_kept).float().mean().item()
        print(f"train-draft: the {n_kept} kept tokens cover {covered:.1%} of the training text", file=sys.stderr)

    model = init_draft(shape, target, kept, args.seed)
    run_key = fingerprint(data_key, asdict(shape), asdict(settings))
    losses = train(model, sequences, label_ids, label_logp, to_draft, n_kept, settings, work, run_key)
    export(model, out, kept, vocab_total, {
        "target_tokenizer": tokenizer_fingerprint(tokenizer), "shape": asdict(shape), "training": asdict(settings),
        "arguments": {k: v for k, v in vars(args).items() if k not in ("func", "command")},
        "final_loss": sum(losses[-20:]) / len(losses[-20:]) if losses else None})

    draft = load_model(out, "bfloat16")
    report = {"draft": str(out), "parameters": sum(p.numel() for p in model.parameters()),
              "bytes": sum(f.stat().st_size for f in out.iterdir()),
              **evaluate(draft, target, heldout), "draft_ms_per_token": decode_ms_per_token(draft),
              "target_ms_per_token": decode_ms_per_token(target), "train_minutes_this_run": (time.time() - started) / 60}
    meta_path = out / "triforce_draft.json"
    meta = json.loads(meta_path.read_text())
    meta["heldout_eval"] = report
    meta_path.write_text(json.dumps(meta, indent=1))
    print(json.dumps(report))
    return 0
