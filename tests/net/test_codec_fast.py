"""The compiled fast paths (`phalanx.net.codec_fast`) agree with the generic field walk they
shortcut, fall back to it for every error, and the per-thread Packer is safe to share."""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass, fields

import msgpack
import pytest
from codec_samples import REGISTRY, Checked, Everything, Tree, make_registry, messages, sample
from hypothesis import given, settings

from phalanx.net.codec import DecodeError, EncodeError, Registry, _Spec
from phalanx.net.codec_fast import _raw_build, _slot_twin, pack


def spec_of(obj: object) -> _Spec:
    return REGISTRY._by_class[type(obj)]


@settings(deadline=None)
@given(messages)
def test_fast_paths_equal_the_generic_walk(obj: object) -> None:
    spec = spec_of(obj)
    fast = spec.encode(obj, 0)
    assert fast == spec.generic_encode(obj, 0)
    raw = msgpack.unpackb(pack(fast), raw=False)
    assert spec.decode(raw, 0) == spec.generic_decode(raw, 0) == obj


def test_fast_encode_falls_back_for_the_precise_error() -> None:
    bad = Everything.__new__(Everything)
    for f in Everything.__slots__:
        object.__setattr__(bad, f, getattr(sample(), f))
    object.__setattr__(bad, "n", 2**64)  # out of the msgpack range: the fast check fails
    with pytest.raises(EncodeError, match=r"Everything\.n"):
        REGISTRY.encode(bad)


def test_fast_decode_falls_back_for_the_precise_error() -> None:
    raw = msgpack.unpackb(REGISTRY.encode(sample()), raw=False)
    names = list(Everything.__slots__)
    raw[1 + names.index("n")] = "seven"
    with pytest.raises(DecodeError, match=r"Everything\.n: expected int, got str"):
        REGISTRY.decode(msgpack.packb(raw, use_bin_type=True))


def test_packer_per_thread_gives_identical_bytes() -> None:
    obj = sample()
    want = REGISTRY.encode(obj)
    seen: list[bytes] = []
    lock = threading.Lock()

    def work() -> None:
        got = [REGISTRY.encode(obj) for _ in range(300)]
        with lock:
            seen.extend(got)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 1200
    assert all(b == want for b in seen)


# -- construction without the frozen __init__ ------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class _Checked:
    """A `__post_init__` that validates and one that normalises."""

    n: int
    tags: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.n < 0:
            raise ValueError("n must be >= 0")
        object.__setattr__(self, "tags", tuple(sorted(self.tags)))


@dataclass(frozen=True, slots=True, kw_only=True, init=False)
class _OwnInit:
    """A hand-written __init__ (it doubles n): decoding must call it."""

    n: int

    def __init__(self, *, n: int) -> None:
        object.__setattr__(self, "n", n * 2)


_RAW = Registry()
_RAW.register_many({1: _Checked, 2: _OwnInit})


def test_raw_construction_only_for_generated_inits() -> None:
    assert _raw_build(_Checked, ["n", "tags"]) is not None
    assert _raw_build(_OwnInit, ["n"]) is None
    assert _raw_build(_Checked, ["tags", "n"]) is None  # not the declaration order


def test_twin_construction_only_for_exact_own_slots() -> None:
    twin = _slot_twin(_Checked, ["n", "tags"])
    assert twin is not None
    obj = twin()
    obj.n, obj.tags = 1, ()
    obj.__class__ = _Checked
    assert obj == _Checked(n=1)
    assert type(obj) is _Checked
    with pytest.raises(dataclasses.FrozenInstanceError):
        obj.n = 2
    assert _slot_twin(_Checked, ["tags", "n"]) is None  # not the slot order
    assert _slot_twin(_OwnInit, ["n"]) is not None  # (`_raw_build` already refuses it)

    class Base:
        __slots__ = ()

        def __setattr__(self, name: str, value: object) -> None:
            raise AttributeError(name)

    @dataclass(frozen=True, slots=True, kw_only=True)
    class OnCustomBase(Base):
        n: int

    assert _slot_twin(OnCustomBase, ["n"]) is None


def test_raw_construction_runs_post_init() -> None:
    obj = _RAW.decode(msgpack.packb([1, 3, ["b", "a"]], use_bin_type=True))
    assert obj == _Checked(n=3, tags=("a", "b"))
    assert obj.tags == ("a", "b")
    with pytest.raises(DecodeError, match=r"_Checked rejected its fields: n must be >= 0"):
        _RAW.decode(msgpack.packb([1, -1, []], use_bin_type=True))
    assert _RAW.decode(_RAW.encode(_OwnInit(n=2))).n == 8  # 2*2 encoded, then *2 decoded


@settings(deadline=None)
@given(messages)
def test_raw_construction_equals_calling_the_class(obj: object) -> None:
    spec = spec_of(obj)
    raw = msgpack.unpackb(pack(spec.encode(obj, 0)), raw=False)
    got = spec.decode(raw, 0)
    assert type(got) is type(obj)
    assert [getattr(got, f.name) for f in fields(obj)] == [  # type: ignore[arg-type]
        getattr(obj, f.name) for f in fields(obj)  # type: ignore[arg-type]
    ]


def _tree_chain(length: int, *, width: int = 1) -> Tree:
    tree = Tree(value=0)
    for i in range(1, length):
        tree = Tree(value=i, children=(tree,) * width)
    return tree


@pytest.mark.parametrize("max_depth", range(1, 12))
@pytest.mark.parametrize("length", range(1, 7))
def test_inline_array_walk_keeps_the_depth_limit_exactly(max_depth: int, length: int) -> None:
    # `Tree.children` (tuple[Tree, ...]) is walked inline by the compiled paths: at every
    # depth they accept exactly what the generic walk accepts, and fail the same way.
    registry = make_registry(max_depth=max_depth)
    tree = _tree_chain(length, width=2)
    spec = registry._by_class[type(tree)]
    try:
        want: object = spec.generic_encode(tree, 0)
    except EncodeError as exc:
        with pytest.raises(EncodeError, match=str(exc).replace("[", r"\[")):
            registry.encode(tree)
    else:
        assert spec.encode(tree, 0) == want
        data = registry.encode(tree)
        assert registry.decode(data) == tree
        raw = msgpack.unpackb(data, raw=False)
        assert spec.decode(raw, 0) == spec.generic_decode(raw, 0) == tree
    deeper = make_registry(max_depth=max_depth + 20)
    if max_depth < 2 * length:  # too deep for `registry`: decoding refuses it too
        with pytest.raises(DecodeError, match=f"max_depth={max_depth}"):
            registry.decode(deeper.encode(tree))


@pytest.mark.parametrize(
    ("element", "error"),
    [
        ([True, 2, []], "expected an int type id, got bool"),  # True == 1 == Leaf's id
        ([[1], 2, []], "expected an int type id, got list"),  # unhashable: no lookup crash
        ([1, 2], r"expected Tree, got Leaf"),  # a registered class the field does not allow
        ([99, 2, []], "unknown type id 99"),
        ([], r"expected Tree as \[type_id, ...\], got list"),
    ],
)
def test_inline_element_dispatch_refuses_what_the_generic_walk_refuses(
        element: list[object], error: str) -> None:
    tid = REGISTRY.type_id(Tree)
    raw = [tid, 1, [[tid, 2, []], element]]
    with pytest.raises(DecodeError, match=error):
        REGISTRY.decode(msgpack.packb(raw, use_bin_type=True))
    assert REGISTRY.decode(msgpack.packb([tid, 1, [[tid, 2, []]]], use_bin_type=True)) == Tree(
        value=1, children=(Tree(value=2),))


@pytest.mark.parametrize(("field", "value", "error"), [
    ("maybe", "7", r"Everything\.maybe: expected int, got str"),
    ("maybe_leaf", Tree(value=1), r"Everything\.maybe_leaf: expected Leaf, got Tree"),
])
def test_inline_optional_fields_fall_back_for_the_precise_error(
        field: str, value: object, error: str) -> None:
    bad = Everything.__new__(Everything)
    for f in Everything.__slots__:
        object.__setattr__(bad, f, getattr(sample(), f))
    object.__setattr__(bad, field, value)
    with pytest.raises(EncodeError, match=error):
        REGISTRY.encode(bad)
    raw = msgpack.unpackb(REGISTRY.encode(sample()), raw=False)
    raw[1 + list(Everything.__slots__).index(field)] = "seven"
    with pytest.raises(DecodeError, match=rf"Everything\.{field}"):
        REGISTRY.decode(msgpack.packb(raw, use_bin_type=True))
    for none_or_value in (None, sample().maybe_leaf):
        ok = dataclasses.replace(sample(), maybe_leaf=none_or_value, maybe=None)
        assert REGISTRY.decode(REGISTRY.encode(ok)) == ok


def test_fast_paths_are_compiled_at_first_use_with_the_same_results() -> None:
    """Registering compiles no fast path (start-up pays only for the classes it uses); the
    first encode or decode of a class puts them in place, and the bytes, the object and the
    errors are the ones a registry compiled from the start gives."""
    registry = make_registry()
    assert all(spec.compile_fast is not None for spec in registry._by_class.values())
    obj = sample()
    data = registry.encode(obj)
    compiled = registry._by_class[Everything]
    assert compiled.compile_fast is None
    assert registry._by_id[compiled.type_id] is compiled
    assert compiled.encode.__code__.co_filename.startswith("<phalanx codec for")
    assert registry._by_class[Checked].compile_fast is not None  # untouched: still lazy
    assert data == REGISTRY.encode(obj) == pack(compiled.generic_encode(obj, 0))
    fresh = make_registry()
    assert fresh.decode(data) == obj  # first use through decode
    assert fresh._by_class[Everything].compile_fast is None
    with pytest.raises(DecodeError, match="expected 2 fields"):
        make_registry().decode(pack([REGISTRY.type_id(Tree), 1, [], 3]))
