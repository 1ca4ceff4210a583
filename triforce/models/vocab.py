"""A draft that predicts only part of its target's vocabulary.

A draft trained by `triforce train-draft` may keep only the K tokens its target uses most (its output
head and embeddings then cost K rows instead of the target's V). Draft id i stands for target id
`token_ids[i]`; draft id K stands for every other target token on input and is never proposed. The
draft's distribution over the target vocabulary puts probability zero outside `token_ids`, which is
still exact speculative sampling: the verifier's residual covers those tokens.

The mapping lives in `triforce_draft.json` beside the draft's config.json, together with the identity
of the target it was trained for and how it was trained.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from .config import ModelLoadError

DRAFT_FILE = "triforce_draft.json"
log = logging.getLogger("triforce")


class ReducedVocabulary:
    def __init__(self, token_ids: torch.Tensor, target_vocab_size: int):
        k = token_ids.numel()
        if k == 0 or int(token_ids.max()) >= target_vocab_size or int(token_ids.min()) < 0:
            raise ModelLoadError(f"{DRAFT_FILE}: token ids must lie in [0, {target_vocab_size})")
        if torch.unique(token_ids).numel() != k:
            raise ModelLoadError(f"{DRAFT_FILE}: token ids repeat")
        self.token_ids = token_ids.long()
        self.target_vocab_size = target_vocab_size
        self.to_draft = torch.full((target_vocab_size,), k, dtype=torch.long)
        self.to_draft[self.token_ids] = torch.arange(k)

    @property
    def size(self) -> int:
        """Draft ids in use, not counting the shared id of all other tokens."""
        return self.token_ids.numel()

    def to(self, device: torch.device) -> "ReducedVocabulary":
        self.token_ids, self.to_draft = self.token_ids.to(device), self.to_draft.to(device)
        return self

    def encode(self, tokens: torch.Tensor) -> torch.Tensor:
        """Target ids -> draft ids (tokens outside the kept set share id `size`)."""
        return self.to_draft[tokens]

    def expand_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft logits [..., >= K] -> target-vocabulary logits [..., V], -inf outside the kept tokens."""
        out = logits.new_full((*logits.shape[:-1], self.target_vocab_size), float("-inf"))
        out[..., self.token_ids] = logits[..., : self.size]
        return out

    @classmethod
    def from_folder(cls, folder: Path, draft_vocab_size: int) -> "ReducedVocabulary | None":
        path = Path(folder) / DRAFT_FILE
        if not path.is_file():
            return None
        try:
            meta = json.loads(path.read_text())
            if "token_ids" not in meta:  # a draft over the target's whole vocabulary
                return None
            ids, target_vocab = meta["token_ids"], int(meta["target_vocab_size"])
            if not (isinstance(ids, list) and all(type(i) is int for i in ids)):  # (1.7 was cut to 1, silently)
                raise ValueError(f"token_ids must be a list of integers (got {str(ids)[:40]})")
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ModelLoadError(f"{path}: unreadable ({exc})") from exc
        if len(ids) + 1 != draft_vocab_size:
            raise ModelLoadError(f"{path}: {len(ids)} token ids for a draft of vocab_size {draft_vocab_size} "
                                 f"(expected vocab_size - 1)")
        return cls(torch.tensor(ids, dtype=torch.long), target_vocab)


def read_draft_metadata(folder: Path) -> dict:
    path = Path(folder) / DRAFT_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def tokenizer_fingerprint(tokenizer) -> str:
    """A short hash of a tokenizer's vocabulary: a draft records its target's, loading checks it."""
    import hashlib

    items = sorted(tokenizer.get_vocab().items())
    return hashlib.sha1(json.dumps(items).encode()).hexdigest()[:16]


def check_draft_vocabulary(draft, draft_path: Path, target_vocab: int, tokenizer) -> None:
    """Refuses a draft (a loaded model) whose tokens are not its target's, by the tokenizer a trained draft
    recorded, or else the draft folder's own. A draft whose embedding is padded to another number of rows
    than the target's over the same tokenizer (Qwen2.5-7B has 152,064 rows, -0.5B 151,936, for 151,665
    tokens) is given a ReducedVocabulary over the tokenizer's ids: it reads and proposes those only."""
    draft_vocab, draft_tokens = draft.output_vocab_size, None
    recorded = read_draft_metadata(draft_path).get("target_tokenizer") if tokenizer is not None else None
    if recorded is not None and recorded != tokenizer_fingerprint(tokenizer):
        raise ModelLoadError("draft was trained for a target with a different tokenizer")
    if tokenizer is not None and recorded is None:
        from transformers import AutoTokenizer

        try:
            draft_tokens = AutoTokenizer.from_pretrained(draft_path).get_vocab()
        except (OSError, ValueError, TypeError):
            pass  # a draft without a tokenizer: its rows must be the target's
        except Exception as exc:  # a damaged tokenizer.json (tokenizers and transformers raise KeyError, Exception)
            raise ModelLoadError(f"{draft_path}: the draft's tokenizer cannot be read ({type(exc).__name__}: "
                                 f"{exc})") from None
        if draft_tokens is None:  # (the rows alone say nothing: Llama-2's and Mistral's are 32,000 each)
            log.warning("the draft's tokens cannot be checked against the target's (%s has no tokenizer): a draft "
                        "of another tokenizer with as many rows runs, exactly, but its proposals are taken by "
                        "chance", draft_path)
        if draft_tokens is not None and draft_tokens != tokenizer.get_vocab():
            raise ModelLoadError(f"draft tokenizer differs from the target's ({len(draft_tokens)} tokens against "
                                 f"{len(tokenizer.get_vocab())}); the draft must share the target's vocabulary")
    if draft_vocab == target_vocab:
        return
    if recorded is not None:  # a trained draft over its target's tokenizer, for a target of other rows
        raise ModelLoadError(f"draft was trained for a target of {draft_vocab} vocabulary rows; this one has "
                             f"{target_vocab} (train it for this target)")
    tokens = 1 + max(draft_tokens.values()) if draft_tokens else 0
    if not draft_tokens or draft.vocab is not None or tokens > min(draft_vocab, target_vocab) or \
            tokens == draft_vocab < target_vocab:  # no draft row left to stand for the target's padding ids
        raise ModelLoadError(f"draft vocabulary ({draft_vocab} tokens) differs from the target's ({target_vocab}); "
                             "the draft must share the target's tokenizer")
    draft.vocab = ReducedVocabulary(torch.arange(tokens), target_vocab).to(draft.embed_tokens.weight.device)
