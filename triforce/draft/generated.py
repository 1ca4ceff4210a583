"""Self-distillation data: the target's own answers to varied instructions (draft/prompts.py).

Each sample is a chat-formatted instruction followed by the target's answer, sampled by triforce itself
(`ar` mode: plain decoding of the target) in batches, at temperatures cycling over a list so that the
draft sees the target both greedy and sampled. Samples are cached on disk in shards of one batch each,
so an interrupted run resumes at the first missing shard and a finished set is reused by later runs.
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


class GeneratedSamples:
    """The target's answers, as token ids (instruction + answer, ending with EOS when the target ended)."""

    def __init__(self, folder: Path, settings: GenerationSettings):
        if settings.samples < 0 or settings.max_tokens < 1 or settings.batch < 1 or not settings.temperatures:
            raise UserError("generated samples need samples >= 0, max tokens >= 1, batch >= 1 and a temperature")
        self.folder, self.settings = Path(folder), settings
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
        pairs = prompts(s.samples, heldout=s.heldout, seed=s.seed)
        bar = tqdm(total=s.samples, initial=s.samples - sum(len(self._indices(i)) for i in todo),
                   desc="target answers", unit="sample")
        for shard in todo:
            indices = self._indices(shard)
            ids = [chat_prompt(llm.tokenizer, pairs[i][1]) for i in indices]
            params = [SamplingParams(max_tokens=s.max_tokens, temperature=self.temperature(i),
                                     seed=s.seed * 1_000_003 + i) for i in indices]
            outputs = llm.generate(ids, params)
            rows = [{"genre": pairs[i][0], "prompt": torch.tensor(p, dtype=torch.int32),
                     "answer": torch.tensor(o.token_ids, dtype=torch.int32), "temperature": q.temperature}
                    for i, p, o, q in zip(indices, ids, outputs, params)]
            save_whole(self._shard_path(shard), rows)  # a shard exists only once complete
            bar.update(len(indices))
        bar.close()

    def temperature(self, i: int) -> float:
        """Sample i's: the temperatures in turn, shifted by one on each pass over the prompts, so that a
        prompt asked again is answered at another temperature."""
        t = self.settings.temperatures
        return t[(i + i // prompt_count(self.settings.heldout)) % len(t)]

    def _complete(self, shard: int) -> bool:
        """Whether the shard's file holds all its samples: a run that asked for fewer wrote its last shard
        short, and a later run asking for more skipped the rest of that shard's samples."""
        done = load_cached(self._shard_path(shard))
        return done is not None and len(done) >= len(self._indices(shard))

    def _indices(self, shard: int) -> range:
        return range(shard * self.settings.batch, min((shard + 1) * self.settings.batch, self.settings.samples))

    def load(self) -> list[dict]:
        """-> one dict per sample: genre, prompt and answer (int32 ids), temperature."""
        rows = []
        for shard in self._shards():
            if not self._shard_path(shard).is_file():
                raise UserError(f"generated samples are incomplete: {self._shard_path(shard)} is missing")
            rows += torch.load(self._shard_path(shard), weights_only=True)[:len(self._indices(shard))]
        return rows

    def token_lists(self) -> list[list[int]]:
        """Each sample's instruction + answer as one list of ids."""
        return [torch.cat([r["prompt"], r["answer"]]).tolist() for r in self.load()]
