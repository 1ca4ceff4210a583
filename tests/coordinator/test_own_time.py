"""runs.OwnTime: the seconds a run spends in its own code, which mode auto takes for its overhead between
forwards beside batchmates (the wall time between its forwards holds theirs there)."""
import time

import pytest
import torch

from triforce.coordinator.runs import Check, OwnTime
from triforce.sampling_params import SamplingParams


def busy(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_a_runs_own_time_leaves_out_what_its_driver_does_and_counts_its_checks_share():
    check = Check([1], torch.zeros(1, 2), torch.zeros(2, 2), SamplingParams(), torch.Generator())

    def run():
        busy(0.03)
        sent = yield "forward"
        assert sent == "logits"
        busy(0.02)
        verdict = yield check
        busy(0.01)
        return verdict

    own = OwnTime()
    timed = own.timed(run())
    assert next(timed) == "forward"
    busy(0.2)  # the driver's forward, a batchmate's
    assert timed.send("logits") is check
    check.seconds = 0.004  # the batch's verification, this run's share
    busy(0.2)
    with pytest.raises(StopIteration) as done:
        timed.send("verdict")
    assert done.value.value == "verdict"
    own_work = 0.03 + 0.02 + 0.004 + 0.01
    assert own_work <= own.seconds < own_work + 0.15  # (not the driver's 0.4 s; a loaded machine's pauses)


def test_errors_thrown_into_a_timed_run_reach_it_and_closing_closes_it():
    seen = []

    def run():
        try:
            yield 1
        except KeyError:
            seen.append("thrown")
        try:
            yield 2
        finally:
            seen.append("closed")

    timed = OwnTime().timed(run())
    assert next(timed) == 1
    assert timed.throw(KeyError()) == 2
    timed.close()
    assert seen == ["thrown", "closed"]
