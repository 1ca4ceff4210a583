"""Which weights an LLM loads: the target, its draft (the one named, or the target's default), their
revisions, and the positions and end-of-sequence ids that follow from them. `ModelChoice` is a part of LLM
(api.py), which holds the `dtype`, `device`, `rope_scaling`, `target` and `tokenizer` these read."""
from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

from .config import MODES_WITH_DRAFT, ConfigError
from .models.config import ModelLoadError
from .models.hub import check_revision, refetch_hint, resolve_model
from .models.loader import load_model
from .models.vocab import check_draft_vocabulary

# Drafts for known targets: shipped inside the package (made by `triforce train-draft`; see docs/draft.md), or a
# known model of the same family (fetched like the target). For other targets without --draft, mode
# `triforce` falls back to `retrieval` with a one-line notice, and `auto` plans without a draft tier.
DEFAULT_DRAFTS: dict[str, Path | str] = {"smollm2": Path(__file__).parent / "drafts" / "smollm2",
                                   "qwen2.5-coder-1.5b": "qwen2.5-coder-0.5b"}
# `--draft self`: the target's own weights (the same tensors, not a second copy) over the draft tier's
# StreamingLLM cache, as MagicDec (arXiv 2408.11049) drafts: where a batch's KV caches outweigh the weights,
# a forward over a few hundred cached tokens costs a fraction of one over the whole context, and the
# target's own predictions agree with it far more often than a small draft's (docs/draft.md).
SELF_DRAFT = "self"


class ModelChoice:
    added_eos_ids: tuple[int, ...] = ()  # a generation_config folder's (generation_defaults.added_eos_ids)

    @staticmethod
    def _check_revisions(pairs: list[tuple[str | os.PathLike | None, str | None]], draft_given: bool,
                         draft_revision: str | None) -> None:
        """Before anything is fetched or loaded: each (model, revision) of `pairs` names a Hugging Face id
        where a revision is given (models/hub.check_revision), and a draft revision has a draft to pick."""
        if draft_revision is not None and not draft_given:  # (the default draft is a known name or a folder)
            raise ConfigError(f"draft_revision ({draft_revision}) picks a version of a draft model given by its "
                              "Hugging Face id, and no draft is given")
        for spec, version in pairs:
            check_revision(spec, version)

    def _choose_draft(self, model, draft, revision: str | None, mode: str) -> Path | None:
        """The draft's folder: the one named (`draft`, at `revision`), else the target's default where the mode
        runs a draft; None without one, or where the default (not one the user named) cannot be had (offline,
        say) and the mode runs without it (auto; triforce, as retrieval): why, in `draft_unavailable`."""
        self.draft_unavailable: str | None = None
        self.self_draft = False
        if mode not in MODES_WITH_DRAFT:
            return None
        if draft == SELF_DRAFT:
            if revision is not None:
                raise ConfigError(f"draft_revision ({revision}) picks a version of a draft model given by its Hugging "
                                  f"Face id; the draft {SELF_DRAFT!r} is the target's own weights")
            self.self_draft = True
            return None
        given = draft is not None
        if draft is None:
            draft = DEFAULT_DRAFTS.get(str(model))  # a folder in the package, or a known model's name
            if isinstance(draft, Path) and not (draft / "config.json").is_file():
                # (a train-draft export killed between its two renames leaves the draft it replaced beside)
                old = draft.with_name(draft.name + ".old")
                draft = old if (old / "config.json").is_file() else None
        if draft is None:
            if mode == "draft":
                raise ConfigError("mode 'draft' needs a draft model (--draft; `--draft self` drafts with the target's "
                                  "own weights over a streaming cache)")
            return None
        self._default_draft = None if given or mode == "draft" else draft
        try:
            return resolve_model(draft, revision)
        except (ModelLoadError, OSError) as exc:  # (OSError: a disk that filled as it was fetched)
            if self._default_draft is None:
                raise
            return self._without_default_draft("is not to be had", exc)

    def _load_draft(self):
        """The draft at draft_path, loaded, its vocabulary checked against the target's tokenizer; a
        default draft (not one the user named) that fails either is left out, as one not to be had. The
        target itself where the draft is `self`."""
        if self.self_draft:
            return self.target
        if self.draft_path is None:
            return None
        try:
            draft = self._load(self.draft_path)
            check_draft_vocabulary(draft, self.draft_path, self.target.config.vocab_size, self.tokenizer)
            draft.rope.bound(self.target.config.max_positions)  # (it runs at the target's positions)
        except ModelLoadError as exc:
            if self._default_draft is None:  # (said of the draft: --rope-scaling, say, applies to both)
                raise ModelLoadError(f"the draft: {exc}") from None
            self._without_default_draft("cannot serve this target", exc)
            self.draft_path = None
            return None
        return draft

    @property
    def draft_name(self) -> str | None:
        """The draft as a run's record names it: its folder, `self`, or None without one."""
        return SELF_DRAFT if self.self_draft else (str(self.draft_path) if self.draft_path else None)

    def _without_default_draft(self, why: str, exc: Exception) -> None:
        self.draft_unavailable = f"the default draft {self._default_draft} {why} ({exc})"
        print(f"triforce: {self.draft_unavailable}; running without a draft", file=sys.stderr)

    def _bound_positions(self, max_model_len: int | None) -> None:
        """vLLM's max_model_len: the target's positions bounded below the model's own; its RoPE table holds
        those it may use (a sliding window's too)."""
        if max_model_len is not None:
            own = self.target.config.max_positions
            if max_model_len > own:
                raise ConfigError(f"max_model_len {max_model_len} is more than the model's {own} positions "
                                  f"(rope_scaling stretches them)")
            self.target.config = replace(self.target.config, position_limit=max_model_len)
        self.target.rope.bound(self.target.config.max_positions)

    def _load(self, folder: Path):
        try:
            return load_model(folder, self.dtype, self.device, rope_scaling=self.rope_scaling)
        except ModelLoadError as exc:
            raise ModelLoadError(f"{exc}{refetch_hint(folder)}") from None

    def eos_ids(self) -> tuple[int, ...]:
        """The ids that end generation: the model's end-of-sequence ids, the tokenizer's and those of a
        generation_config folder (within the vocabulary: no logit row gives the others)."""
        vocab = self.target.config.vocab_size
        ids = set(self.target.config.eos_token_ids) | {i for i in self.added_eos_ids if 0 <= i < vocab}
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return tuple(sorted(ids))

    def main_eos_id(self) -> int | None:
        """The end of sequence that ends an answer without a stop_reason: the tokenizer's (else the model's
        first). As in vLLM, the others (generation_config's: Qwen2.5's <|endoftext|>) are stop token ids."""
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            return self.tokenizer.eos_token_id
        return next(iter(self.target.config.eos_token_ids), None)
