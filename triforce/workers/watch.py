"""The worker leader's view of its coordinator: is any peer connected to the control socket?

An idle leader heartbeats its group (loop.py), so a group whose coordinator vanished without a
shutdown (its node crashed, or it was killed without torchrun stopping the group) would otherwise poll
and heartbeat forever. Two ZeroMQ facilities answer "is the coordinator still there" without any new
message or thread:
- a monitor socket reports each connection accepted and each one lost; a coordinator killed on a live
  node has its connection closed by the kernel at once;
- ZMTP heartbeats: the leader pings every peer, and a peer that sends nothing back within the timeout is
  disconnected, so a crashed node or a cut network becomes a lost connection too. Any ZMTP 3.1 peer
  answers pings from its I/O thread, so a coordinator busy computing (or the REQ socket, which needs no
  option for this) still answers.
Simpler alternatives fall short: an idle timeout would end a live idle group; a ping request from the
coordinator would need a second socket and a thread (REQ strictly alternates); TCP keepalive takes hours.

The leader alone decides (`seconds_left`); loop.py broadcasts the decision so ranks never part ways.
"""
from __future__ import annotations

import math
import time

import zmq
from zmq.utils.monitor import recv_monitor_message


HANDSHAKE_EVENTS = zmq.zmq_version_info() >= (4, 3)  # libzmq reports completed handshakes from 4.3 on
FIRST_CONNECTION_S = 300.0  # how long the first coordinator may take at least (coordinator/channel.py's
# STARTUP_TIMEOUT_S: the coordinator loads its model before it connects)


class CoordinatorWatch:
    """Peers connected to a bound socket, and for how long there has been none. Made before the
    socket binds, so that no connection goes unseen."""

    def __init__(self, sock: zmq.Socket, timeout_s: float):
        """timeout_s: how long the socket may have no peer before the coordinator counts as gone (before the
        first connection, FIRST_CONNECTION_S if that is longer: the coordinator loads its own tiers first; a
        --worker-timeout of 1 ms ended the group before it came, with no word of that option); a crashed
        peer is dropped after timeout_s / 2 without traffic."""
        self.timeout_s = timeout_s
        self.connected = False  # whether a coordinator has spoken yet
        sock.setsockopt(zmq.HEARTBEAT_IVL, max(1, int(timeout_s * 250)))  # a ping every timeout / 4
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, max(1, int(timeout_s * 500)))
        self.monitor = sock.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_HANDSHAKE_SUCCEEDED |
                                               zmq.EVENT_DISCONNECTED)
        self._sock = sock
        self.peers: set[int] = set()  # the file descriptors of live connections
        # Whether one of them completed ZeroMQ's handshake (its event names no connection): connections
        # that never do (a port probe, a health check) neither count as a coordinator nor, leaving, reset
        # the countdown (they did, and a group whose coordinator was gone heartbeat on while probes came)
        self.spoken = not HANDSHAKE_EVENTS  # (a libzmq without the event: every connection counts)
        self.alone_since = time.monotonic()

    def update(self) -> None:
        """Read every pending connection event."""
        while self.monitor.poll(0):
            event = recv_monitor_message(self.monitor)
            if event["event"] == zmq.EVENT_ACCEPTED:
                self.peers.add(event["value"])
                self.connected |= not HANDSHAKE_EVENTS
            elif event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.spoken = self.connected = True
            elif event["event"] == zmq.EVENT_DISCONNECTED:
                self.peers.discard(event["value"])
                if not self.peers and self.spoken:
                    self.alone_since, self.spoken = time.monotonic(), not HANDSHAKE_EVENTS

    def seconds_left(self) -> float:
        """Until the coordinator counts as gone: infinite while a ZeroMQ peer is connected, <= 0 once gone."""
        if self.peers and self.spoken:
            return math.inf
        return self.limit_s() - (time.monotonic() - self.alone_since)

    def limit_s(self) -> float:
        """How long the socket may go without a coordinator now."""
        return self.timeout_s if self.connected else max(self.timeout_s, FIRST_CONNECTION_S)

    def close(self) -> None:
        self._sock.disable_monitor()
        self.monitor.close(0)
