"""Sample message classes covering every field type the codec supports, their registry, and
hypothesis strategies for them. Shared by the codec's tests (not a test module itself)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NewType

from hypothesis import strategies as st

from phalanx.net.codec import INT_MAX, INT_MIN, Registry

Tag = NewType("Tag", str)


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Level(enum.IntEnum):
    LOW = 0
    HIGH = 7
    HUGE = 2**40


class Base:
    """A message base class: a field typed `Base` takes any registered subclass."""

    __slots__ = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Leaf(Base):
    n: int
    s: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Other(Base):
    flag: bool
    blob: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class Checked(Base):
    """Validates in `__post_init__`, as the consensus types do."""

    n: int

    def __post_init__(self) -> None:
        if self.n < 0:
            raise ValueError(f"n must be >= 0, got {self.n}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Tree(Base):
    """A recursive message, to exercise nesting limits."""

    value: int
    children: tuple[Tree, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Everything(Base):
    nothing: None
    flag: bool
    n: int
    s: str
    blob: bytes
    ints: tuple[int, ...]
    pair: tuple[str, bytes]
    empty: tuple[()]
    tags: frozenset[Tag]
    maybe: int | None
    level: Level
    color: Color
    tag: Tag
    leaf: Leaf
    either: Leaf | Other
    anything: Base
    maybe_leaf: Leaf | None
    leaves: tuple[Leaf, ...]
    leaf_set: frozenset[Leaf]
    nested: tuple[tuple[int, ...], ...]


SAMPLE_TYPES: dict[int, type] = {
    1: Leaf,
    2: Other,
    3: Checked,
    4: Tree,
    10: Everything,
}


def make_registry(**limits: int) -> Registry:
    registry = Registry(**limits)
    registry.register_many(SAMPLE_TYPES)
    return registry


REGISTRY = make_registry()


def sample() -> Everything:
    return Everything(
        nothing=None,
        flag=True,
        n=-5,
        s="héllo",
        blob=b"\x00\xff",
        ints=(1, 2, 3),
        pair=("a", b"b"),
        empty=(),
        tags=frozenset({Tag("x"), Tag("y"), Tag("z")}),
        maybe=None,
        level=Level.HIGH,
        color=Color.GREEN,
        tag=Tag("t"),
        leaf=Leaf(n=1),
        either=Other(flag=False, blob=b""),
        anything=Tree(value=1, children=(Tree(value=2),)),
        maybe_leaf=Leaf(n=2, s="two"),
        leaves=(Leaf(n=3), Leaf(n=4)),
        leaf_set=frozenset({Leaf(n=5), Leaf(n=6)}),
        nested=((1,), (), (2, 3)),
    )


# ------------------------------------------------------------------------------------------
# Strategies

ints = st.integers(min_value=INT_MIN, max_value=INT_MAX)
texts = st.text(max_size=12)
blobs = st.binary(max_size=24)
leaves = st.builds(Leaf, n=ints, s=texts)
others = st.builds(Other, flag=st.booleans(), blob=blobs)
checked = st.builds(Checked, n=st.integers(min_value=0, max_value=INT_MAX))
trees: st.SearchStrategy[Tree] = st.recursive(
    st.builds(Tree, value=ints),
    lambda kids: st.builds(Tree, value=ints, children=st.tuples(kids) | st.tuples(kids, kids)),
    max_leaves=6,
)
bases: st.SearchStrategy[Base] = st.one_of(leaves, others, checked, trees)

everything = st.builds(
    Everything,
    nothing=st.none(),
    flag=st.booleans(),
    n=ints,
    s=st.text(max_size=40),
    blob=st.binary(max_size=64),
    ints=st.lists(ints, max_size=6).map(tuple),
    pair=st.tuples(texts, blobs),
    empty=st.just(()),
    tags=st.frozensets(texts.map(Tag), max_size=6),
    maybe=st.none() | ints,
    level=st.sampled_from(Level),
    color=st.sampled_from(Color),
    tag=texts.map(Tag),
    leaf=leaves,
    either=leaves | others,
    anything=bases,
    maybe_leaf=st.none() | leaves,
    leaves=st.lists(leaves, max_size=4).map(tuple),
    leaf_set=st.frozensets(leaves, max_size=4),
    nested=st.lists(st.lists(ints, max_size=3).map(tuple), max_size=3).map(tuple),
)

messages: st.SearchStrategy[object] = st.one_of(everything, bases)
