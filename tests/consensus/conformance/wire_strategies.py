"""Hypothesis strategies for any core's wire messages, built generically from the dataclass
fields' type hints (the same type vocabulary the codec accepts: `phalanx.net.codec`).

Owns: `Vocabulary` (node ids and real values captured from traffic, per class) and
`message_strategy(classes, vocab)`: fully generated messages of the given classes (ints
small, negative and huge within the codec's range, arbitrary bytes and str, node ids known
and unknown, tuples, optional and nested values), real captured messages, and real ones with
one or two fields replaced by generated values. A drawn value whose `__post_init__` rejects
it is replaced by a captured real value of its class when there is one (the codec rejects
such values at decode, so a peer can never deliver them).

Rules: no protocol knowledge; deterministic given hypothesis' draws.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from phalanx.consensus.types import Message

INT_EDGES = (-(2**63), -1, 0, 1, 2, 3, 2**31, 2**63 - 1, 2**64 - 1)
"""The codec's int range is -2**63 .. 2**64-1."""


@dataclass(slots=True)
class Vocabulary:
    """What generated values draw from besides random data."""

    node_ids: tuple[str, ...]
    real: dict[type, list[object]] = field(default_factory=dict)
    """Real values per dataclass (messages and nested records) seen in captured traffic."""

    def capture(self, value: object) -> None:
        """Remember `value` and every dataclass nested in it."""
        if isinstance(value, tuple | frozenset):
            for item in value:
                self.capture(item)
            return
        if not dataclasses.is_dataclass(value) or isinstance(value, type):
            return
        seen = self.real.setdefault(type(value), [])
        if len(seen) < 64 and value not in seen:
            seen.append(value)
        for f in dataclasses.fields(value):  # type: ignore[arg-type]
            self.capture(getattr(value, f.name))


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def value_strategy(tp: Any, vocab: Vocabulary, depth: int = 0) -> st.SearchStrategy[Any]:
    """Any value of type `tp` (a field's type hint)."""
    if tp is type(None):
        return st.none()
    if tp is bool:
        return st.booleans()
    if tp is int:
        return st.one_of(st.integers(-2, 40), st.sampled_from(INT_EDGES),
                         st.integers(-(2**63), 2**64 - 1))
    if tp is str:
        return st.one_of(st.sampled_from(vocab.node_ids), st.text(max_size=6))
    if tp is bytes:
        return st.binary(max_size=40)
    supertype = getattr(tp, "__supertype__", None)
    if supertype is not None:  # typing.NewType (NodeId)
        return value_strategy(supertype, vocab, depth)
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is tuple:
        size = 0 if depth > 2 else 3
        if len(args) == 2 and args[1] is Ellipsis:
            return st.lists(value_strategy(args[0], vocab, depth + 1), max_size=size).map(tuple)
        return st.tuples(*(value_strategy(a, vocab, depth + 1) for a in args))
    if origin is frozenset:
        return st.frozensets(value_strategy(args[0], vocab, depth + 1), max_size=3)
    if origin is typing.Union or isinstance(tp, types.UnionType):
        return st.one_of(*(value_strategy(a, vocab, depth) for a in args))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return st.sampled_from(list(tp))
    if tp is Message:
        classes = sorted((c for c in vocab.real if issubclass(c, Message)), key=repr)
        return st.one_of(*(record_strategy(c, vocab, depth + 1) for c in classes))
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return record_strategy(tp, vocab, depth + 1)
    raise TypeError(f"no strategy for field type {tp!r}")


def record_strategy(cls: type, vocab: Vocabulary, depth: int = 0) -> st.SearchStrategy[Any]:
    """Instances of dataclass `cls`: generated field by field, real, or real and mutated."""
    real = vocab.real.get(cls, [])
    hints = _hints(cls)

    @st.composite
    def generated(draw: st.DrawFn) -> object:
        kwargs = {name: draw(value_strategy(tp, vocab, depth)) for name, tp in hints.items()}
        return _build(draw, cls, kwargs, real)

    @st.composite
    def mutated(draw: st.DrawFn) -> object:
        base = draw(st.sampled_from(real))
        names = draw(st.lists(st.sampled_from(sorted(hints)), min_size=1, max_size=2,
                              unique=True))
        kwargs = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
        for name in names:
            kwargs[name] = draw(value_strategy(hints[name], vocab, depth))
        return _build(draw, cls, kwargs, real)

    if not real:
        return generated()
    return st.one_of(generated(), st.sampled_from(real), mutated())


def _build(draw: st.DrawFn, cls: type, kwargs: dict[str, Any], real: Sequence[object]) -> object:
    try:
        return cls(**kwargs)
    except (ValueError, TypeError):
        if not real:
            from hypothesis import reject

            reject()
        return draw(st.sampled_from(real))


def message_strategy(classes: Sequence[type], vocab: Vocabulary) -> st.SearchStrategy[Any]:
    """A message of one of `classes` (the core's own wire types)."""
    return st.one_of(*(record_strategy(c, vocab) for c in classes))


def plain_value(tp: Any, vocab: Vocabulary) -> Any:
    """A simple valid-looking value of type `tp` (ints 1, the first member id, a real value
    of a record when one was captured), for a message class no traffic showed."""
    if tp is type(None):
        return None
    if tp is bool:
        return False
    if tp is int:
        return 1
    if tp is str:
        return vocab.node_ids[0]
    if tp is bytes:
        return b"\x01" * 8
    supertype = getattr(tp, "__supertype__", None)
    if supertype is not None:
        return plain_value(supertype, vocab)
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return ()
        return tuple(plain_value(a, vocab) for a in args)
    if origin is frozenset:
        return frozenset()
    if origin is typing.Union or isinstance(tp, types.UnionType):
        return None if type(None) in args else plain_value(args[0], vocab)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return next(iter(tp))
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        real = vocab.real.get(tp)
        if real:
            return real[0]
        return tp(**{name: plain_value(t, vocab) for name, t in _hints(tp).items()})
    if isinstance(tp, type):  # a polymorphic field (`Message`): a real value of a subclass
        for cls in sorted(vocab.real, key=lambda c: (c.__module__, c.__qualname__)):
            if issubclass(cls, tp) and vocab.real[cls]:
                return vocab.real[cls][0]
    raise TypeError(f"no plain value for field type {tp!r}")
