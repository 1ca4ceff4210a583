"""Self-distillation data: the target's own text, from prompts of two kinds: varied instructions
(draft/prompts.py, laid out by the chat template: the target's answers) and passages of prose (the
target's continuations of them: on-policy data for the text a draft meets in the engine, as DistillSpec
trains on).

Each sample is a prompt followed by the target's text, sampled by triforce itself (`ar` mode: plain
decoding of the target) in batches, at temperatures cycling over a list so that the draft sees the target
both greedy and sampled. Samples are cached on disk in shards of one batch each, so an interrupted run
resumes at the first missing shard and a finished set is reused by later runs.
"""
from __future__ import annotations

from pathlib import Path

import torch
from tqdm import tqdm

from ..chat import chat_ids
from ..sampling_params import SamplingParams
from ..errors import UserError
from ..files import load_cached, save_whole
from .prompts import prompt_count, prompts
from .settings import GenerationSettings


def chat_prompt(tokenizer, instruction: str) -> list[int]:
    """The instruction as the target's chat template lays it out, ready for the answer."""
    if not getattr(tokenizer, "chat_template", None):
        return tokenizer(instruction + "\n").input_ids
    return chat_ids(tokenizer, [{"role": "user", "content": instruction}])


class Instructions:
    """The prompts of draft/prompts.py (the held-out subjects' or the rest), in the settings' shuffled order."""

    def __init__(self, settings: GenerationSettings):
        self.distinct = prompt_count(settings.heldout)  # prompts before they repeat
        self._pairs = prompts(self.distinct, heldout=settings.heldout, seed=settings.seed)

    def prompt(self, i: int, tokenizer) -> tuple[str, list[int]]:
        """-> (genre, ids) of sample i."""
        genre, instruction = self._pairs[i % self.distinct]
        return genre, chat_prompt(tokenizer, instruction)


class Passages:
    """Passages of `tokens` ids cut from packed prose sequences [N, seq_len] (each sequence in
    seq_len // tokens pieces), in an order shuffled by `seed`, for the target to continue."""

    def __init__(self, sequences: torch.Tensor, tokens: int, seed: int = 0):
        if not 1 <= tokens <= sequences.shape[1]:
            raise UserError(f"a passage of {tokens} tokens does not fit sequences of {sequences.shape[1]}")
        self.sequences, self.tokens = sequences, tokens
        self.per_sequence = sequences.shape[1] // tokens
        self.distinct = sequences.shape[0] * self.per_sequence
        if self.distinct == 0:
            raise UserError("no prose to cut passages from")
        self._order = torch.randperm(self.distinct, generator=torch.Generator().manual_seed(seed))

    def prompt(self, i: int, tokenizer=None) -> tuple[str, list[int]]:
        piece = int(self._order[i % self.distinct])
        row, start = divmod(piece, self.per_sequence)
        return "continuation", self.sequences[row, start * self.tokens:(start + 1) * self.tokens].tolist()


class GeneratedSamples:
    """The target's text after each prompt, as token ids (prompt + the target's, ending with EOS when the
    target ended). The prompts: `source` (Instructions or Passages; default the instructions)."""

    def __init__(self, folder: Path, settings: GenerationSettings, source: Instructions | Passages | None = None):
        if settings.samples < 0 or settings.max_tokens < 1 or settings.batch < 1 or not settings.temperatures:
            raise UserError("generated samples need samples >= 0, max tokens >= 1, batch >= 1 and a temperature")
        self.folder, self.settings = Path(folder), settings
        self.source = source or Instructions(settings)
        self.folder.mkdir(parents=True, exist_ok=True)

    def _shard_path(self, index: int) -> Path:
        return self.folder / f"samples-{index:05d}.pt"

    def _shards(self) -> range:
        return range((self.settings.samples + self.settings.batch - 1) // self.settings.batch)

    def generate(self, llm) -> None:
        """Generates every missing shard with `llm` (an LLM of the target; its tokenizer lays out the prompts)."""
        s = self.settings
        todo = [i for i in self._shards() if not self._complete(i)]
        if not todo:
            return
        bar = tqdm(total=s.samples, initial=s.samples - sum(len(self._indices(i)) for i in todo),
                   desc=f"target's text ({self.folder.name})", unit="sample")
        for shard in todo:
            indices = self._indices(shard)
            genres, ids = zip(*(self.source.prompt(i, llm.tokenizer) for i in indices))
            params = [SamplingParams(max_tokens=s.max_tokens, temperature=self.temperature(i),
                                     seed=s.seed * 1_000_003 + i) for i in indices]
            outputs = llm.generate(list(ids), params)
            rows = [{"genre": g, "prompt": torch.tensor(p, dtype=torch.int32),
                     "answer": torch.tensor(o.token_ids, dtype=torch.int32), "temperature": q.temperature}
                    for g, p, o, q in zip(genres, ids, outputs, params)]
            save_whole(self._shard_path(shard), rows)  # a shard exists only once complete
            bar.update(len(indices))
        bar.close()

    def temperature(self, i: int) -> float:
        """Sample i's: the temperatures in turn, shifted by one on each pass over the prompts, so that a
        prompt asked again is answered at another temperature."""
        t = self.settings.temperatures
        return t[(i + i // self.source.distinct) % len(t)]

    def _complete(self, shard: int) -> bool:
        """Whether the shard's file holds all its samples: a run that asked for fewer wrote its last shard
        short, and a later run asking for more skipped the rest of that shard's samples."""
        done = load_cached(self._shard_path(shard))
        return done is not None and len(done) >= len(self._indices(shard))

    def _indices(self, shard: int) -> range:
        return range(shard * self.settings.batch, min((shard + 1) * self.settings.batch, self.settings.samples))

    def load(self) -> list[dict]:
        """-> one dict per sample: genre, prompt and answer (int32 ids: the target's text), temperature."""
        rows = []
        for shard in self._shards():
            if not self._shard_path(shard).is_file():
                raise UserError(f"generated samples are incomplete: {self._shard_path(shard)} is missing")
            rows += torch.load(self._shard_path(shard), weights_only=True)[:len(self._indices(shard))]
        return rows

    def token_lists(self) -> list[list[int]]:
        """Each sample's prompt + the target's text as one list of ids."""
        return [torch.cat([r["prompt"], r["answer"]]).tolist() for r in self.load()]
