"""Pipelined load generators of `bench/pipelined.py`: N connections x D outstanding writes.

Owns: `PipeResult` (one measured level), the measurement window shared by every generator
(`Window`: warmup, then `duration` seconds; an operation counts when its reply arrives
inside the window, its latency is send-to-reply), and four generators, each keeping exactly
D writes (one put per request, unique keys `<prefix><conn>-<lane>-<seq>`, fixed-size values)
outstanding on each of N connections:

- `phalanx_client`: N `phalanx.client.Client`s (one TLS connection to the leader each), D
  tasks per client calling `put` in a loop: the library's own cost (lanes, encode, retries,
  deadline scopes) is in the load generator's CPU.
- `phalanx_raw`: the PRE-ENCODED-REQUEST generator. It measures the servers, not our Python
  client: every request frame (`ClientCall` of a KV `Put` on lane ``<id>#<k>``, framed) is
  encoded before the window starts (`prepare`), and the connection's task only writes
  ready bytes and matches replies (`wire.decode`) to lanes; a lane whose frames run out
  encodes on the fly (counted in `note`). One TLS connection per N, D lanes each (a lane
  has one write in flight: the replica's sessions require it).
- `etcd_pipelined`: N keep-alive HTTP/1.1 connections to the etcd leader's v3 JSON gateway,
  D `/v3/kv/put` requests written ahead on each (HTTP/1.1 pipelining; the answers come
  back in order).
- `etcd_conns`: N x D keep-alive connections, one request at a time each (what `kv.py`'s
  etcd clients do), for when pipelining does not give the server concurrency.

CPU: the load generator's process time and the servers' utime+stime over the window, as
cores, and per write (`cpu_ms_per_write`): on a 2-core machine the generator competes with
the servers, so its cost is reported beside theirs.

Must not be imported by the package. Loopback only.
"""

from __future__ import annotations

import base64
import contextlib
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import trio
from _etcd import EtcdError, HttpConnection
from _loadgen import LOOPBACK, CpuMeter, percentile

from phalanx.apps import kv_wire
from phalanx.apps.kv_types import Put
from phalanx.client.async_client import ClientError, open_client
from phalanx.consensus.types import ClientRequest
from phalanx.net import client_protocol, wire
from phalanx.net.client_protocol import ClientCall, ClientReply, ReplyStatus
from phalanx.net.framing import FrameDecoder, encode_frame
from phalanx.net.tls_stream import TlsStream
from phalanx.net.transport_dial import open_tcp_stream_to_other
from phalanx.ops import pki
from phalanx.ops.node_config import ClusterConfig

client_protocol.register()


@dataclass(frozen=True, slots=True, kw_only=True)
class PipeResult:
    """One (system, generator, N, D) measurement."""

    system: str
    connections: int
    depth: int
    ops: int
    errors: int
    seconds: float
    p50_ms: float
    p99_ms: float
    loadgen_cores: float
    server_cores: float
    note: str = ""

    @property
    def rate(self) -> float:
        return self.ops / self.seconds if self.seconds > 0 else 0.0

    def cpu_ms_per_write(self, cores: float) -> float:
        return cores * 1e3 / self.rate if self.rate > 0 else math.nan


class Window:
    """The measurement window: `open()` after the warmup, `close()` after `duration`."""

    def __init__(self) -> None:
        self.start = math.inf
        self.end = math.inf
        self.stopped = False
        self.latencies: list[float] = []
        self.errors = 0
        self.first_error = ""
        self.stopped_connections = 0
        """Raw connections that stopped on a REDIRECT (the leader changed under the load)."""

    def inside(self, t: float) -> bool:
        return self.start <= t <= self.end

    def error(self, why: str) -> None:
        if self.inside(time.perf_counter()):
            self.errors += 1
            self.first_error = self.first_error or why


Body = Callable[[Window, trio.Nursery], Awaitable[None]]


async def measure(system: str, connections: int, depth: int, server_pids: Sequence[int],
                  body: Body, *, warmup_s: float, duration_s: float,
                  grace_s: float = 5.0, note: str = "") -> PipeResult:
    """Run `body` (which starts the generator's tasks in the nursery and returns) through a
    warmup and a window; the tasks see `window.stopped` after it and finish in-flight work."""
    window = Window()
    meter = CpuMeter(server_pids)
    async with trio.open_nursery() as outer:
        done = trio.Event()

        async def generator() -> None:
            async with trio.open_nursery() as nursery:
                await body(window, nursery)
            done.set()

        outer.start_soon(generator)
        await trio.sleep(warmup_s)
        meter.start()
        window.start = time.perf_counter()
        window.end = window.start + duration_s
        await trio.sleep(duration_s)
        own, srv = meter.stop()
        window.stopped = True
        with trio.move_on_after(grace_s):
            await done.wait()
        outer.cancel_scope.cancel()
    lat = sorted(window.latencies)
    extra = f"first error: {window.first_error}" if window.first_error else ""
    if window.stopped_connections:
        extra += f" ({window.stopped_connections} connection(s) stopped on a REDIRECT)"
    return PipeResult(system=system, connections=connections, depth=depth, ops=len(lat),
                      errors=window.errors, seconds=duration_s,
                      p50_ms=percentile(lat, 50) * 1e3, p99_ms=percentile(lat, 99) * 1e3,
                      loadgen_cores=own, server_cores=srv,
                      note=" ".join(x for x in (note, extra) if x))


def _key(prefix: str, conn: int, lane: int, seq: int) -> str:
    return f"{prefix}{conn}-{lane}-{seq}"


# --------------------------------------------------------------------------------------------
# phalanx through its client library


def phalanx_client(config: ClusterConfig, *, connections: int, depth: int, value: bytes,
                   prefix: str) -> Body:
    async def body(window: Window, nursery: trio.Nursery) -> None:
        async def lane_loop(client: object, conn: int, lane: int) -> None:
            put = client.put  # type: ignore[attr-defined]
            perf = time.perf_counter
            record = window.latencies.append
            seq = 0
            while not window.stopped:
                key = _key(prefix, conn, lane, seq)
                seq += 1
                t0 = perf()
                try:
                    await put(key, value)
                except ClientError as e:
                    window.error(f"{type(e).__name__}: {e}")
                    await trio.sleep(0.01)
                    continue
                t1 = perf()
                if window.inside(t1):
                    record(t1 - t0)

        async def one_client(conn: int, task_status: trio.TaskStatus[None]) -> None:
            async with open_client(config, timeout=30.0) as client, \
                    trio.open_nursery() as lanes:
                await client.status(client.nodes[0])  # dial before the warmup counts
                for lane in range(depth):
                    lanes.start_soon(lane_loop, client, conn, lane)
                task_status.started()

        for conn in range(connections):
            await nursery.start(one_client, conn)

    return body


# --------------------------------------------------------------------------------------------
# phalanx, pre-encoded requests over raw client connections


@dataclass(slots=True)
class _Lane:
    client_id: str
    frames: deque[bytes]
    next_no: int
    seq: int
    sent_at: float = 0.0
    frame: bytes = b""


class RawPlan:
    """The pre-encoded frames of one `phalanx_raw` level (built before the clock starts)."""

    def __init__(self, config: ClusterConfig, *, connections: int, depth: int, value: bytes,
                 prefix: str, frames_per_lane: int) -> None:
        self.value = value
        self.prefix = prefix
        self.lanes: list[list[_Lane]] = []
        self.live_encodes = 0
        for conn in range(connections):
            base = pki.new_client_id(config.client_cert)
            row = []
            for k in range(depth):
                lane = _Lane(client_id=f"{base}#{k}", frames=deque(), next_no=1, seq=0)
                for _ in range(frames_per_lane):
                    lane.frames.append(self.encode(lane, conn, k))
                row.append(lane)
            self.lanes.append(row)

    def encode(self, lane: _Lane, conn: int, k: int) -> bytes:
        command = kv_wire.encode_command(
            Put(key=_key(self.prefix, conn, k, lane.seq), value=self.value))
        lane.seq += 1
        request = ClientRequest(client_id=lane.client_id, request_no=lane.next_no,
                                command=command)
        lane.next_no += 1
        return encode_frame(wire.encode(ClientCall(request=request)))

    def next_frame(self, lane: _Lane, conn: int, k: int) -> bytes:
        if lane.frames:
            return lane.frames.popleft()
        self.live_encodes += 1
        return self.encode(lane, conn, k)


def phalanx_raw(config: ClusterConfig, leader: str, plan: RawPlan) -> Body:
    node = next(n for n in config.nodes if n.id == leader)
    host, port = node.client_addr.host, node.client_addr.port
    if host != LOOPBACK:
        raise ValueError(f"benchmark clients only talk to {LOOPBACK}, not {host}")
    context = pki.client_context(config.ca, certificate=config.client_cert,
                                 private_key=config.client_key, check_hostname=False)

    async def body(window: Window, nursery: trio.Nursery) -> None:
        async def connection(conn: int, task_status: trio.TaskStatus[None]) -> None:
            lanes = plan.lanes[conn]
            by_id = {lane.client_id: (k, lane) for k, lane in enumerate(lanes)}
            tls = TlsStream(await open_tcp_stream_to_other(host, port), context)
            await tls.do_handshake()
            decoder = FrameDecoder()
            perf = time.perf_counter
            record = window.latencies.append
            outstanding = 0
            try:
                now = perf()
                out = []
                for k, lane in enumerate(lanes):
                    lane.frame = plan.next_frame(lane, conn, k)
                    lane.sent_at = now
                    out.append(lane.frame)
                outstanding = len(lanes)
                await tls.send_all(b"".join(out))
                task_status.started()
                while outstanding:
                    data = await tls.receive_some(65536)
                    if not data:
                        window.error("connection closed by the node")
                        return
                    decoder.feed(data)
                    out = []
                    t1 = perf()
                    while (payload := decoder.next_frame()) is not None:
                        reply = wire.decode(payload)
                        if not isinstance(reply, ClientReply) or reply.client_id not in by_id:
                            window.error(f"unexpected {type(reply).__name__}")
                            continue
                        k, lane = by_id[reply.client_id]
                        if reply.status is ReplyStatus.OK:
                            if window.inside(t1):
                                record(t1 - lane.sent_at)
                            if window.stopped:
                                outstanding -= 1
                                continue
                            lane.frame = plan.next_frame(lane, conn, k)
                        else:
                            window.error(f"{reply.status.name}: {reply.message}")
                            if reply.status is not ReplyStatus.RETRY:
                                # (a REDIRECT: the leader changed under the load; this
                                # connection stops, and the level reports the errors)
                                window.stopped_connections += 1
                                return
                        lane.sent_at = t1
                        out.append(lane.frame)
                    if out:
                        await tls.send_all(b"".join(out))
            finally:
                await trio.aclose_forcefully(tls)

        for conn in range(len(plan.lanes)):
            await nursery.start(connection, conn)

    return body


# --------------------------------------------------------------------------------------------
# etcd


def _etcd_body(key: bytes, value_b64: bytes) -> bytes:
    return b'{"key":"' + base64.b64encode(key) + b'","value":"' + value_b64 + b'"}'


def _etcd_request(host: bytes, body: bytes) -> bytes:
    return (b"POST /v3/kv/put HTTP/1.1\r\nHost: " + host
            + b"\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)


def etcd_pipelined(port: int, *, connections: int, depth: int, value: bytes,
                   prefix: str) -> Body:
    """HTTP/1.1 pipelining: D requests written ahead per connection, answers in order."""
    value_b64 = base64.b64encode(value)
    host = f"{LOOPBACK}:{port}".encode()

    async def body(window: Window, nursery: trio.Nursery) -> None:
        async def connection(conn: int, task_status: trio.TaskStatus[None]) -> None:
            http = await HttpConnection.open(LOOPBACK, port)
            sent: deque[float] = deque()
            perf = time.perf_counter
            seq = 0

            def request() -> bytes:
                nonlocal seq
                key = _key(prefix, conn, 0, seq).encode()
                seq += 1
                return _etcd_request(host, _etcd_body(key, value_b64))

            try:
                now = perf()
                await http.send_raw(b"".join(request() for _ in range(depth)))
                sent.extend([now] * depth)
                task_status.started()
                while sent:
                    reply = await http.read_response()
                    t1 = perf()
                    t0 = sent.popleft()
                    if b'"header"' not in reply:
                        window.error(f"unexpected put reply {reply[:100]!r}")
                    elif window.inside(t1):
                        window.latencies.append(t1 - t0)
                    if not window.stopped:
                        sent.append(perf())
                        await http.send_raw(request())
            except EtcdError as e:
                window.error(str(e))
            finally:
                with contextlib.suppress(Exception):
                    await http.aclose()

        for conn in range(connections):
            await nursery.start(connection, conn)

    return body


def etcd_conns(port: int, *, connections: int, depth: int, value: bytes,
               prefix: str) -> Body:
    """N x D keep-alive connections, one request at a time on each."""
    value_b64 = base64.b64encode(value)

    async def body(window: Window, nursery: trio.Nursery) -> None:
        async def one(conn: int, lane: int, task_status: trio.TaskStatus[None]) -> None:
            http = await HttpConnection.open(LOOPBACK, port)
            task_status.started()
            perf = time.perf_counter
            seq = 0
            try:
                while not window.stopped:
                    key = _key(prefix, conn, lane, seq).encode()
                    seq += 1
                    t0 = perf()
                    try:
                        reply = await http.post_json("/v3/kv/put", _etcd_body(key, value_b64))
                    except EtcdError as e:
                        window.error(str(e))
                        return
                    t1 = perf()
                    if b'"header"' not in reply:
                        window.error(f"unexpected put reply {reply[:100]!r}")
                    elif window.inside(t1):
                        window.latencies.append(t1 - t0)
            finally:
                with contextlib.suppress(Exception):
                    await http.aclose()

        for conn in range(connections):
            for lane in range(depth):
                await nursery.start(one, conn, lane)

    return body
