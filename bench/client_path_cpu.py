"""CPU per write of a node's client-call path, in-process, without sockets or a core.

Usage (from bench/)::

    ../.venv/bin/python client_path_cpu.py                  # 3 runs of 200 passes of 256 calls
    ../.venv/bin/python codec_ab.py --base REV --modules clientport --grep "per write" -- \\
        client_path_cpu.py --runs 1

What one pass does, as the leader does it for one read of `--batch` pipelined calls
(`phalanx.runtime.client_port`, `phalanx.runtime.waiters`): frame decoding and
`wire.decode` of each `ClientCall`, the connection's call slot and its ``asked`` count, the
certificate check (`client_auth.refusal`), the waiter added (`ClientWaiters.add`); then,
once "applied", each answer (`ClientWaiters.answer`: the `ClientReply`, its encoding and
frame in `_Connection.deliver`) and the pass's flush (one joined write per connection,
handed to a stub TLS stream that takes everything). Not included: the driver's admission
checks (`Replica.admit`, the session table), the core, TLS encryption and the system calls
(`bench/pipelined.py`'s profiles show those). Prints process CPU microseconds per write for
the read side and the answer side, so a change to the client port can be A/B'd in a
minute, independent of the machine's load (CPU time, not wall time).

Must not be imported by the package. No I/O.
"""

from __future__ import annotations

import argparse
import time

import trio

from phalanx.consensus.types import ClientRequest
from phalanx.net import client_protocol, wire
from phalanx.net.client_protocol import ClientCall, ReplyStatus
from phalanx.net.framing import FrameDecoder, encode_frame
from phalanx.runtime.client_auth import Principal, refusal
from phalanx.runtime.client_port import ClientPortStatistics, _Connection
from phalanx.runtime.waiters import ClientWaiters

client_protocol.register()


class _Counters:
    replies = 0
    redirects = 0
    retries = 0


class _Tls:
    backlogged = False

    def try_send(self, data: bytes) -> bool:
        return True


class _Port:
    """The attributes of `ClientPort` a `_Connection` uses."""

    def __init__(self) -> None:
        self.stats = ClientPortStatistics()
        self.max_reply_size = 1 << 24
        self.batch_replies = True
        self.queued_replies = 0
        self._dirty: list[_Connection] = []

    def flush(self) -> None:
        dirty, self._dirty = self._dirty, []
        for conn in dirty:
            conn.flush()


async def run(batch: int, passes: int, command_bytes: int) -> tuple[float, float]:
    port = _Port()
    conn = _Connection("bench", 4 * batch, port)  # type: ignore[arg-type]
    conn.tls = _Tls()  # type: ignore[assignment]
    waiters = ClientWaiters("n1", _Counters())
    principal = Principal(name="client", role="read-write")
    base = "client/3ad025812c9e4f36851d8f098cd5d665"
    command = b"x" * command_bytes
    reads = []
    number = 0
    for _ in range(passes):
        frames = []
        for lane in range(batch):
            number += 1
            request = ClientRequest(client_id=f"{base}#{lane}", request_no=number,
                                    command=command)
            frames.append(encode_frame(wire.encode(ClientCall(request=request))))
        reads.append(b"".join(frames))
    read_s = answer_s = 0.0
    clock = time.process_time
    for data in reads:
        t0 = clock()
        decoder = FrameDecoder(max_frame_size=1 << 22)
        decoder.feed(data)
        calls = []
        while (payload := decoder.next_frame()) is not None:
            message = wire.decode(payload)
            assert isinstance(message, ClientCall)
            conn.slots.acquire_nowait()
            request = message.request
            key = (request.client_id, request.request_no)
            conn.asked[key] = conn.asked.get(key, 0) + 1
            if refusal(principal, request) is not None:
                raise SystemExit("refused")
            if not waiters.get(key):
                waiters.add(key, conn)  # type: ignore[arg-type]
            calls.append(message)
        t1 = clock()
        for message in calls:
            request = message.request
            waiters.answer(request.client_id, request.request_no, ReplyStatus.OK,
                           result=b"\x91\x00")
        port.flush()
        t2 = clock()
        read_s += t1 - t0
        answer_s += t2 - t1
    writes = batch * passes
    return read_s / writes * 1e6, answer_s / writes * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=256, help="calls per read (default 256)")
    p.add_argument("--passes", type=int, default=200, help="reads per run (default 200)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--command-bytes", type=int, default=130,
                   help="bytes per command (130: a KV put of a 100-byte value)")
    args = p.parse_args()
    for i in range(args.runs):
        read_us, answer_us = trio.run(run, args.batch, args.passes, args.command_bytes)
        print(f"run {i + 1}: client-call path per write: read+admit {read_us:.2f} us, "
              f"answer+deliver+flush {answer_us:.2f} us, sum {read_us + answer_us:.2f} us")


if __name__ == "__main__":
    main()
