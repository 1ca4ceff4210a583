"""Distil a small Llama-architecture draft from a target.

The draft learns the target's next-token distribution (soft cross-entropy against the target's cached
top-k probabilities, renormalised over the tokens the draft keeps) on long text. Training uses
transformers' LlamaForCausalLM, so the result is a plain Hugging Face folder; a reduced vocabulary adds
`triforce_draft.json` (see models/vocab.py). Runs resume from `work_dir/checkpoint.pt`.
"""
from __future__ import annotations

import hashlib
import json
import math
import shutil
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from ..errors import UserError
from ..files import load_cached, save_whole
from ..kernels.cpu import native_bf16
from ..models.config import ModelConfig
from ..models.folders import umask_modes
from ..models.llama import LlamaModel
from ..models.vocab import DRAFT_FILE, ReducedVocabulary, read_draft_metadata
from .settings import DraftShape, TrainSettings


def fingerprint(*parts) -> str:
    return hashlib.sha1(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:12]


def hf_config(shape: DraftShape, target: ModelConfig, vocab_size: int):
    from transformers import AutoConfig

    return AutoConfig.for_model(
        "llama", vocab_size=vocab_size, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
        max_position_embeddings=shape.max_positions, rms_norm_eps=target.rms_norm_eps,
        rope_theta=target.rope_theta, tie_word_embeddings=True, bos_token_id=None, eos_token_id=None)


def init_draft(shape: DraftShape, target: LlamaModel, kept: torch.Tensor | None, seed: int):
    """A random draft whose embeddings start as the target's (of the kept tokens) projected onto their
    top principal directions: a cheap head start on which tokens resemble which."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    vocab_size = target.config.vocab_size if kept is None else kept.numel() + 1
    model = LlamaForCausalLM(hf_config(shape, target.config, vocab_size))
    emb = target.embed_tokens.weight.detach().float().cpu()
    emb = emb if kept is None else emb[kept]
    centred = emb - emb.mean(0)
    _, _, v = torch.linalg.svd(centred, full_matrices=False)
    width = min(shape.hidden, v.shape[0])
    projected = centred @ v[:width].T
    projected *= model.config.initializer_range / projected.std()
    with torch.no_grad():
        table = model.model.embed_tokens.weight
        table[: emb.shape[0], :width] = projected
        table[: emb.shape[0], width:] = 0
    return model


def trained_draft(folder: Path, target_vocab: int, target_tokenizer: str):
    """A draft train-draft wrote, to train on from (`--init`) -> (float32 model, its kept target ids or None
    for all, its DraftShape). Refused unless it was trained for this target's tokenizer and vocabulary."""
    from transformers import LlamaForCausalLM

    meta = read_draft_metadata(folder)
    if meta.get("target_tokenizer") != target_tokenizer or meta.get("target_vocab_size") != target_vocab:
        raise UserError(f"--init {folder}: not a draft train-draft made for this target (its {DRAFT_FILE} names "
                        "another tokenizer or vocabulary, or is missing)")
    model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32)
    vocab = ReducedVocabulary.from_folder(folder, model.config.vocab_size)
    c = model.config
    shape = DraftShape(c.num_hidden_layers, c.hidden_size, c.intermediate_size, c.num_attention_heads,
                       c.num_key_value_heads, target_vocab if vocab is None else vocab.size, c.max_position_embeddings)
    return model, None if vocab is None else vocab.token_ids, shape


def grow_draft(model, layers: int, seed: int):
    """A deeper draft that starts out computing exactly what `model` computes: each of its layers followed by
    new ones (layers / its layer count in all), whose attention and MLP output projections start at zero, so
    each adds nothing to the residual stream until training moves them (a grown model, as Net2Net's deeper
    nets start as the shallower one). The new ones' other weights start as a new draft's do."""
    from transformers import LlamaForCausalLM

    old = len(model.model.layers)
    if layers % old or layers <= old:
        raise ValueError(f"a draft of {old} layers grows to a multiple of {old} above it, not {layers}")
    torch.manual_seed(seed)
    config = model.config.to_dict() | {"num_hidden_layers": layers}
    grown = LlamaForCausalLM(type(model.config).from_dict(config)).float()
    with torch.no_grad():
        grown.model.embed_tokens.load_state_dict(model.model.embed_tokens.state_dict())
        grown.model.norm.load_state_dict(model.model.norm.state_dict())
        per = layers // old
        for i, layer in enumerate(grown.model.layers):
            if i % per == 0:
                layer.load_state_dict(model.model.layers[i // per].state_dict())
            else:
                layer.self_attn.o_proj.weight.zero_()
                layer.mlp.down_proj.weight.zero_()
    return grown


def lr_at(step: int, s: TrainSettings) -> float:
    if step < s.warmup:
        return s.lr * (step + 1) / s.warmup
    progress = (step - s.warmup) / max(1, s.steps - s.warmup)
    return s.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def distillation_loss(logits: torch.Tensor, label_ids: torch.Tensor, label_logp: torch.Tensor,
                      kept: int) -> torch.Tensor:
    """Soft cross-entropy of the draft's distribution over its kept tokens against the target's top-k
    probabilities renormalised over those tokens. label_ids are draft ids (>= kept: not kept)."""
    logq = torch.log_softmax(logits[..., :kept].float(), dim=-1)
    p = label_logp.float().exp() * (label_ids < kept)
    p = p / p.sum(-1, keepdim=True).clamp_min(1e-9)
    return -(p * logq.gather(-1, label_ids.clamp_max(kept - 1))).sum(-1).mean()


def rejection_loss(logits: torch.Tensor, label_ids: torch.Tensor, label_logp: torch.Tensor, kept: int,
                   temperature: float) -> torch.Tensor:
    """The chance that speculative sampling at `temperature` rejects the draft's token, against the target's
    top-k: 1 - sum over them of min(p_T, q_T), with p_T the target's top-k probabilities sharpened by 1 / T
    and renormalised over them (the rest of its mass, small once sharpened, left out) and q_T the draft's
    over its kept tokens (one it does not keep is never proposed). What evaluate.py's expected acceptance
    measures, as a loss: DistillSpec (arXiv 2310.08461) found the divergence that best aligns a draft
    depends on the decoding, and total variation is this one's."""
    p = torch.softmax(label_logp.float() / temperature, dim=-1)
    q = torch.softmax(logits[..., :kept].float() / temperature, dim=-1).gather(-1, label_ids.clamp_max(kept - 1))
    return 1 - (torch.minimum(p, q) * (label_ids < kept)).sum(-1).mean()


def draft_loss(logits: torch.Tensor, label_ids: torch.Tensor, label_logp: torch.Tensor, kept: int,
               settings: TrainSettings) -> torch.Tensor:
    """The distillation loss, plus the rejection chance at each of settings.acceptance_at times its weight."""
    loss = distillation_loss(logits, label_ids, label_logp, kept)
    for temperature in settings.acceptance_at:
        loss = loss + settings.acceptance_weight * rejection_loss(logits, label_ids, label_logp, kept, temperature)
    return loss


ORDER_VERSION = 2  # how sample_order orders (a run's key holds it: a checkpoint resumes in its own order)


def sample_order(repeats: torch.Tensor, count: int, seed: int) -> torch.Tensor:
    """`count` sequence indices to train on, in passes: in each pass, shuffled, sequence i comes repeats[i]
    times (0: never). Depends only on its arguments, so a resumed run continues the same order. (The passes
    were shuffled together: over one pass's worth of steps, a quarter of the sequences went unseen.)"""
    pool = torch.repeat_interleave(torch.arange(repeats.numel()), repeats)
    if pool.numel() == 0:
        raise UserError("every training sequence has a repeat count of 0: nothing to train on")
    generator = torch.Generator().manual_seed(seed)
    passes = [pool[torch.randperm(pool.numel(), generator=generator)] for _ in range(math.ceil(count / pool.numel()))]
    return torch.cat(passes)[:count] if passes else pool[:0]


def train(model, sequences: torch.Tensor, label_ids: torch.Tensor, label_logp: torch.Tensor,
          to_draft: torch.Tensor, kept: int, settings: TrainSettings, work_dir: Path, run_key: str,
          repeats: torch.Tensor | None = None) -> list[float]:
    """Trains in place, resuming from work_dir/checkpoint-<run_key>.pt (runs with other settings keep
    their own checkpoints beside it and share the cached labels). `repeats` weighs the sequences (see
    `sample_order`; default once each per pass). Returns this invocation's losses."""
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    rest = [p for n, p in model.named_parameters() if p.dim() < 2]
    optim = torch.optim.AdamW([{"params": decay, "weight_decay": settings.weight_decay},
                               {"params": rest, "weight_decay": 0.0}], lr=settings.lr, betas=(0.9, 0.95))
    ckpt_path = work_dir / f"checkpoint-{run_key}.pt"
    start = 0
    ckpt = load_cached(ckpt_path)
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        optim.load_state_dict(ckpt["optim"])
        start = ckpt["step"]
        tqdm.write(f"train-draft: resuming at step {start} of {settings.steps} from {ckpt_path}", file=sys.stderr)
    n = sequences.shape[0]
    repeats = torch.ones(n, dtype=torch.long) if repeats is None else repeats
    order = sample_order(repeats, settings.steps * settings.batch_size, settings.seed)
    # bfloat16 products where the CPU computes them natively; elsewhere (AVX2 only) torch's bfloat16 matrix
    # products run far slower than float32's (kernels/cpu.py, native_bf16)
    bfloat16 = sequences.device.type == "cpu" and native_bf16()
    model.train()
    losses = []
    bar = tqdm(total=settings.steps, initial=start, desc="train draft", unit="step")
    for step in range(start, settings.steps):
        batch = order[step * settings.batch_size:(step + 1) * settings.batch_size]
        for group in optim.param_groups:
            group["lr"] = lr_at(step, settings)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bfloat16):
            logits = model(input_ids=to_draft[sequences[batch]]).logits
        loss = draft_loss(logits, to_draft[label_ids[batch].long()], label_logp[batch], kept, settings)
        optim.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if not (torch.isfinite(loss) and torch.isfinite(norm)):  # one such step turned every weight into NaN,
            # and every checkpoint after it: the run trained on, and its export replaced a good draft
            saved = _saved(start, step, settings)
            raise UserError(f"train-draft: the loss (or its gradient) is not finite at step {step + 1} "
                            f"({loss.item()}): a lower --lr trains anew (it is a setting of the run)"
                            + (f"; {ckpt_path.name} keeps step {saved}" if saved else ""))
        optim.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
        bar.update(1)
        if (step + 1) % settings.checkpoint_every == 0 or step + 1 == settings.steps:
            save_whole(ckpt_path, {"step": step + 1, "model": model.state_dict(), "optim": optim.state_dict()})
    bar.close()
    model.eval()
    return losses


def _saved(start: int, step: int, settings: TrainSettings) -> int:
    """The step the checkpoint holds when step `step` (from 0) of a run resumed at `start` fails."""
    return max(start, step // settings.checkpoint_every * settings.checkpoint_every)


def export(model, out: Path, kept: torch.Tensor | None, target_vocab: int, metadata: dict) -> None:
    """Writes the draft as a bfloat16 Hugging Face folder (+ triforce_draft.json); a model whose weights are
    not all finite (a checkpoint an older run trained into NaN) is refused before `out` is replaced."""
    if not all(torch.isfinite(p).all() for p in model.parameters()):
        raise UserError(f"train-draft: the trained draft's weights are not all finite; {out} is left as it was")
    tmp, old = out.with_name(out.name + ".partial"), out.with_name(out.name + ".old")
    if old.exists() and not out.exists():  # an export killed between its two renames: the draft it replaced
        old.rename(out)
    shutil.rmtree(tmp, ignore_errors=True)
    model.to(torch.bfloat16).save_pretrained(tmp, safe_serialization=True)
    model.float()
    info = {"format": 1, "target_vocab_size": target_vocab, **metadata}
    if kept is not None:
        info["token_ids"] = kept.tolist()
    (tmp / DRAFT_FILE).write_text(json.dumps(info, indent=1))
    umask_modes(tmp)
    shutil.rmtree(old, ignore_errors=True)  # (by renames: killed between deleting the old draft and renaming
    if out.exists():  # the new one in, a run left neither, and the default model ran without a draft)
        out.rename(old)
    try:
        tmp.rename(out)
    except OSError:
        if old.exists() and not out.exists():
            old.rename(out)
        raise
    shutil.rmtree(old, ignore_errors=True)

