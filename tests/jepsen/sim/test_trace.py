"""The trace hash: batching the sha256 updates gives the digest of every line, in order."""

from __future__ import annotations

import hashlib

from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.jepsen.sim.loop import EventLoop, Trace

# An event: (advance the clock by ns, a text line) or (advance, src, dst, wire bytes).
_events = st.lists(
    st.one_of(
        st.tuples(st.integers(0, 10**7), st.text(max_size=20)),
        st.tuples(st.integers(0, 10**7), st.sampled_from(["n1", "n2"]),
                  st.sampled_from(["n2", "n3"]), st.binary(max_size=40)),
    ),
    max_size=1200,  # more than two batches
)


@settings(deadline=None, max_examples=60)
@given(_events)
def test_digest_is_sha256_of_every_line_in_order(events: list[tuple[object, ...]]) -> None:
    loop = EventLoop()
    trace = Trace(loop, tail=3)
    expected = hashlib.sha256()
    for event in events:
        loop.now += event[0]  # type: ignore[operator]
        now = loop.now
        if len(event) == 2:
            text = event[1]
            trace(text)  # type: ignore[arg-type]
            expected.update(f"t={now // 1_000_000}.{now % 1_000_000:06d}ms {text}\n".encode())
        else:
            _, src, dst, data = event
            trace.message(src, dst, f"msg{now}", data)  # type: ignore[arg-type]
            expected.update(f"t={now} {src}->{dst} ".encode() + data + b"\n")  # type: ignore[operator]
    assert trace.count == len(events)
    assert trace.hexdigest() == expected.hexdigest()
    # Reading the digest flushes nothing twice: later lines extend the same hash.
    trace("after")
    now = loop.now
    expected.update(f"t={now // 1_000_000}.{now % 1_000_000:06d}ms after\n".encode())
    assert trace.hexdigest() == expected.hexdigest()


def test_tail_renders_messages_lazily() -> None:
    loop = EventLoop()
    trace = Trace(loop, tail=2)
    trace("boot")
    loop.now = 2_500_000
    trace.message("n1", "n2", "Ping(1)", b"\x01")
    trace.message("n2", "n1", "Pong(1)", b"\x02")
    assert trace.tail() == ["t=2.500000ms n1->n2 Ping(1)", "t=2.500000ms n2->n1 Pong(1)"]
