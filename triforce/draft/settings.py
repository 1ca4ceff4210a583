"""The settings of draft distillation (train.py, generated.py), apart from them so that `triforce train-draft
--help` shows their defaults without loading torch."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import UserError


@dataclass(frozen=True)
class DraftShape:
    layers: int = 4
    hidden: int = 384
    intermediate: int = 1024
    heads: int = 6
    kv_heads: int = 2
    vocab: int = 8192  # target tokens kept; >= the target's vocabulary keeps them all
    max_positions: int = 2048

    def check(self, target_vocab: int) -> None:
        # (named by train-draft's flags, as TrainSettings' checks are)
        for name in ("layers", "hidden", "intermediate", "heads", "kv_heads"):
            if getattr(self, name) < 1:
                raise UserError(f"--{name.replace('_', '-')} must be >= 1 (got {getattr(self, name)})")
        if self.vocab < 2:  # (one token's centred embedding is zero: NaN weights, and "lower --lr" at step 1)
            raise UserError(f"--vocab must keep at least 2 tokens (got {self.vocab})")
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise UserError(f"--hidden ({self.hidden}) must divide by --heads ({self.heads}) and --heads by "
                            f"--kv-heads ({self.kv_heads})")
        if (self.hidden // self.heads) % 2:  # RoPE turns pairs of dimensions (a traceback at the first step)
            raise UserError(f"--hidden / --heads ({self.hidden} / {self.heads}) must be even: RoPE turns pairs")


@dataclass(frozen=True)
class TrainSettings:
    steps: int = 1200
    batch_size: int = 4
    seq_len: int = 1024
    lr: float = 2e-3
    warmup: int = 60
    weight_decay: float = 0.01
    seed: int = 0
    checkpoint_every: int = 50
    # temperatures whose rejection chance (train.rejection_loss) is added to the loss, each times the weight
    acceptance_at: tuple[float, ...] = ()
    acceptance_weight: float = 1.0


@dataclass(frozen=True)
class GenerationSettings:
    samples: int = 1024
    max_tokens: int = 384
    temperatures: tuple[float, ...] = (0.0, 0.7, 1.0)
    batch: int = 32  # samples generated together (one shard)
    heldout: bool = False  # answers to the held-out subjects' prompts
    seed: int = 0
