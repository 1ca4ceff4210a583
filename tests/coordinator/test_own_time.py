"""Mode auto's overhead between forwards is a request's own work (forward_times.OwnTime): the time its run
spends running, and its share of its batch's verification, never the forwards it waits for or its
batchmates' work, so that it is measured alike alone and in a batch."""
import time

import torch

from triforce.config import EngineConfig, SamplingParams
from triforce.coordinator.batch import SequenceBatch
from triforce.coordinator.batchmates import Batchmates
from triforce.coordinator.engine import Check
from triforce.coordinator.forward_times import OwnTime
from triforce.coordinator.hierarchy import build_engine

from test_auto import SETTINGS, VOCAB, models  # noqa: F401 (a fixture)


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_own_time_counts_the_run_and_its_checks_share_not_the_waits():
    closed = []

    def run():
        try:
            busy(0.02)
            sent = yield "forward"
            busy(0.03)
            yield Check([], torch.zeros(0), torch.zeros(0), None, None)
            return sent
        finally:
            closed.append(True)

    own = OwnTime()
    timed = own.timed(run())
    assert next(timed) == "forward"
    time.sleep(0.1)  # the forward, or a batchmate's work: not this request's
    check = timed.send("logits")
    check.seconds = 0.04  # what the batch says its verification took for this request
    try:
        timed.send(None)
    except StopIteration as done:
        assert done.value == "logits"
    assert 0.09 <= own.spent < 0.13
    own_closed = OwnTime().timed(run())
    next(own_closed)
    own_closed.close()  # a cancelled request: its run is closed too
    assert closed == [True, True]


def test_a_batchmates_slow_work_is_not_a_requests_overhead(models):
    """Two auto requests in one batch, the second with a slow callback after each of its rounds: the first's
    overheads are measured (before, a batch measured none) and stay small, the second's carry its
    callback."""
    target, draft = models
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, VOCAB, (80,), generator=g).tolist() for _ in range(2)]
    params = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)
    mates = Batchmates()
    engines = [build_engine(EngineConfig(mode="auto", **SETTINGS), target, draft, 200, batchmates=mates)
               for _ in prompts]
    batch = SequenceBatch()
    batch.add(engines[0].run(prompts[0], params))
    batch.add(engines[1].run(prompts[1], params, (), lambda tokens: busy(0.05) or False))
    batch.run()
    quick, slow = (e.planner.times.overhead for e in engines)
    assert quick and slow
    assert max(quick.values()) < 0.015 < 0.04 < max(slow.values())
