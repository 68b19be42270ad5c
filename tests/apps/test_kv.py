"""KV semantics: every command, size limits, typed errors, queries, snapshots and hooks."""

from __future__ import annotations

import itertools
import struct
import zlib

import msgpack  # type: ignore[import-untyped]
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.apps import kv_wire
from phalanx.apps.interface import (
    EndorsementHooks,
    KeyAccess,
    KeyUpdate,
    SnapshotFormatError,
)
from phalanx.apps.kv import KvStateMachine
from phalanx.apps.kv_types import (
    MAX_KEY_BYTES,
    MAX_SCAN_LIMIT,
    MAX_VALUE_BYTES,
    CasResult,
    CompareAndSet,
    Delete,
    Deleted,
    Done,
    Get,
    KvCommand,
    KvError,
    KvErrorCode,
    KvResult,
    Put,
    Scan,
    ScanResult,
    Value,
)
from phalanx.consensus.types import ClientRequest


def run(m: KvStateMachine, cmd: KvCommand) -> KvResult:
    return kv_wire.decode_result(m.apply(kv_wire.encode_command(cmd)))


def ask(m: KvStateMachine, cmd: KvCommand) -> KvResult:
    return kv_wire.decode_result(m.query(kv_wire.encode_command(cmd)))


def test_put_get_delete() -> None:
    m = KvStateMachine()
    assert run(m, Get(key="a")) == Value(value=None)
    assert run(m, Put(key="a", value=b"1")) == Done()
    assert run(m, Get(key="a")) == Value(value=b"1")
    assert run(m, Put(key="a", value=b"2")) == Done()
    assert ask(m, Get(key="a")) == Value(value=b"2")
    assert run(m, Delete(key="a")) == Deleted(existed=True)
    assert run(m, Delete(key="a")) == Deleted(existed=False)
    assert run(m, Get(key="a")) == Value(value=None)
    assert len(m) == 0


def test_compare_and_set_expected_value_and_absent() -> None:
    m = KvStateMachine()
    # "absent" expectation succeeds only while the key is missing
    assert run(m, CompareAndSet(key="k", expected=None, new=b"v1")) == CasResult(
        succeeded=True, current=b"v1"
    )
    assert run(m, CompareAndSet(key="k", expected=None, new=b"v2")) == CasResult(
        succeeded=False, current=b"v1"
    )
    assert run(m, CompareAndSet(key="k", expected=b"nope", new=b"v2")) == CasResult(
        succeeded=False, current=b"v1"
    )
    assert run(m, CompareAndSet(key="k", expected=b"v1", new=b"v2")) == CasResult(
        succeeded=True, current=b"v2"
    )
    assert m.get("k") == b"v2"
    run(m, Delete(key="k"))
    assert run(m, CompareAndSet(key="k", expected=b"v2", new=b"v3")) == CasResult(
        succeeded=False, current=None
    )
    # the empty value is a value, not absence
    assert run(m, CompareAndSet(key="e", expected=None, new=b"")).succeeded  # type: ignore[union-attr]
    assert run(m, CompareAndSet(key="e", expected=None, new=b"x")) == CasResult(
        succeeded=False, current=b""
    )


def test_scan_prefix_order_and_limit() -> None:
    m = KvStateMachine()
    for key in ["b2", "a", "b10", "b1", "c", "b", "bz", "é"]:
        run(m, Put(key=key, value=key.encode()))
    assert run(m, Scan(prefix="b", limit=10)) == ScanResult(
        items=(("b", b"b"), ("b1", b"b1"), ("b10", b"b10"), ("b2", b"b2"), ("bz", b"bz")),
        more=False,
    )
    assert run(m, Scan(prefix="b", limit=2)) == ScanResult(
        items=(("b", b"b"), ("b1", b"b1")), more=True
    )
    assert run(m, Scan(prefix="b", limit=5)) == ScanResult(
        items=(("b", b"b"), ("b1", b"b1"), ("b10", b"b10"), ("b2", b"b2"), ("bz", b"bz")),
        more=False,
    )
    everything = run(m, Scan(prefix="", limit=100))
    assert isinstance(everything, ScanResult)
    assert [k for k, _ in everything.items] == ["a", "b", "b1", "b10", "b2", "bz", "c", "é"]
    assert run(m, Scan(prefix="zz", limit=3)) == ScanResult(items=(), more=False)


@pytest.mark.parametrize(
    ("command", "code"),
    [
        (Put(key="k" * (MAX_KEY_BYTES + 1), value=b""), KvErrorCode.KEY_TOO_LARGE),
        (Put(key="é" * (MAX_KEY_BYTES // 2 + 1), value=b""), KvErrorCode.KEY_TOO_LARGE),
        (Put(key="k", value=b"x" * (MAX_VALUE_BYTES + 1)), KvErrorCode.VALUE_TOO_LARGE),
        (
            CompareAndSet(key="k", expected=None, new=b"x" * (MAX_VALUE_BYTES + 1)),
            KvErrorCode.VALUE_TOO_LARGE,
        ),
        (Get(key="k" * (MAX_KEY_BYTES + 1)), KvErrorCode.KEY_TOO_LARGE),
        (Scan(prefix="", limit=0), KvErrorCode.INVALID_LIMIT),
        (Scan(prefix="", limit=MAX_SCAN_LIMIT + 1), KvErrorCode.INVALID_LIMIT),
        (Scan(prefix="", limit=-5), KvErrorCode.INVALID_LIMIT),
    ],
)
def test_invalid_commands_get_typed_errors_and_change_nothing(
    command: KvCommand, code: KvErrorCode
) -> None:
    m = KvStateMachine()
    run(m, Put(key="k", value=b"old"))
    result = run(m, command)
    assert isinstance(result, KvError)
    assert result.code is code
    assert m.get("k") == b"old"
    assert len(m) == 1


def test_key_at_the_limit_is_accepted() -> None:
    m = KvStateMachine()
    assert run(m, Put(key="k" * MAX_KEY_BYTES, value=b"v")) == Done()


def test_not_a_query() -> None:
    m = KvStateMachine()
    result = ask(m, Put(key="k", value=b"v"))
    assert isinstance(result, KvError)
    assert result.code is KvErrorCode.NOT_A_QUERY
    assert m.get("k") is None


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xc1",
        b"\x93\x01\x02",  # an array that is no registered message
        kv_wire.encode_command(Put(key="k", value=b"v")) + b"\x00",  # trailing bytes
        kv_wire.encode_result(Done()),  # a result, not a command
        kv_wire.REGISTRY.encode(ClientRequest(client_id="c", request_no=1, command=b"")),
    ],
)
def test_malformed_command_is_a_typed_error(data: bytes) -> None:
    m = KvStateMachine()
    for answer in (m.apply(data), m.query(data)):
        result = kv_wire.decode_result(answer)
        assert isinstance(result, KvError)
        assert result.code is KvErrorCode.MALFORMED
    assert m.check(data).accept is False
    assert m.access(data) == KeyAccess()


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64))
def test_apply_never_raises_on_random_bytes(data: bytes) -> None:
    m = KvStateMachine()
    result = kv_wire.decode_result(m.apply(data))
    assert isinstance(result, KvResult.__args__)  # type: ignore[attr-defined]
    assert len(m) <= 1


def test_snapshot_is_isolated_from_later_writes() -> None:
    m = KvStateMachine()
    for i in range(50):
        run(m, Put(key=f"k{i}", value=b"v"))
    snap = m.snapshot()
    before = b"".join(snap.chunks())
    run(m, Put(key="k1", value=b"changed"))
    run(m, Delete(key="k2"))
    run(m, Put(key="new", value=b"x"))
    assert b"".join(snap.chunks()) == before
    restored = KvStateMachine()
    restored.restore(before)
    assert restored.get("k1") == b"v"
    assert restored.get("k2") == b"v"
    assert restored.get("new") is None
    assert len(restored) == 50


keys = st.text(alphabet="abcé\U0001f600", max_size=6)
pairs = st.dictionaries(keys, st.binary(max_size=8), max_size=40)


@settings(max_examples=60, deadline=None)
@given(pairs, st.randoms(use_true_random=False))
def test_checkpoint_bytes_are_deterministic_and_round_trip(
    items: dict[str, bytes], rnd: object
) -> None:
    order = list(items)
    rnd.shuffle(order)  # type: ignore[attr-defined]
    a, b = KvStateMachine(), KvStateMachine()
    for key in items:
        run(a, Put(key=key, value=items[key]))
    for key in order:  # a different insertion order: same state, same bytes
        run(b, Put(key=key, value=items[key]))
    data = b"".join(a.snapshot().chunks())
    assert data == b"".join(b.snapshot().chunks())
    c = KvStateMachine()
    c.restore(data)
    assert len(c) == len(items)
    assert all(c.get(k) == v for k, v in items.items())


def test_checkpoint_spans_many_chunks() -> None:
    m = KvStateMachine()
    for i in range(10_000):  # several shards
        run(m, Put(key=f"{(i * 7919) % 10_000:05d}", value=i.to_bytes(4, "big")))
    steps = list(m.snapshot().chunks())
    assert len(steps) > 5
    c = KvStateMachine()
    c.restore(b"".join(steps))
    assert len(c) == 10_000
    assert c.get("00000") == (0).to_bytes(4, "big")


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d[:-3],  # truncated
        lambda d: d + b"\x91\xa1z",  # an odd-length chunk appended
        lambda d: b"\x93\xaanot.kv.at\x01\x00" + d,  # wrong magic
        lambda d: b"",
    ],
)
def test_restore_rejects_malformed_checkpoints(mutate: object) -> None:
    m = KvStateMachine()
    run(m, Put(key="a", value=b"1"))
    run(m, Put(key="b", value=b"2"))
    data = b"".join(m.snapshot().chunks())
    target = KvStateMachine()
    run(target, Put(key="keep", value=b"me"))
    with pytest.raises(SnapshotFormatError):
        target.restore(mutate(data))  # type: ignore[operator]
    assert target.get("keep") == b"me"  # unchanged on failure


def test_restore_rejects_unsorted_and_miscounted_data() -> None:
    target = KvStateMachine()
    unsorted = msgpack.packb(["phalanx.kv", 1, 2]) + msgpack.packb(["b", b"1", "a", b"2"])
    with pytest.raises(SnapshotFormatError, match="ascending"):
        target.restore(unsorted)
    miscounted = msgpack.packb(["phalanx.kv", 1, 3]) + msgpack.packb(["a", b"1", "b", b"2"])
    with pytest.raises(SnapshotFormatError, match="declares 3"):
        target.restore(miscounted)


def test_the_count_trailer_is_checked_and_older_versions_still_load() -> None:
    """Version 3 carries its key count as a trailing int: a checkpoint cut before it, one
    whose trailer disagrees, and one with anything after it are all refused; versions 1
    (count in the header) and 2 (pairs, then the count) still load."""
    m = KvStateMachine()
    run(m, Put(key="a", value=b"1"))
    run(m, Put(key="b", value=b"2"))
    run(m, Delete(key="a"))
    data = b"".join(m.snapshot().chunks())
    head = msgpack.packb(["phalanx.kv", 3])
    body = msgpack.packb(["b", b"\0\0\0\0\1\0\0\0", b"2", b"\0\0\0\0\1\0\0\0"])
    assert data == head + body + msgpack.packb(1)
    target = KvStateMachine()
    for bad, why in [
        (head + body, "without its count"),
        (head + body + msgpack.packb(2), "declares 2"),
        (head + body + msgpack.packb(1) + body, "after its count"),
        (head + msgpack.packb(0) + msgpack.packb(0), "after its count"),
    ]:
        with pytest.raises(SnapshotFormatError, match=why):
            target.restore(bad)
    pairs = msgpack.packb(["b", b"2"])
    for old in (msgpack.packb(["phalanx.kv", 1, 1]) + pairs,
                msgpack.packb(["phalanx.kv", 2]) + pairs + msgpack.packb(1)):
        target.restore(old)
        assert (len(target), target.get("b"), target.get("a")) == (1, b"2", None)
        assert b"".join(target.snapshot().chunks()) == data  # rewritten as version 3
    empty = b"".join(KvStateMachine().snapshot().chunks())
    assert empty == head + msgpack.packb(0)
    target.restore(empty)
    assert len(target) == 0


def _shard(keys: list[str], values: list[bytes]) -> list[object]:
    """One version-3 shard record, built by hand (little-endian 4-byte offsets)."""
    def offsets(lengths: list[int]) -> bytes:
        cum = list(itertools.accumulate(lengths, initial=0))
        return struct.pack(f"<{len(cum)}I", *cum)

    return ["".join(keys), offsets([len(k) for k in keys]), b"".join(values),
            offsets([len(v) for v in values])]


def test_restore_refuses_malformed_version_3_shards() -> None:
    """Every check of a shard record: its shape and types, its offsets, the order of its
    keys (within and across shards), the size limits, the cut rule and the count."""
    from phalanx.apps.kv_base import MAX_SHARD_KEYS, SHARD_KEYS
    from phalanx.apps.kv_types import MAX_VALUE_BYTES

    def cut(key: str) -> bool:
        return zlib.crc32(key.encode()) % SHARD_KEYS == 0

    names = (f"k{i:05d}" for i in itertools.count())
    plain = [k for k in itertools.islice(names, 5000) if not cut(k)]
    ends = [k for k in (f"z{i:05d}" for i in range(100_000)) if cut(k)][:2]
    head = msgpack.packb(["phalanx.kv", 3])

    def checkpoint(*shards: list[object], count: int | None = None) -> bytes:
        held = sum(len(s[1]) // 4 - 1 for s in shards)  # type: ignore[arg-type]
        return head + b"".join(map(msgpack.packb, shards)) + msgpack.packb(
            held if count is None else count)

    good = _shard([plain[0], plain[1], ends[0]], [b"x", b"", b"yz"])
    last = _shard([ends[1] + "a"], [b"w"]) if not cut(ends[1] + "a") else _shard(
        [ends[1] + "b"], [b"w"])
    target = KvStateMachine()
    target.restore(checkpoint(good, last))
    assert (target.get(plain[0]), target.get(ends[0]), len(target)) == (b"x", b"yz", 4)
    after = next(ends[0] + c for c in "abcdefgh" if not cut(ends[0] + c))
    kstr, kraw, blob, vraw = good
    assert isinstance(kraw, bytes)
    assert isinstance(vraw, bytes)
    for bad, why in [
        (checkpoint(good[:3]), "not \\[keys"),
        (checkpoint([kstr, kraw, kstr, vraw]), "wrong field types"),
        (checkpoint([kstr, kraw[:-1], blob, vraw]), "malformed key offsets"),
        (checkpoint([kstr, kraw, blob, vraw[:-4] + b"\x09\0\0\0"]), "value offsets out of"),
        (checkpoint([kstr, kraw[:4] + kraw[8:12] + kraw[4:8] + kraw[12:], blob, vraw]),
         "ascending"),  # key offsets out of order cut an empty key in the middle
        (checkpoint([kstr, kraw, blob, vraw[:8] + vraw[12:] + vraw[8:12]]),
         "value offsets out of"),
        (checkpoint(_shard([plain[0]], [b""]), _shard([plain[1]], [b""])),
         "the cut rule does not cut"),
        (checkpoint(_shard([plain[1], plain[0]], [b"", b""])), "ascending"),
        (checkpoint(good, _shard([plain[0]], [b""])), "ascending"),
        (checkpoint(_shard([plain[0]], [b"v" * (MAX_VALUE_BYTES + 1)])), "size limit"),
        (checkpoint(_shard(plain[:MAX_SHARD_KEYS + 1], [b""] * (MAX_SHARD_KEYS + 1))),
         "shard over the size limit"),
        (checkpoint(good, count=4), "declares 4"),
        (checkpoint([*_shard([plain[0], plain[1]], [b"", b""])[:2], b"", b"\0" * 8]),
         "key and value counts differ"),
    ]:
        with pytest.raises(SnapshotFormatError, match=why):
            target.restore(bad)
    assert target.get(plain[0]) == b"x"  # unchanged by every refusal
    # A cut key inside a shard is not looked for on load (a CRC per key); the first
    # checkpoint finds it and re-cuts the shard, so the bytes follow the rule again.
    inside = checkpoint(_shard([plain[0], ends[0], after], [b""] * 3))
    target.restore(inside)
    assert b"".join(target.snapshot().chunks()) == checkpoint(
        _shard([plain[0], ends[0]], [b""] * 2), _shard([after], [b""]))
    full = _shard(plain[:MAX_SHARD_KEYS], [b""] * MAX_SHARD_KEYS)  # no cut key: full
    target.restore(checkpoint(full, last))
    assert len(target) == MAX_SHARD_KEYS + 1


def test_endorsement_hooks() -> None:
    m = KvStateMachine()
    assert isinstance(m, EndorsementHooks)
    enc = kv_wire.encode_command
    # A put is a write of "a" described as a "set" update (it commutes with an identical put).
    assert m.access(enc(Put(key="a", value=b""))) == KeyAccess(
        writes=("a",), updates=(KeyUpdate(key="a", op="set", operand=b""),))
    assert m.access(enc(Delete(key="a"))) == KeyAccess(writes=("a",))
    assert m.access(enc(Get(key="a"))) == KeyAccess(reads=("a",))
    assert m.access(enc(CompareAndSet(key="a", expected=None, new=b""))) == KeyAccess(
        reads=("a",), writes=("a",)
    )
    assert m.access(enc(Scan(prefix="p", limit=1))) == KeyAccess(read_prefixes=("p",))
    assert m.check(enc(Put(key="a", value=b""))).accept
    assert not m.check(enc(Scan(prefix="", limit=0))).accept
    put_a = m.access(enc(Put(key="a", value=b"")))
    assert put_a.conflicts_with(m.access(enc(Get(key="a"))))
    assert put_a.conflicts_with(m.access(enc(Scan(prefix="", limit=1))))
    assert not put_a.conflicts_with(m.access(enc(Put(key="b", value=b""))))
    assert not m.access(enc(Get(key="a"))).conflicts_with(m.access(enc(Get(key="a"))))
