"""The data mix a draft trains and is evaluated on: named sources of token sequences (long prose, code and
documentation installed on the machine, the target's own answers to varied instructions and its own
continuations of the prose), each labelled
by the target and cached on its own, so that adding a source or changing one's size leaves the others'
labels in place."""
from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

import torch

from ..files import load_cached, save_whole
from .data import TargetLabels, leading_sequences, pack
from .generated import GeneratedSamples, GenerationSettings, Passages
from .local_text import SELECTION, installed_texts
from .train import fingerprint

HELDOUT_ANSWER_TOKENS = 256  # a guess at an answer's tokens with its prompt, to size the held-out answers


def prose(tokenizer, texts: list[str], seq_len: int, max_tokens: int) -> torch.Tensor:
    """The first max_tokens of the texts (at least one sequence), packed into sequences."""
    return leading_sequences(tokenizer, texts, seq_len, max(1, max_tokens // seq_len), tokenizer.eos_token_id)


def installed(tokenizer, tokens: int, seq_len: int, work: Path, target_key: str,
              heldout: bool = False) -> torch.Tensor:
    """Up to `tokens` tokens of installed source code and documentation (draft/local_text.py), chosen once
    and kept in work/, so that installing a package later does not change a run's data."""
    path = work / f"installed-{fingerprint(target_key, tokens, seq_len, heldout, SELECTION)}.pt"
    cached = load_cached(path)
    if cached is not None:
        return cached
    id_lists, total = [], 0
    for text in installed_texts(heldout):
        if total >= tokens + seq_len:  # a separator per file: a little more than asked for
            break
        id_lists.append(tokenizer(text).input_ids)
        total += len(id_lists[-1]) + 1
    sequences = pack(id_lists, seq_len, tokenizer.eos_token_id)[: tokens // seq_len]
    work.mkdir(parents=True, exist_ok=True)
    save_whole(path, sequences)
    return sequences


def _generated(llm, folder: Path, settings: GenerationSettings, source: Passages | None, seq_len: int) -> torch.Tensor:
    """The target's text after the source's prompts (generated once into `folder`, then reused), packed
    into sequences. Asking for more samples later keeps the ones generated (sample i does not depend on how
    many there are)."""
    samples = GeneratedSamples(folder, settings, source)
    samples.generate(llm)
    return pack(samples.token_lists(), seq_len, llm.tokenizer.eos_token_id)


def answers(llm, work: Path, settings: GenerationSettings, seq_len: int, target_key: str) -> torch.Tensor:
    """The target's answers to draft/prompts.py's instructions, packed into sequences."""
    return _generated(llm, work / f"answers-{fingerprint(target_key, replace(settings, samples=0))}", settings,
                      None, seq_len)


def continuations(llm, work: Path, settings: GenerationSettings, prose_sequences: torch.Tensor, passage: int,
                  seq_len: int, target_key: str) -> torch.Tensor:
    """The target's continuations of passages of `passage` tokens cut from the prose, each with its passage,
    packed into sequences: the text the target writes after prose, which the draft proposes in the engine."""
    key = fingerprint(target_key, replace(settings, samples=0), digest(prose_sequences), passage)
    return _generated(llm, work / f"continuations-{key}", settings, Passages(prose_sequences, passage, settings.seed),
                      seq_len)


def heldout_genres(llm, work: Path, prose_sets: dict[str, torch.Tensor], sequences: int, seq_len: int,
                   local: bool, answer_settings: GenerationSettings | None, target_key: str,
                   continued: GenerationSettings | None = None, passage: int = 0) -> dict[str, torch.Tensor]:
    """The held-out evaluation sets, `sequences` rows each: every named prose (`prose_sets`, built already),
    `code` from held-out installed packages (when `local`), `chat`, the target's answers on held-out
    subjects (when `answer_settings`; about HELDOUT_ANSWER_TOKENS per answer with its prompt sizes how many),
    and `continuations`, the target's continuations of passages of the held-out prose (when `continued`
    and there is held-out prose)."""
    tokenizer, tokens = llm.tokenizer, sequences * seq_len
    genres = dict(prose_sets)
    if local:
        genres["code"] = installed(tokenizer, tokens, seq_len, work, target_key, heldout=True)
    if answer_settings is not None:
        held = replace(answer_settings, samples=max(answer_settings.batch, tokens // HELDOUT_ANSWER_TOKENS),
                       heldout=True)
        genres["chat"] = answers(llm, work, held, seq_len, target_key)[:sequences]
    if continued is not None and prose_sets:
        held = replace(continued, samples=max(continued.batch, tokens // (passage + continued.max_tokens) + 1),
                       heldout=True)
        prose = torch.cat(list(prose_sets.values()))
        genres["continuations"] = continuations(llm, work, held, prose, passage, seq_len, target_key)[:sequences]
    return genres


def digest(sequences: torch.Tensor) -> str:
    """Names a tensor by its shape and bytes (the bytes alone: sequences of 512 and 1024 tokens cut from one
    stream matched, and labels made for one were loaded for the other)."""
    return hashlib.sha1(repr(tuple(sequences.shape)).encode() + sequences.numpy().tobytes()).hexdigest()


def labelled(target, sources: dict[str, torch.Tensor], work: Path, top_k: int, target_key: str):
    """Every source's target labels (computed or loaded) -> (sequences, label ids, label log-probs), the
    sources one after another."""
    parts = []
    for name, sequences in sources.items():
        key = fingerprint(target_key, name, digest(sequences), top_k)
        labels = TargetLabels(work / f"labels-{name}-{key}", top_k)
        labels.compute(target, sequences)
        parts.append((sequences, *labels.load(sequences.shape[0])))
    return tuple(torch.cat(column) for column in zip(*parts))
