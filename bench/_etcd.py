"""etcd 3.4 side of `bench/kv.py`: a 3-member loopback cluster and a lean v3-gateway writer.

Owns: starting three `etcd` members (separate data dirs under a temp dir, fsync is etcd's
default, ports picked free on 127.0.0.1), finding the leader, stopping exactly the pids it
started, and `EtcdWriter`: raw HTTP/1.1 keep-alive over a trio TCP stream posting
`/v3/kv/put` JSON with base64 key/value, one connection per closed-loop client. A lean
client matters: per peers.md a heavyweight Python HTTP client (httpx) was 18x slower than the
server and would have measured itself, not etcd.

Must not import phalanx: it is a peer system. Never contacts a non-loopback address.
Invariant: every response must be `HTTP/1.1 200` with a body; anything else raises
`EtcdError`, which the load generator counts as an error.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import trio
from _loadgen import LOOPBACK, Writer, stop_process

from phalanx.ops.ports import free_ports


class EtcdError(RuntimeError):
    """The etcd gateway answered with something other than a 200 response."""


def etcd_binary() -> str | None:
    return shutil.which("etcd")


def etcd_version(binary: str) -> str:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    first = out.stdout.strip().splitlines()
    return first[0] if first else "etcd (unknown version)"


# --------------------------------------------------------------------------------------------
# Minimal HTTP/1.1 client


class HttpConnection:
    """One keep-alive HTTP/1.1 connection; requests are strictly sequential."""

    def __init__(self, stream: trio.SocketStream, host: str) -> None:
        self._stream = stream
        self._host = host.encode()
        self._buf = bytearray()

    @classmethod
    async def open(cls, host: str, port: int) -> HttpConnection:
        if host != LOOPBACK:
            raise ValueError(f"benchmark clients only talk to {LOOPBACK}, not {host}")
        stream = await trio.open_tcp_stream(host, port)
        return cls(stream, f"{host}:{port}")

    async def post_json(self, path: str, body: bytes) -> bytes:
        head = (
            b"POST " + path.encode() + b" HTTP/1.1\r\nHost: " + self._host
            + b"\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n"
        )
        await self._stream.send_all(head + body)
        return await self._read_response()

    async def send_raw(self, data: bytes) -> None:
        """Write already formatted requests (HTTP/1.1 pipelining: several at once)."""
        await self._stream.send_all(data)

    async def read_response(self) -> bytes:
        """The body of the next response (200 required, as `post_json`)."""
        return await self._read_response()

    async def _fill(self) -> None:
        chunk = await self._stream.receive_some(65536)
        if not chunk:
            raise EtcdError("connection closed by etcd")
        self._buf += chunk

    async def _read_response(self) -> bytes:
        while (end := self._buf.find(b"\r\n\r\n")) < 0:
            await self._fill()
        header = bytes(self._buf[:end]).decode("latin-1")
        del self._buf[: end + 4]
        status_line, _, rest = header.partition("\r\n")
        fields = {}
        for line in rest.split("\r\n"):
            name, _, val = line.partition(":")
            fields[name.strip().lower()] = val.strip()
        if fields.get("transfer-encoding", "").lower() == "chunked":
            body = await self._read_chunked()
        else:
            length = int(fields.get("content-length", "0"))
            while len(self._buf) < length:
                await self._fill()
            body = bytes(self._buf[:length])
            del self._buf[:length]
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or parts[1] != "200":
            raise EtcdError(f"etcd answered {status_line!r}: {body[:200]!r}")
        return body

    async def _read_chunked(self) -> bytes:
        body = bytearray()
        while True:
            while (end := self._buf.find(b"\r\n")) < 0:
                await self._fill()
            size = int(bytes(self._buf[:end]).split(b";")[0], 16)
            del self._buf[: end + 2]
            while len(self._buf) < size + 2:
                await self._fill()
            body += self._buf[:size]
            del self._buf[: size + 2]
            if size == 0:
                return bytes(body)

    async def aclose(self) -> None:
        await self._stream.aclose()


class EtcdWriter:
    """A closed-loop client doing `/v3/kv/put` over its own keep-alive connection."""

    def __init__(self, conn: HttpConnection) -> None:
        self._conn = conn

    async def put(self, key: bytes, value: bytes) -> None:
        body = (
            b'{"key":"' + base64.b64encode(key) + b'","value":"' + base64.b64encode(value)
            + b'"}'
        )
        reply = await self._conn.post_json("/v3/kv/put", body)
        if b'"header"' not in reply:
            raise EtcdError(f"unexpected put reply {reply[:200]!r}")

    async def aclose(self) -> None:
        await self._conn.aclose()


# --------------------------------------------------------------------------------------------
# The cluster


@dataclass(frozen=True, slots=True, kw_only=True)
class EtcdMember:
    name: str
    client_port: int
    peer_port: int


class EtcdCluster:
    """Three etcd members on loopback, started by us and stopped by their recorded pids."""

    name = "etcd"

    def __init__(self, binary: str, *, members: int = 3, extra_args: Sequence[str] = ()) -> None:
        self._binary = binary
        self._extra = tuple(extra_args)  # more etcd flags for every member
        ports = free_ports(2 * members)
        self.members = tuple(
            EtcdMember(name=f"e{i + 1}", client_port=ports[2 * i], peer_port=ports[2 * i + 1])
            for i in range(members)
        )
        self._dir = Path(tempfile.mkdtemp(prefix="phalanx-bench-etcd-"))
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self.leader: EtcdMember | None = None

    def start(self) -> None:
        for m in self.members:
            self._spawn(m)

    def _spawn(self, m: EtcdMember, state: str = "new") -> None:
        initial = ",".join(f"{x.name}=http://{LOOPBACK}:{x.peer_port}" for x in self.members)
        client_url = f"http://{LOOPBACK}:{m.client_port}"
        peer_url = f"http://{LOOPBACK}:{m.peer_port}"
        with (self._dir / f"{m.name}.log").open("ab") as log:
            # On a restart the data dir exists and etcd ignores the --initial-* flags.
            self._procs[m.name] = subprocess.Popen(
                [
                    self._binary, "--name", m.name, "--data-dir", str(self._dir / m.name),
                    "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
                    "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                    "--initial-cluster", initial, "--initial-cluster-token", "phalanx-bench",
                    "--initial-cluster-state", state, "--log-level", "warn", "--logger", "zap",
                    *self._extra,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    def kill(self, name: str) -> None:
        """SIGKILL the member we started under `name` (by its recorded pid)."""
        self._procs[name].kill()
        self._procs[name].wait()

    def restart(self, name: str, *, existing: bool = False) -> None:
        """Start member `name` again (`existing`: joining the running cluster with an empty
        data directory, after `etcdctl member add`)."""
        self._spawn(next(m for m in self.members if m.name == name),
                    "existing" if existing else "new")

    def data_dir(self, name: str) -> Path:
        return self._dir / name

    def server_pids(self) -> Sequence[int]:
        return [p.pid for p in self._procs.values()]

    async def wait_ready(self, timeout_s: float = 30.0) -> EtcdMember:
        """Wait until every member answers and agrees on a leader; return the leader."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for name, proc in self._procs.items():
                if proc.poll() is not None:
                    log = (self._dir / f"{name}.log").read_text(errors="replace")[-2000:]
                    raise EtcdError(f"etcd member {name} exited ({proc.returncode}): {log}")
            leader = await self._find_leader()
            if leader is not None:
                self.leader = leader
                return leader
            await trio.sleep(0.1)
        raise EtcdError(f"etcd cluster not ready after {timeout_s} s")

    async def _find_leader(self) -> EtcdMember | None:
        found: EtcdMember | None = None
        for m in self.members:
            try:
                conn = await HttpConnection.open(LOOPBACK, m.client_port)
            except OSError:
                return None
            try:
                with trio.move_on_after(2):
                    reply = json.loads(await conn.post_json("/v3/maintenance/status", b"{}"))
                    if reply.get("leader") and reply["leader"] == reply["header"]["member_id"]:
                        found = m
            except (EtcdError, OSError, ValueError, KeyError, trio.BrokenResourceError):
                return None
            finally:
                await conn.aclose()
        return found

    async def open_writer(self, index: int) -> Writer:
        if self.leader is None:
            raise RuntimeError("EtcdCluster.open_writer before wait_ready")
        return EtcdWriter(await HttpConnection.open(LOOPBACK, self.leader.client_port))

    def stop(self) -> None:
        # Followers first; the leader may try a leadership transfer and need SIGKILL.
        order = sorted(self._procs, key=lambda n: self.leader is not None and n == self.leader.name)
        for name in order:
            stop_process(self._procs[name], grace_s=3.0)
        shutil.rmtree(self._dir, ignore_errors=True)
