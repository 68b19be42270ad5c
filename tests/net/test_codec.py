"""The strict codec: round trips, canonical bytes, every DecodeError case by name, and
registration and encoding misuse."""

from __future__ import annotations

import dataclasses
import enum
import os
import subprocess
import sys
import typing
from dataclasses import InitVar, dataclass, field
from typing import Any

import msgpack
import pytest
from codec_samples import (
    REGISTRY,
    Base,
    Checked,
    Color,
    Everything,
    Leaf,
    Level,
    Other,
    Tag,
    Tree,
    everything,
    leaves,
    make_registry,
    messages,
    sample,
    texts,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.net.codec import INT_MAX, INT_MIN, DecodeError, EncodeError, Registry


def pack(value: object) -> bytes:
    data: bytes = msgpack.packb(value, use_bin_type=True)
    return data


def raw_sample() -> list[Any]:
    """The unpacked wire form of `sample()`, to corrupt one piece at a time."""
    raw: list[Any] = msgpack.unpackb(REGISTRY.encode(sample()), raw=False)
    return raw


FIELDS = [f.name for f in dataclasses.fields(Everything)]


def corrupt(name: str, value: object) -> bytes:
    raw = raw_sample()
    raw[1 + FIELDS.index(name)] = value
    return pack(raw)


# ------------------------------------------------------------------------------------------
# Round trips and canonical bytes


@settings(deadline=None)  # CI shares 2 cores: no per-example timing
@given(messages)
def test_round_trip(obj: object) -> None:
    data = REGISTRY.encode(obj)
    back = REGISTRY.decode(data)
    assert back == obj
    assert type(back) is type(obj)
    assert REGISTRY.encode(back) == data
    assert REGISTRY.decode(data, canonical=True) == obj


def test_round_trip_keeps_exact_types() -> None:
    back = REGISTRY.decode(REGISTRY.encode(sample()), expected=Everything)
    assert back == sample()
    assert back.level is Level.HIGH
    assert back.color is Color.GREEN
    assert type(back.ints) is tuple
    assert type(back.tags) is frozenset
    assert type(back.nested[2]) is tuple


def test_wire_shape_is_type_id_then_fields_in_order() -> None:
    assert msgpack.unpackb(REGISTRY.encode(Leaf(n=7, s="a"))) == [1, 7, "a"]
    assert msgpack.unpackb(REGISTRY.encode(Tree(value=1, children=(Tree(value=2),)))) == [
        4,
        1,
        [[4, 2, []]],
    ]


@settings(deadline=None)  # CI shares 2 cores: no per-example timing
@given(st.lists(texts, unique=True, max_size=12), st.randoms(use_true_random=False))
def test_frozenset_bytes_ignore_construction_order(items: list[str], rnd: Any) -> None:
    shuffled = list(items)
    rnd.shuffle(shuffled)
    a = dataclasses.replace(sample(), tags=frozenset(map(Tag, items)))
    b = dataclasses.replace(sample(), tags=frozenset(map(Tag, shuffled)))
    assert a == b
    assert REGISTRY.encode(a) == REGISTRY.encode(b)
    encoded = msgpack.unpackb(REGISTRY.encode(a), raw=False)[1 + FIELDS.index("tags")]
    assert [pack(x) for x in encoded] == sorted(pack(x) for x in encoded)


@settings(deadline=None)  # CI shares 2 cores: no per-example timing
@given(everything, everything)
def test_equal_bytes_iff_equal_objects(a: Everything, b: Everything) -> None:
    assert (REGISTRY.encode(a) == REGISTRY.encode(b)) == (a == b)


def test_bytes_do_not_depend_on_hash_seed() -> None:
    script = (
        "from codec_samples import REGISTRY, Tag, Leaf, sample;"
        "import dataclasses;"
        "obj = dataclasses.replace(sample(), tags=frozenset(Tag(str(i)) for i in range(50)),"
        " leaf_set=frozenset(Leaf(n=i, s=str(i)) for i in range(20)));"
        "print(REGISTRY.encode(obj).hex())"
    )
    here = os.path.dirname(__file__)
    outputs = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": here}
        done = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
        )
        outputs.add(done.stdout)
    assert len(outputs) == 1


def test_canonical_bytes_is_encode_and_omit_drops_fields() -> None:
    obj = Other(flag=True, blob=b"sig")
    assert REGISTRY.canonical_bytes(obj) == REGISTRY.encode(obj)
    unsigned = REGISTRY.canonical_bytes(obj, omit=("blob",))
    assert msgpack.unpackb(unsigned) == [2, True]
    assert unsigned == REGISTRY.canonical_bytes(Other(flag=True, blob=b"other sig"), omit=("blob",))
    with pytest.raises(DecodeError, match="expected 2 fields, got 1"):
        REGISTRY.decode(unsigned)
    with pytest.raises(EncodeError, match="no field"):
        REGISTRY.canonical_bytes(obj, omit=("sig",))


def test_canonical_decode_rejects_other_encodings_of_the_same_object() -> None:
    leaf = Leaf(n=5, s="")
    long_int = b"\x93\x01\xcd\x00\x05\xa0"  # 5 as uint16
    assert REGISTRY.decode(long_int) == leaf
    with pytest.raises(DecodeError, match="non-canonical"):
        REGISTRY.decode(long_int, canonical=True)
    raw = raw_sample()
    tags = raw[1 + FIELDS.index("tags")]
    raw[1 + FIELDS.index("tags")] = list(reversed(tags))
    assert REGISTRY.decode(pack(raw)) == sample()
    with pytest.raises(DecodeError, match="non-canonical"):
        REGISTRY.decode(pack(raw), canonical=True)


def test_decode_accepts_bytearray_and_memoryview() -> None:
    data = REGISTRY.encode(sample())
    assert REGISTRY.decode(bytearray(data)) == sample()
    assert REGISTRY.decode(memoryview(data)) == sample()
    words = memoryview(data[: len(data) // 4 * 4]).cast("I")  # len() counts items, not bytes
    with pytest.raises(DecodeError, match=f"frame of {len(words) * 4} bytes exceeds"):
        make_registry(max_size=len(words) + 1).decode(words)
    with pytest.raises(TypeError, match="bytes"):
        REGISTRY.decode(typing.cast(bytes, "not bytes"))


# ------------------------------------------------------------------------------------------
# Every DecodeError, by name

DECODE_ERRORS: dict[str, tuple[bytes, str]] = {
    "unknown_type_id": (pack([99, 1]), "unknown type id 99"),
    "type_id_not_int": (pack(["Leaf", 1, ""]), "expected an int type id, got str"),
    "top_level_not_array": (pack(7), "as \\[type_id, ...\\], got int"),
    "empty_array": (pack([]), "got list"),
    "missing_field": (pack([1, 5]), "Leaf: expected 2 fields, got 1"),
    "extra_field": (pack([1, 5, "", 6]), "Leaf: expected 2 fields, got 3"),
    "wrong_field_type": (pack([1, "5", ""]), "Leaf.n: expected int, got str"),
    "bool_is_not_int": (pack([1, True, ""]), "Leaf.n: expected int, got bool"),
    "int_is_not_bool": (pack([2, 1, b""]), "Other.flag: expected bool, got int"),
    "str_is_not_bytes": (pack([2, True, "x"]), "Other.blob: expected bytes, got str"),
    "float": (pack([1, 1.0, ""]), "Leaf.n: expected int, got float"),
    "map": (pack({}), "got dict"),
    "non_empty_map": (pack([1, {"a": 1}, ""]), "Leaf.n: expected int, got dict"),
    "ext_type": (b"\x93\x01\xc7\x00\x05\xa0", "malformed msgpack.*ext type 5"),
    "fixext": (b"\x93\x01\xd4\x05\x00\xa0", "malformed msgpack"),
    "timestamp": (b"\x93\x01\xd6\xff\x00\x00\x00\x00\xa0", "Leaf.n: expected int, got datetime"),
    "invalid_utf8": (b"\x93\x01\x05\xa2\xff\xfe", "malformed msgpack.*Invalid UTF-8"),
    "truncated": (pack([1, 5, "abc"])[:-1], "malformed msgpack"),
    "trailing_bytes": (pack([1, 5, ""]) + b"\xc0", "malformed msgpack.*trailing characters"),
    "empty_input": (b"", "malformed msgpack"),
    "post_init_rejects": (pack([3, -1]), "Checked rejected its fields: n must be >= 0"),
    "wrong_class_for_field": (corrupt("leaf", [2, True, b""]), "Everything.leaf: expected Leaf"),
    "union_member_not_allowed": (
        corrupt("either", [4, 1, []]),
        "expected Leaf \\| Other, got Tree",
    ),
    "enum_unknown_value": (corrupt("level", 3), "Everything.level: 3 is not a Level"),
    "enum_wrong_value_type": (corrupt("color", 0), "expected Color \\(str\\), got int"),
    "int_enum_rejects_bool": (corrupt("level", False), "expected Level \\(int\\), got bool"),
    "fixed_tuple_arity": (corrupt("pair", ["a"]), "Everything.pair: expected an array of 2"),
    "empty_tuple_arity": (corrupt("empty", [1]), "Everything.empty: expected an array of 0"),
    "none_field": (corrupt("nothing", 0), "Everything.nothing: expected None, got int"),
    "tuple_not_array": (corrupt("ints", b"\x01"), "Everything.ints: expected array, got bytes"),
    "element_path": (
        corrupt("leaves", [[1, 1, ""], [1, "x", ""]]),
        "Everything.leaves\\[1\\]: Leaf.n: expected int, got str",
    ),
    "duplicate_set_element": (corrupt("tags", ["a", "a"]), "Everything.tags: duplicate element"),
    "nested_tuple_depth_in_schema": (corrupt("nested", [[[1]]]), "expected int, got list"),
}


@pytest.mark.parametrize("case", sorted(DECODE_ERRORS))
def test_decode_error(case: str) -> None:
    data, message = DECODE_ERRORS[case]
    with pytest.raises(DecodeError, match=message):
        REGISTRY.decode(data)


def test_decode_error_oversize_frame() -> None:
    small = make_registry(max_size=64)
    fits = small.encode(Leaf(n=1, s="x" * 40))
    assert small.decode(fits) == Leaf(n=1, s="x" * 40)
    big = REGISTRY.encode(Leaf(n=1, s="x" * 80))
    with pytest.raises(DecodeError, match="exceeds max_size=64"):
        small.decode(big)
    with pytest.raises(EncodeError, match="over max_size=64"):
        small.encode(Leaf(n=1, s="x" * 80))


def _chain(depth: int) -> Tree:
    tree = Tree(value=0)
    for i in range(1, depth):
        tree = Tree(value=i, children=(tree,))
    return tree


def test_decode_error_excessive_nesting() -> None:
    shallow = make_registry(max_depth=8)
    ok = _chain(4)  # Tree, children, Tree, children, Tree, children, Tree, []: depth 8
    assert shallow.decode(REGISTRY.encode(ok)) == ok
    deep = REGISTRY.encode(_chain(5))
    with pytest.raises(DecodeError, match="nesting deeper than max_depth=8"):
        shallow.decode(deep)
    with pytest.raises(EncodeError, match="nesting deeper than max_depth=8"):
        shallow.encode(_chain(5))


def test_decode_error_nesting_beyond_msgpack_stack() -> None:
    with pytest.raises(DecodeError, match="malformed msgpack"):
        REGISTRY.decode(b"\x91" * 100_000 + b"\xc0")


def test_decode_error_expected_class() -> None:
    data = REGISTRY.encode(Leaf(n=1))
    assert REGISTRY.decode(data, expected=Base) == Leaf(n=1)
    with pytest.raises(DecodeError, match="expected Other, got Leaf"):
        REGISTRY.decode(data, expected=Other)


# ------------------------------------------------------------------------------------------
# Encoding misuse


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (Leaf(n=True), "Leaf.n: expected int, got bool"),
        (Leaf(n=2**64), "Leaf.n: int 18446744073709551616 is outside the msgpack range"),
        (Leaf(n=INT_MIN - 1), "outside the msgpack range"),
        (Other(flag=1, blob=b""), "Other.flag: expected bool, got int"),  # type: ignore[arg-type]
        (Other(flag=True, blob=bytearray()), "expected bytes, got bytearray"),  # type: ignore[arg-type]
        (Tree(value=1, children=[Tree(value=2)]), "Tree.children: expected tuple, got list"),  # type: ignore[arg-type]
        (Tree(value=1, children=(Tree(value=2), Leaf(n=1))), "children\\[1\\]: expected Tree"),  # type: ignore[arg-type]
        (Leaf(n=1, s=None), "Leaf.s: expected str, got NoneType"),  # type: ignore[arg-type]
        (object(), "object is not a registered message class"),
        (Tree(value=1.5), "expected int, got float"),  # type: ignore[arg-type]
    ],
)
def test_encode_error(obj: object, message: str) -> None:
    with pytest.raises(EncodeError, match=message):
        REGISTRY.encode(obj)


def test_encode_error_on_fields() -> None:
    cases = {
        "level": (1, "Everything.level: expected Level, got int"),
        "tags": ({Tag("a")}, "Everything.tags: expected frozenset, got set"),
        "pair": (("a",), "Everything.pair: expected a tuple of 2"),
        "anything": (Tag("x"), "Everything.anything: str is not a registered message class"),
        "either": (Checked(n=1), "Everything.either: expected Leaf \\| Other, got Checked"),
        "leaf_set": (
            frozenset({Leaf(n=INT_MAX + 1)}),
            r"Everything\.leaf_set\[0\]: Leaf\.n: .*outside",
        ),
    }
    for name, (value, message) in cases.items():
        bad = dataclasses.replace(sample(), **{name: value})
        with pytest.raises(EncodeError, match=message):
            REGISTRY.encode(bad)


def test_int_range_edges_round_trip() -> None:
    for n in (INT_MIN, -1, 0, 127, 128, 2**32, INT_MAX):
        assert REGISTRY.decode(REGISTRY.encode(Leaf(n=n))) == Leaf(n=n)


# ------------------------------------------------------------------------------------------
# Registration misuse


@dataclass(frozen=True, slots=True, kw_only=True)
class Plain:
    x: int


@dataclass(slots=True, kw_only=True)
class Mutable:
    x: int


@dataclass(frozen=True, eq=False)
class NoEq:
    x: int


class NotADataclass:
    x: int


class Flags(enum.Flag):
    A = 1
    B = 2


class Mixed(enum.Enum):
    A = 1
    B = "b"


def _one_field(tp: object) -> type:
    return dataclasses.make_dataclass("Bad", [("x", tp)], frozen=True)


@pytest.mark.parametrize(
    ("cls", "message"),
    [
        (NotADataclass, "not a dataclass"),
        (Mutable, "must be a frozen dataclass"),
        (NoEq, "eq=True"),
        (_one_field(float), "unsupported field type <class 'float'>"),
        (_one_field(dict[str, int]), "unsupported field type"),
        (_one_field(list[int]), "unsupported field type"),
        (_one_field(set[int]), "unsupported field type"),
        (_one_field(Any), "unsupported field type"),
        (_one_field(object), "unsupported field type"),
        (_one_field(tuple[float, ...]), "Bad.x\\[\\]: unsupported field type"),
        (_one_field(int | str), "unions may only join dataclasses"),
        (_one_field(Leaf | int), "unions may only join dataclasses"),
        (_one_field(Flags), "Flag enums"),
        (_one_field(Mixed), "all int or all str"),
        (_one_field(frozenset[bytearray]), "unsupported field type"),
        (_one_field(Mutable), "must be a frozen dataclass"),
        (dataclasses.make_dataclass("Bad", [("a", Leaf), ("b", float)], frozen=True), "float"),
    ],
)
def test_register_rejects(cls: type, message: str) -> None:
    registry = Registry()
    with pytest.raises(TypeError, match=message):
        registry.register(1, cls)
    assert registry.classes() == {}
    assert registry.unregistered() == ()  # a rejected class leaves no references behind


def test_register_rejects_fields_that_cannot_round_trip() -> None:
    no_init = dataclasses.make_dataclass(
        "NoInit", [("x", int, field(default=0, init=False))], frozen=True
    )
    no_compare = dataclasses.make_dataclass(
        "NoCompare", [("x", int, field(compare=False))], frozen=True
    )
    init_var = dataclasses.make_dataclass("WithInitVar", [("x", InitVar[int])], frozen=True)
    unresolvable = dataclasses.make_dataclass("Unresolvable", [("x", "Missing")], frozen=True)
    for cls, message in [
        (no_init, "init=False"),
        (no_compare, "compare=False"),
        (init_var, "InitVar"),
        (unresolvable, "cannot resolve the type hints"),
    ]:
        with pytest.raises(TypeError, match=message):
            Registry().register(1, cls)


def test_register_rejects_duplicates_and_bad_ids() -> None:
    registry = Registry()
    registry.register(5, Plain)
    registry.register(5, Plain)  # the same pair again is a no-op
    assert registry.classes() == {5: Plain}
    with pytest.raises(TypeError, match="type id 5 is already Plain"):
        registry.register(5, Leaf)
    with pytest.raises(TypeError, match="Plain is already registered as type id 5"):
        registry.register(6, Plain)
    for bad in (0, -1, 0x10000, True, "5"):
        with pytest.raises(TypeError, match="type id must be an int"):
            registry.register(bad, Leaf)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="can only register classes"):
        registry.register(7, Leaf(n=1))  # type: ignore[arg-type]


def test_registry_limits_are_validated() -> None:
    for kwargs in ({"max_size": 0}, {"max_depth": 0}, {"max_size": 1.5}):
        with pytest.raises(ValueError, match="positive int"):
            Registry(**kwargs)  # type: ignore[arg-type]


def test_decorator_lookup_and_unregistered_references() -> None:
    registry = Registry()

    @registry.message(20)
    @dataclass(frozen=True, slots=True, kw_only=True)
    class Holder:
        leaf: Leaf
        maybe: Other | None = None

    assert registry.type_id(Holder) == 20
    assert Holder in registry
    assert Leaf not in registry
    assert registry.unregistered() == (
        "Leaf (used by Holder.leaf)",
        "Other (used by Holder.maybe)",
    )
    with pytest.raises(EncodeError, match=r"Holder\.leaf: Leaf is not a registered message class"):
        registry.encode(Holder(leaf=Leaf(n=1)))
    registry.register_many({1: Leaf, 2: Other})
    assert registry.unregistered() == ()
    obj = Holder(leaf=Leaf(n=1), maybe=Other(flag=True, blob=b"x"))
    assert registry.decode(registry.encode(obj)) == obj
    assert list(registry.classes()) == [1, 2, 20]
    with pytest.raises(KeyError):
        registry.type_id(Tree)


@settings(deadline=None)  # CI shares 2 cores: no per-example timing
@given(leaves)
def test_registries_are_independent(leaf: Leaf) -> None:
    other = Registry()
    other.register(42, Leaf)
    data = other.encode(leaf)
    assert data != REGISTRY.encode(leaf)
    assert other.decode(data) == leaf
    with pytest.raises(DecodeError, match="unknown type id 42"):
        REGISTRY.decode(data)
