"""The control plane: the codec (round trips, and every kind of bad message is refused with ProtocolError)
and the coordinator's channel closing under a request in flight."""
import time

import msgpack
import pytest
import torch

from triforce.workers.protocol import (PROTOCOL_VERSION, ProtocolError, decode, encode, error_reply,
                                       reply)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_round_trip_with_tensors(dtype):
    t = (torch.randn(3, 4, 5) * 100).to(dtype)
    sent = {"seqs": [1, 4], "tokens": [[5, 6, 7], [8]], "parents": [[-1, 0, 1], [-1]], "starts": [10, 3]}
    frames = encode("verify", sent, [t, t[0, :0]])
    kind, body, tensors = decode(frames)
    assert kind == "verify" and body == sent
    assert torch.equal(tensors[0], t) and tensors[0].dtype == dtype and tensors[1].shape == (0, 5)


def test_replies():
    assert decode(reply({"length": 3}))[1] == {"ok": True, "length": 3}
    assert decode(error_reply("boom"))[1] == {"ok": False, "error": "boom"}


def test_a_sequence_the_group_can_never_hold_is_the_requests_fault_and_a_413():
    """The leader refuses a sequence whose cache does not fit its memory even alone for good (a sequence
    that does not fit beside others, for now): the coordinator's error is then TooLarge, a server's 413 and
    a batch job's line of its own, as a request too large for one process's memory. It was a WorkerError,
    the group's own failure: a 503, which clients retry, and a batch job ended by it."""
    from triforce.coordinator.channel import GroupFull, GroupTooSmall, WorkerError, refusal
    from triforce.errors import TooLarge
    from triforce.serve.tickets import failure

    never, later, broken = (refusal("start", decode(frames)[1]) for frames in (
        error_reply("needs 9 GiB", too_large=True), error_reply("needs 9 GiB", full=True), error_reply("bad")))
    assert isinstance(never, GroupTooSmall) and isinstance(never, TooLarge) and failure(never).status == 413
    assert isinstance(later, GroupFull) and not isinstance(later, TooLarge)
    assert type(broken) is WorkerError and failure(broken).status == 503


def header(**override):
    h = {"v": PROTOCOL_VERSION, "kind": "stats", "body": {}, "tensors": []}
    h.update(override)
    return msgpack.packb(h)


@pytest.mark.parametrize("frames,why", [
    ([], "frames"),
    ([b"\xc1garbage"], "unreadable"),
    ([encode("prefill", {"seq": 1, "tokens": [1, 2], "start": 0})[0][:-3]], "unreadable"),  # truncated
    ([msgpack.packb([1, 2])], "not a map"),
    ([header(v=PROTOCOL_VERSION + 1)], "version"),
    ([header(kind="format_disk")], "unknown message kind"),
    ([header(kind="prefill", body={"seq": 1, "tokens": [1], "start": 0, "final": True, "extra": 1})], "unknown fields"),
    ([header(kind="prefill", body={"seq": 1, "tokens": [1, "x"], "start": 0, "final": True})], "wrong type"),
    ([header(kind="prefill", body={"seq": 1, "tokens": [1], "start": True, "final": True})], "wrong type"),
    ([header(kind="prefill", body={"tokens": [1], "start": 0, "final": True})], "missing"),  # which sequence?
    ([header(kind="prefill", body={"seq": 1, "tokens": [1], "start": 0, "final": 1})], "wrong type"),
    ([header(kind="verify", body={"seqs": [1], "tokens": [1], "parents": [[-1]], "starts": [0]})], "wrong type"),
    ([header(kind="verify", body={"seqs": [1], "tokens": [[1]], "starts": [0]})], "missing"),
    ([header(tensors=[["float32", [2]]])], "declares 1 tensors"),
    ([header(tensors=[["float32", [2]]]), b"\x00" * 7], "bytes"),
    ([header(tensors=[["object", [1]]]), b"\x00"], "bad tensor"),
    ([header(tensors=[["float32", [-1]]]), b""], "bad tensor"),
    # unhashable or unorderable where a name is due: a TypeError escaped the leader's checks, and the group
    ([header(kind=[1])], "unknown message kind"),  # ended
    ([header(tensors=[[[], [1]]]), b"\x00"], "bad tensor"),
    ([header(kind="stats", body={"a": 1, b"b": 2})], "unknown fields"),
])
def test_bad_messages_are_refused(frames, why):
    with pytest.raises(ProtocolError, match=why):
        decode(frames)


def test_oversized_message_is_refused_before_parsing():
    frames = encode("prefill", {"seq": 1, "tokens": list(range(1000)), "start": 0})
    with pytest.raises(ProtocolError, match="exceeds"):
        decode(frames, max_bytes=100)


def test_closing_the_channel_waits_for_a_request_in_flight_on_another_thread():
    """A server's scheduler thread may be waiting on the group when the coordinator shuts down: close()
    waits until that request has its answer or timed out, and no later request uses the closed socket."""
    import threading

    from servers import free_port

    from triforce.coordinator.channel import ControlChannel, WorkerError

    channel = ControlChannel(f"tcp://127.0.0.1:{free_port()}", timeout_s=1.0)  # nobody answers there
    events = []

    def in_flight():
        try:
            channel.request("stats")
        except WorkerError as exc:
            events.append(("timed out", str(exc)))

    thread = threading.Thread(target=in_flight)
    thread.start()
    while not channel._lock.locked():  # the request is in flight
        time.sleep(0.01)
    channel.close()
    events.append(("closed", ""))
    thread.join()
    assert [e for e, _ in events] == ["timed out", "closed"] and "did not answer" in events[0][1]
    with pytest.raises(WorkerError, match="closed"):
        channel.request("stats")


def test_an_abandoned_channel_fails_the_request_in_flight_at_once():
    """The server's shutdown, whose signal ended the group's ranks too: the round waiting on them fails within
    a poll (it waited out --worker-timeout, past the grace uvicorn gives streams, which were cut)."""
    import threading

    from servers import free_port

    from triforce.coordinator.channel import POLL_S, ControlChannel, WorkerError

    channel = ControlChannel(f"tcp://127.0.0.1:{free_port()}", timeout_s=60.0)  # nobody answers there
    failed = []

    def in_flight():
        start = time.perf_counter()
        try:
            channel.request("stats")
        except WorkerError as exc:
            failed.append((str(exc), time.perf_counter() - start))

    thread = threading.Thread(target=in_flight)
    thread.start()
    while not channel._lock.locked():
        time.sleep(0.01)
    time.sleep(0.2)
    channel.abandon()
    thread.join(10)
    assert failed and "shutting down" in failed[0][0] and failed[0][1] < 0.2 + 5 * POLL_S + 1
    assert channel.broken
    channel.close()


def test_an_unreadable_reply_breaks_the_channel(monkeypatch):
    """A reply the coordinator cannot read (another version's, a damaged one) to a request that changed the
    workers' caches (a verify, a commit): the coordinator's lengths are out of step with theirs, and each later
    request of the sequence was refused with a misleading position error. The channel is broken instead."""
    from servers import free_port

    from triforce.coordinator.channel import ControlChannel, WorkerError

    channel = ControlChannel(f"tcp://127.0.0.1:{free_port()}", timeout_s=60.0)  # nobody answers there
    monkeypatch.setattr(channel.sock, "poll", lambda *_: True)
    monkeypatch.setattr(channel.sock, "recv_multipart", lambda: [b"not a reply"])
    with pytest.raises(WorkerError, match="unreadable reply"):
        channel.request("commit", {"seq": 1, "path": [0]})
    assert channel.broken
    with pytest.raises(WorkerError, match="failed or stopped answering earlier"):
        channel.request("end", {"seq": 1})
    channel.close()


def test_a_request_interrupted_in_flight_breaks_the_channel_not_its_socket(monkeypatch):
    """A Ctrl-C (in Python, LLM(workers=channel)) while a request waits for its reply: the REQ socket still
    waits for that reply, so the channel is broken, and later requests (the cleanup's `end`) say so, where
    ZeroMQ raised "Operation cannot be accomplished in current state" over the first error."""
    from servers import free_port

    from triforce.coordinator.channel import ControlChannel, WorkerError

    channel = ControlChannel(f"tcp://127.0.0.1:{free_port()}", timeout_s=60.0)  # nobody answers there

    def interrupted(*_):
        raise KeyboardInterrupt

    monkeypatch.setattr(channel.sock, "poll", interrupted)
    with pytest.raises(KeyboardInterrupt):
        channel.request("stats")
    assert channel.broken
    with pytest.raises(WorkerError, match="interrupted"):
        channel.request("end", {"seq": 1})
    channel.close()


def test_the_leader_and_the_coordinator_talk_over_ipv6():
    """--control-bind/--control-host an IPv6 address (its endpoint in brackets, ZeroMQ's IPv6 on: it took
    IPv4 alone, and the leader's bind failed with advice to pick another port)."""
    import threading
    from collections import Counter
    from types import SimpleNamespace

    import socket

    from servers import free_port

    from triforce.coordinator.channel import ControlChannel
    from triforce.workers.loop import serve
    from triforce.workers.protocol import tcp_endpoint

    endpoint = tcp_endpoint("::1", free_port())
    assert endpoint.startswith("tcp://[::1]:") and tcp_endpoint("10.0.0.2", 7) == "tcp://10.0.0.2:7"
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")

    class Stats:
        tp, counts = SimpleNamespace(rank=0, size=1), Counter()

        def check(self, kind, body):
            pass

        def execute(self, kind, body):
            return {"seen": kind}, []

    thread = threading.Thread(target=serve, args=(Stats(), endpoint), kwargs={"link": object()})
    thread.start()
    channel = ControlChannel(endpoint, timeout_s=30.0)
    assert channel.request("stats")[0]["seen"] == "stats"
    assert channel.request("shutdown")[0]["seen"] == "shutdown"
    thread.join(10)
    channel.close()


def test_a_bulk_receive_that_fails_here_breaks_the_channel():
    """A KV reply whose tensors this process cannot take (out of memory for them, a Ctrl-C) leaves the leader
    sending them: the channel is broken at once (the next request waited --worker-timeout for no answer,
    then blamed a dead worker)."""
    import threading

    import zmq
    from servers import free_port

    from triforce.coordinator.channel import ControlChannel, WorkerError
    from triforce.workers.protocol import reply

    endpoint = f"tcp://127.0.0.1:{free_port()}"
    sock = zmq.Context.instance().socket(zmq.REP)
    sock.bind(endpoint)

    def leader(bulk):
        sock.recv_multipart()
        sock.send_multipart(reply({"bulk": bulk}))

    class Link:
        def receive(self, descriptions):
            raise MemoryError("4 TiB")

    for bulk, failure in (([["float32", [2**40]]], MemoryError),
                          ([["object", [4]]], WorkerError)):  # a description it cannot read (another version's)
        thread = threading.Thread(target=leader, args=(bulk,))
        thread.start()
        channel = ControlChannel(endpoint, timeout_s=30.0, link=Link())
        with pytest.raises(failure):
            channel.request("kv", {"seq": 1, "start": 0, "stop": 4})
        thread.join(10)
        assert channel.broken
        with pytest.raises(WorkerError, match="failed or stopped answering earlier"):
            channel.request("stats")
        channel.close()
    sock.close(0)


def test_a_request_the_group_failed_as_it_ran_is_told_and_breaks_the_channel():
    """A request that raises as the group runs it (a bug, a rank out of memory) ends the group: the leader
    now replies with the error first, so the coordinator says why (it saw a request unanswered until
    --worker-timeout, the traceback on another node), and later requests fail at once."""
    import threading
    from collections import Counter
    from types import SimpleNamespace

    from servers import free_port

    from triforce.coordinator.channel import ControlChannel, WorkerError
    from triforce.workers.loop import serve

    class Failing:
        tp, counts = SimpleNamespace(rank=0, size=1), Counter()

        def check(self, kind, body):
            pass

        def execute(self, kind, body):
            raise RuntimeError("out of memory on rank 2")

    endpoint = f"tcp://127.0.0.1:{free_port()}"
    ended = []

    def leader():
        try:
            serve(Failing(), endpoint, link=object())
        except RuntimeError as exc:
            ended.append(str(exc))

    thread = threading.Thread(target=leader)
    thread.start()
    channel = ControlChannel(endpoint, timeout_s=30.0)
    start = time.perf_counter()
    with pytest.raises(WorkerError, match=r"failed 'stats'.*RuntimeError: out of memory on rank 2.*group ends"):
        channel.request("stats")
    assert time.perf_counter() - start < 20 and channel.broken
    thread.join(10)
    assert ended == ["out of memory on rank 2"]  # the leader's process ends too (torchrun ends the group)
    with pytest.raises(WorkerError, match="failed or stopped answering earlier"):
        channel.request("stats")
    channel.close()


def test_a_handshake_nobody_answers_names_the_address_to_check():
    """A --control-host or --control-port that reaches no leader: the first request waits out its time, then
    says where it was sent and which flags set that (it said a worker died or hangs)."""
    from servers import free_port

    from triforce.coordinator.channel import ControlChannel, WorkerError

    endpoint = f"tcp://127.0.0.1:{free_port()}"
    channel = ControlChannel(endpoint, timeout_s=0.3)
    with pytest.raises(WorkerError, match=f"at {endpoint} failed 'handshake'.*nothing listens there "
                                          r"\(--control-host, --control-port\).*--worker-timeout"):
        channel.handshake("model", 1, startup_timeout_s=0.3)  # (a slow load: --worker-timeout waits longer)
    channel.close()


def test_the_handshake_tells_two_torchrun_runs_of_one_model_apart(tiny_dir, monkeypatch):
    """Two runs on one control port and model (a second `torchrun` by hand with the default port): the
    second's coordinator found the first one's group, took sequence numbers it held and shut it down at its
    end. The identity the handshake compares now holds the run (TORCHELASTIC_RUN_ID, the same in every
    process of one run)."""
    from triforce.coordinator.channel import model_identity

    folder = tiny_dir("identity-model", seed=3)
    ids = {}
    # --standalone: a run id each; by hand without one, torchrun's "none" and a master port each
    for run, port in (("first-run", "29500"), ("second-run", "29500"), ("first-run", "29500"), ("none", "29500"),
                      ("none", "29501")):
        monkeypatch.setenv("TORCHELASTIC_RUN_ID", run)
        monkeypatch.setenv("MASTER_PORT", port)
        ids.setdefault((run, port), set()).add(model_identity(folder))
    assert len(ids["first-run", "29500"]) == 1 and len(set(map(frozenset, ids.values()))) == len(ids)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")
    monkeypatch.delenv("MASTER_PORT")
    assert model_identity(folder) not in set().union(*ids.values())
