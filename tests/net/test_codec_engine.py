"""The codec's msgpack engine (msgspec, `phalanx.net.codec_fast.pack`/`unpack`) writes exactly
the bytes msgpack-python writes (the engine the wire format was defined with), for every value
shape the field codecs hand it and for a sample of every registered message type, and reads
back what msgpack-python reads."""

from __future__ import annotations

import dataclasses
import enum
import importlib
import types
import typing

import msgpack  # type: ignore[import-untyped]  # no stubs shipped
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.consensus.types import ClientRequest, Configuration, Entry, EntryKind, NodeId
from phalanx.net import wire
from phalanx.net.codec import DecodeError
from phalanx.net.codec_fast import pack, unpack

# Every message mapping in the repository (protocols, services, client and admin calls); the
# app types register themselves on import.
MAPPINGS = (
    "phalanx.consensus.raft.messages:RAFT_MESSAGES",
    "phalanx.consensus.pbft.messages:PBFT_MESSAGES",
    "phalanx.consensus.leaderless.messages:LEADERLESS_MESSAGES",
    "phalanx.gossip.messages:GOSSIP_MESSAGES",
    "phalanx.services.clustersend_node:CLUSTERSEND_SERVICE_MESSAGES",
    "phalanx.net.client_protocol:CLIENT_MESSAGES",
    "phalanx.ops.admin_messages:ADMIN_MESSAGES",
    "phalanx.services.messages:SERVICE_CALL_MESSAGES",
)
APP_MODULES = ("phalanx.apps.kv_wire", "phalanx.apps.chain.types", "phalanx.apps.chain.block",
               "phalanx.apps.chain.certificate")


def reference_pack(value: object) -> bytes:
    """msgpack-python, configured as the codec used it before msgspec."""
    data: bytes = msgpack.Packer(use_bin_type=True, strict_types=True, datetime=False).pack(value)
    return data


def _edge_ints() -> st.SearchStrategy[int]:
    edges = [0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1, 2**63,
             2**64 - 1, -1, -32, -33, -128, -129, -32768, -32769, -(2**31), -(2**31) - 1,
             -(2**63)]
    return st.sampled_from(edges) | st.integers(min_value=-(2**63), max_value=2**64 - 1)


def _sized(kind: st.SearchStrategy[int]) -> st.SearchStrategy[int]:
    return st.sampled_from([0, 1, 15, 16, 31, 32, 255, 256, 65535, 65536]) | kind


LEAVES = (
    st.none() | st.booleans() | _edge_ints()
    | _sized(st.integers(0, 300)).map(lambda n: "é" * (n // 2) + "x" * (n % 2))
    | st.text(max_size=40)
    | _sized(st.integers(0, 300)).map(lambda n: b"\x00" * n)
)
RAW = st.recursive(LEAVES, lambda inner: st.lists(inner, max_size=20), max_leaves=30)


@settings(max_examples=150, deadline=None)
@given(RAW)
def test_engine_writes_msgpack_pythons_bytes(value: object) -> None:
    data = pack(value)
    assert data == reference_pack(value)
    assert unpack(data) == value


@pytest.mark.parametrize("n", [15, 16, 65535, 65536])
def test_long_arrays_have_msgpack_pythons_headers(n: int) -> None:
    assert pack([0] * n) == reference_pack([0] * n)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40))
def test_engine_reads_what_msgpack_python_reads(data: bytes) -> None:
    """Both accept the same frames with the same result, except for what the codec's field
    checks reject anyway (maps, floats, ext types and timestamps)."""
    try:
        ours: object = unpack(data)
    except Exception:
        ours = DecodeError
    try:
        theirs: object = msgpack.unpackb(data, raw=False, strict_map_key=False,
                                         ext_hook=lambda code, raw: DecodeError)
    except Exception:
        theirs = DecodeError
    if ours != theirs:
        assert _has_non_codec_type(theirs) or _has_non_codec_type(ours), (data.hex(), ours)


def _has_non_codec_type(value: object) -> bool:
    if isinstance(value, list):
        return any(_has_non_codec_type(v) for v in value)
    return type(value) not in (int, str, bytes, bool, type(None))


# ---------------------------------------------------------------------------- every type


def _register_everything() -> dict[int, type]:
    for spec in MAPPINGS:
        module, attr = spec.split(":")
        wire.register_all(getattr(importlib.import_module(module), attr))
    for module in APP_MODULES:
        importlib.import_module(module)
    return wire.default_registry().classes()


def _candidates(tp: object, classes: dict[int, type], depth: int) -> list[object]:
    """A few values of declared type `tp`, most plausible first (for `__post_init__`s)."""
    if tp is None or tp is type(None):
        return [None]
    if tp is bool:
        return [True, False]
    if tp is int:
        return [1, 2**40, 0, 7]
    if tp is str:
        return ["n1", "client-1"]
    if tp is bytes:
        return [b"d" * 32, b"s" * 64, b"x"]
    if isinstance(tp, typing.NewType):
        return _candidates(tp.__supertype__, classes, depth)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return [(c,) for c in _candidates(args[0], classes, depth)[:2]] + [()]
        parts = [_candidates(a, classes, depth)[0] for a in args]
        return [tuple(parts)]
    if origin is frozenset:
        return [frozenset(_candidates(args[0], classes, depth)[:2]), frozenset()]
    if origin is typing.Union or origin is types.UnionType:
        members = [a for a in args if a is not type(None)]
        out = [v for m in members for v in _candidates(m, classes, depth)[:2]]
        return out + ([None] if len(members) < len(args) else [])
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        values: list[object] = list(tp)
        return values[:2]
    if isinstance(tp, type):
        subclasses = [c for c in classes.values() if issubclass(c, tp)] or [tp]
        return [obj for c in subclasses[:3] if (obj := _build(c, classes, depth + 1)) is not None]
    raise AssertionError(f"no candidates for {tp!r}")


def _build(cls: type, classes: dict[int, type], depth: int = 0) -> object | None:
    """An instance of `cls` with every field set (defaults overridden where a value fits),
    or None if no combination tried passes its `__post_init__`."""
    if depth > 6:
        return None
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)
    options = {f.name: _candidates(hints[f.name], classes, depth) for f in fields}
    if not all(options.values()):
        return None  # a nested message too deep to build
    for attempt in range(4):
        kwargs = {name: values[min(attempt, len(values) - 1)]
                  for name, values in options.items()}
        try:
            built: object = cls(**kwargs)
        except (ValueError, TypeError):
            continue
        return built
    return None


REQUEST = ClientRequest(client_id="client-1", request_no=2**33, command=b"v" * 100)
EXPLICIT: tuple[object, ...] = (  # what `_build`'s field-by-field guesses cannot satisfy
    Entry(index=1, term=2, kind=EntryKind.COMMAND, requests=(REQUEST, REQUEST)),
    Entry(index=3, term=2, kind=EntryKind.COMMAND, requests=(REQUEST,),
          timestamp=1_700_000_000_000, proposer="n2"),
    Entry(index=4, term=2, kind=EntryKind.CONFIG,
          config=Configuration(voters=(NodeId("n1"), NodeId("n2")))),
    Entry(index=5, term=2, kind=EntryKind.NOOP),
)


def _samples() -> list[object]:
    classes = _register_everything()
    samples = [obj for cls in classes.values() if (obj := _build(cls, classes)) is not None]
    samples.extend(EXPLICIT)
    missing = set(classes.values()) - {type(obj) for obj in samples}
    assert not missing, f"no sample of {sorted(cls.__name__ for cls in missing)}"
    return samples


def _mismatches(engine: typing.Callable[[object], bytes], samples: list[object]) -> list[str]:
    """The sample classes whose array `engine` writes differently from msgpack-python."""
    registry = wire.default_registry()
    out = []
    for obj in samples:
        raw = registry._by_class[type(obj)].encode(obj, 0)
        if engine(raw) != reference_pack(raw):
            out.append(type(obj).__name__)
    return out


def test_every_registered_type_encodes_as_with_msgpack_python() -> None:
    """A sample of every registered message type: the codec's bytes are msgpack-python's
    bytes of the same array, and they decode back to the sample."""
    samples = _samples()
    assert _mismatches(pack, samples) == []
    registry = wire.default_registry()
    for obj in samples:
        data = registry.encode(obj)
        assert data == pack(registry._by_class[type(obj)].encode(obj, 0))
        assert registry.decode(data) == obj, type(obj).__name__


def test_the_comparison_catches_an_engine_that_differs() -> None:
    """Control: an engine writing bytes as msgpack str (msgpack-python's old default) is
    caught on every sample that carries bytes."""
    samples = _samples()
    wrong = msgpack.Packer(use_bin_type=False).pack
    caught = _mismatches(wrong, samples)
    assert "Entry" in caught
    assert len(caught) >= len(samples) // 2
