"""The worker leader's CoordinatorWatch: which connections count as a coordinator, and the countdown."""
import contextlib
import math
import socket
import time

import zmq

from triforce.workers.watch import FIRST_CONNECTION_S, CoordinatorWatch


def settle(watch, until, limit_s=5.0):
    """watch.update() until `until(watch)` holds (the monitor's events arrive from ZeroMQ's I/O thread)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        watch.update()
        if until(watch):
            return True
        time.sleep(0.02)
    return False


@contextlib.contextmanager
def watched(timeout_s: float):
    """A bound REP socket and its CoordinatorWatch: (watch, port), closed after."""
    sock = zmq.Context.instance().socket(zmq.REP)
    watch = CoordinatorWatch(sock, timeout_s=timeout_s)
    try:
        yield watch, sock.bind_to_random_port("tcp://127.0.0.1")
    finally:
        watch.close()
        sock.close(0)


def coordinator_comes_and_goes(watch, port: int) -> None:
    """A ZeroMQ peer connects (the countdown stops) and leaves (it starts again)."""
    peer = zmq.Context.instance().socket(zmq.REQ)
    peer.connect(f"tcp://127.0.0.1:{port}")
    assert settle(watch, lambda w: w.seconds_left() == math.inf)
    peer.close(0)
    assert settle(watch, lambda w: w.seconds_left() < math.inf)


def test_a_connection_that_never_speaks_zeromq_is_no_coordinator():
    """A port probe or health check that connects and leaves did not count down: its disconnection reset
    the countdown, so a group whose coordinator was gone heartbeat on while probes came. A ZeroMQ peer
    counts, and the countdown starts when the last one leaves."""
    with watched(60.0) as (watch, port):
        time.sleep(0.3)
        for _ in range(3):
            probe = socket.create_connection(("127.0.0.1", port))
            time.sleep(0.1)
            probe.close()
            time.sleep(0.1)
        watch.update()  # counted from the start, through the probes (the first coordinator may take longer)
        assert 60.0 < watch.seconds_left() <= FIRST_CONNECTION_S - 0.8
        coordinator_comes_and_goes(watch, port)
        assert 59.0 < watch.seconds_left() <= 60.0  # from the peer's leaving, the timeout itself


def test_a_short_timeout_counts_only_once_a_coordinator_has_come():
    """--worker-timeout 0.001 ended the group before its coordinator, loading its own model, connected (exit
    1, a line about no coordinator and nothing of the option): the first one may take FIRST_CONNECTION_S;
    once one has come and gone, the timeout counts as given."""
    with watched(0.001) as (watch, port):
        time.sleep(0.05)
        watch.update()
        assert watch.seconds_left() > FIRST_CONNECTION_S - 1  # no coordinator yet: far from the end
        coordinator_comes_and_goes(watch, port)
        time.sleep(0.01)
        assert watch.seconds_left() <= 0 and watch.limit_s() == 0.001
