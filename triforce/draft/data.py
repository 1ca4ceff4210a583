"""Training data for a draft: the target's tokens of texts packed into sequences, the vocabulary the
draft keeps, and the target's top-k next-token log-probabilities, computed once and cached on disk in
shards so that an interrupted run resumes where it stopped."""
from __future__ import annotations

from pathlib import Path

import torch
from tqdm import tqdm

from ..cache.full import FullKVCache
from ..errors import UserError
from ..files import load_cached, read_user_text, save_whole, user_path
from ..models.llama import LlamaModel

TOKEN_MARGIN = 64  # tokens past those asked for that a cut prefix must hold (see leading_ids)


def read_texts(paths: list[str | Path]) -> list[str]:
    texts = []
    for path in paths:
        try:
            texts.append(read_user_text(path))
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"cannot read text file {path}: {exc}") from exc
    return texts


def check_readable(paths: list[str | Path]) -> None:
    """A UserError naming the first of `paths` that cannot be opened: said before a target loads for them."""
    for path in paths:
        try:
            with user_path(path).open("rb"):
                pass
        except OSError as exc:
            raise UserError(f"cannot read text file {path}: {exc.strerror or exc}") from None


def pack(id_lists: list[list[int]], seq_len: int, separator: int | None = None) -> torch.Tensor:
    """The lists of ids one after another (`separator` between two that do not end with it) cut into
    whole sequences of seq_len -> [N, seq_len] int64 (the remainder dropped)."""
    stream: list[int] = []
    for ids in id_lists:
        if separator is not None and stream and stream[-1] != separator:
            stream.append(separator)
        stream += ids
    usable = len(stream) // seq_len * seq_len
    return torch.tensor(stream[:usable], dtype=torch.long).view(-1, seq_len)


def leading_ids(tokenizer, text: str, tokens: int) -> list[int]:
    """The ids of the text, at least its first `tokens` of them as the whole text would give them: a
    prefix cut at a line break is tokenized, growing until it holds `tokens` and a margin (a cut changes
    only the tokens just before it), so a corpus far larger than asked for is not tokenized whole."""
    chars = (tokens + TOKEN_MARGIN) * 8
    while chars < len(text):
        cut = text.rfind("\n", 0, chars)
        ids = tokenizer(text[:cut if cut > 0 else chars]).input_ids
        if len(ids) >= tokens + TOKEN_MARGIN:
            return ids[:tokens]
        chars *= 2
    return tokenizer(text).input_ids


def leading_sequences(tokenizer, texts: list[str], seq_len: int, count: int,
                      separator: int | None = None) -> torch.Tensor:
    """The first `count` whole sequences of seq_len that `pack` makes of the texts' tokens (fewer where
    the texts hold fewer), tokenizing only as much of them as those take."""
    id_lists, total = [], 0
    for text in texts:
        if total >= count * seq_len:
            break
        id_lists.append(leading_ids(tokenizer, text, count * seq_len - total))
        total += len(id_lists[-1])  # separators uncounted: the stream holds at least this many
    sequences = pack(id_lists, seq_len, separator)[:count]
    if sequences.shape[0] == 0:
        raise UserError(f"the text holds no complete sequence of {seq_len} tokens (about "
                        f"{sum(map(len, id_lists))}): give more text or a lower --seq-len")
    return sequences


def split_heldout(tokenizer, texts: list[str], fraction: float) -> tuple[list[str], list[str]]:
    """The last `fraction` of each text (cut at a line break) is held out for evaluation."""
    train, heldout = [], []
    for text in texts:
        cut = text.rfind("\n", 0, int(len(text) * (1 - fraction)))
        cut = cut if cut > 0 else int(len(text) * (1 - fraction))
        train.append(text[:cut])
        heldout.append(text[cut:])
    return train, heldout


def choose_vocabulary(sequences: torch.Tensor, size: int, target_vocab: int, always: tuple[int, ...]) -> torch.Tensor:
    """The `size` target ids the draft keeps: `always` (end-of-sequence and such) plus the most frequent
    tokens of the training text. Returns them sorted."""
    counts = torch.bincount(sequences.flatten(), minlength=target_vocab).float()
    counts[list(always)] = float("inf")
    return torch.topk(counts, size).indices.sort().values


class TargetLabels:
    """The target's top-k log-probabilities at every position of every training sequence."""

    SHARD = 16  # sequences per cached file

    def __init__(self, folder: Path, top_k: int):
        self.folder, self.top_k = Path(folder), top_k
        self.folder.mkdir(parents=True, exist_ok=True)

    def _shard_path(self, index: int) -> Path:
        return self.folder / f"labels-{index:05d}.pt"

    def compute(self, target: LlamaModel, sequences: torch.Tensor) -> None:
        n, seq_len = sequences.shape
        shards = range((n + self.SHARD - 1) // self.SHARD)
        todo = [s for s in shards if not self._shard_path(s).is_file()]  # (a damaged one: `load` removes it)
        if not todo:
            return
        cache = FullKVCache(target.config, seq_len, target.dtype, target.device)
        rows = sum(min(self.SHARD, n - s * self.SHARD) for s in todo)  # (the last shard is short: ended short of 100%)
        bar = tqdm(total=rows * seq_len, desc=f"target labels ({self.folder.name})", unit="tok", unit_scale=True)
        for s in todo:
            ids, logp = [], []
            for row in sequences[s * self.SHARD:(s + 1) * self.SHARD]:
                cache.reset()
                logits = target(row.to(target.device), cache, logits_for="all")
                top = torch.log_softmax(logits, dim=-1).topk(self.top_k, dim=-1)
                ids.append(top.indices.to(torch.int32).cpu())
                logp.append(top.values.to(torch.float16).cpu())
                bar.update(seq_len)
            # a shard exists only once complete
            save_whole(self._shard_path(s), {"ids": torch.stack(ids), "logp": torch.stack(logp)})
        bar.close()

    def load(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (ids [n, seq_len, k] int32, logp [n, seq_len, k] float16)."""
        parts = [load_cached(self._shard_path(s)) for s in range((n + self.SHARD - 1) // self.SHARD)]
        if any(part is None for part in parts):  # (one damaged, removed by load_cached: remade by a rerun)
            raise UserError(f"the target's labels in {self.folder} were damaged: run again to make them again")
        return torch.cat([p["ids"] for p in parts])[:n], torch.cat([p["logp"] for p in parts])[:n]
