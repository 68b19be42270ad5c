"""Field codecs of the strict msgpack codec: the (encoder, decoder) pair of each field type.

Owns: `DecodeError`, `EncodeError`, the int range, and the pure combinators `phalanx.net.codec`
compiles a registered class's fields from: scalars (`SCALARS`), `optional`, enums
(`enum_codec`), arrays (`array_codec`) and frozensets (`frozenset_codec`). Each encoder checks
a value against its declared type exactly (True is never an int, an IntEnum never its value)
and each decoder raises only `DecodeError`; `phalanx.net.codec` documents the wire shape and
the invariants, and re-exports the errors and the int range.
Must not import: trio, sockets, clocks, random, pickle, or any protocol module.
"""

from __future__ import annotations

import enum
import typing
from collections.abc import Callable, Iterable
from itertools import repeat
from typing import Final

from phalanx.net.codec_fast import EnumInfo, pack

Encoder = Callable[[object, int], object]
"""Checks a value against its declared type and returns its msgpack-ready form. The int is
the nesting depth of the array that contains the value."""
Decoder = Callable[[object, int], object]
"""Checks an unpacked msgpack value against the declared type and rebuilds the field."""

INT_MIN: Final = -(2**63)
INT_MAX: Final = 2**64 - 1


class DecodeError(Exception):
    """Bytes from a peer or a disk are not a valid encoding of a registered message.

    This is normal input, never a bug: the receiver drops the frame and counts it.
    """


class EncodeError(Exception):
    """Our own misuse: a value does not fit its declared field type, its class is not
    registered, or the frame would exceed the size or depth limits that peers enforce."""


def type_name(value: object) -> str:
    return type(value).__name__


def at_path(where: str, exc: Exception) -> str:
    """Prefix an error with where it happened: ``Entry.requests`` + ``[1]: ...``."""
    detail = str(exc)
    return f"{where}{detail}" if detail.startswith("[") else f"{where}: {detail}"


def scalar_codec(py_type: type, label: str) -> tuple[Encoder, Decoder]:
    def encode(value: object, depth: int) -> object:
        if type(value) is not py_type:
            raise EncodeError(f"expected {label}, got {type_name(value)}")
        if type(value) is int and not INT_MIN <= value <= INT_MAX:
            raise EncodeError(f"int {value} is outside the msgpack range")
        return value

    def decode(raw: object, depth: int) -> object:
        if type(raw) is not py_type:  # msgpack only yields ints within range
            raise DecodeError(f"expected {label}, got {type_name(raw)}")
        return raw

    return encode, decode


SCALARS: Final[dict[object, tuple[Encoder, Decoder]]] = {
    t: scalar_codec(t, "None" if t is type(None) else t.__name__)
    for t in (type(None), bool, int, str, bytes)
}
# The type each scalar decoder passes through unchanged: the fast paths skip calling it.
EXACT: Final[dict[Decoder, type]] = {dec: t for t, (_, dec) in SCALARS.items()}  # type: ignore[misc]


def optional_codec(inner: tuple[Encoder, Decoder]) -> tuple[Encoder, Decoder]:
    enc_inner, dec_inner = inner

    def encode(value: object, depth: int) -> object:
        return None if value is None else enc_inner(value, depth)

    def decode(raw: object, depth: int) -> object:
        return None if raw is None else dec_inner(raw, depth)

    OPTIONALS[decode] = inner
    return encode, decode


OPTIONALS: Final[dict[Decoder, tuple[Encoder, Decoder]]] = {}
"""``X | None`` field decoders -> X's (encoder, decoder), so the compiled fast paths can
test for None inline (see `codec_fast`)."""


def enum_codec(tp: type[enum.Enum], where: str) -> tuple[Encoder, Decoder]:
    if issubclass(tp, enum.Flag):
        raise TypeError(f"{where}: Flag enums have no single canonical value; use a tuple")
    members: dict[object, enum.Enum] = {m.value: m for m in tp}
    value_types = {type(v) for v in members}
    if not members or not (value_types == {int} or value_types == {str}):
        raise TypeError(f"{where}: enum {tp.__name__} values must be all int or all str")
    (value_type,) = value_types
    if value_type is int and not all(INT_MIN <= v <= INT_MAX for v in members):  # type: ignore[operator]
        raise TypeError(f"{where}: enum {tp.__name__} has values outside the msgpack range")
    label = tp.__name__

    def encode(value: object, depth: int) -> object:
        if type(value) is not tp:
            raise EncodeError(f"expected {label}, got {type_name(value)}")
        return value.value

    def decode(raw: object, depth: int) -> object:
        if type(raw) is not value_type:
            raise DecodeError(f"expected {label} ({value_type.__name__}), got {type_name(raw)}")
        member = members.get(raw)
        if member is None:
            raise DecodeError(f"{raw!r:.40} is not a {label}")
        return member

    ENUMS[decode] = (tp, members, value_type)
    return encode, decode


ENUMS: Final[dict[Decoder, EnumInfo]] = {}
"""Enum field decoders -> what the compiled fast paths need to inline them."""


def array_codec(
    parts: tuple[tuple[Encoder, Decoder], ...] | None, element: tuple[Encoder, Decoder],
    max_depth: int,
) -> tuple[Encoder, Decoder]:
    """A tuple as an array: of fixed `parts` (``tuple[A, B]``) or, if None, of any number
    of `element` (``tuple[T, ...]``)."""
    exact = None if parts is not None else EXACT.get(element[1])
    elem_enc, elem_dec = element
    # An endless repeat is stateless, so one instance serves every call.
    encoders: Iterable[Encoder] = repeat(element[0])
    decoders: Iterable[Decoder] = repeat(element[1])
    if parts is not None:
        encoders, decoders = [enc for enc, _ in parts], [dec for _, dec in parts]
    wanted = "array" if parts is None else f"an array of {len(parts)}"
    wanted_tuple = "tuple" if parts is None else f"a tuple of {len(parts)}"
    register_array = parts is None and exact is None

    def encode(value: object, depth: int) -> object:
        if type(value) is not tuple or (parts is not None and len(value) != len(parts)):
            got = f"a tuple of {len(value)}" if type(value) is tuple else type_name(value)
            raise EncodeError(f"expected {wanted_tuple}, got {got}")
        if depth >= max_depth:
            raise EncodeError(f"nesting deeper than max_depth={max_depth}")
        if not value:
            return []  # nothing to check (a fixed-length tuple was checked above)
        if exact is not None and exact is not int and all(type(x) is exact for x in value):
            return list(value)
        depth += 1
        if parts is None:
            try:  # fast path; on an error the loop below says which element
                return [elem_enc(item, depth) for item in value]
            except EncodeError:
                pass
        out: list[object] = []
        for i, (enc, item) in enumerate(zip(encoders, value, strict=False)):
            try:
                out.append(enc(item, depth))
            except EncodeError as exc:
                raise EncodeError(at_path(f"[{i}]", exc)) from None
        return out

    def decode(raw: object, depth: int) -> object:
        if type(raw) is not list or (parts is not None and len(raw) != len(parts)):
            got = f"an array of {len(raw)}" if type(raw) is list else type_name(raw)
            raise DecodeError(f"expected {wanted}, got {got}")
        if depth >= max_depth:
            raise DecodeError(f"nesting deeper than max_depth={max_depth}")
        if not raw:
            return ()  # nothing to check (a fixed-length array was checked above)
        if exact is not None and all(type(x) is exact for x in raw):
            return tuple(raw)
        depth += 1
        if parts is None:
            try:  # fast path; on an error the loop below says which element
                return tuple([elem_dec(item, depth) for item in raw])
            except DecodeError:
                pass
        out: list[object] = []
        for i, (dec, item) in enumerate(zip(decoders, raw, strict=False)):
            try:
                out.append(dec(item, depth))
            except DecodeError as exc:
                raise DecodeError(at_path(f"[{i}]", exc)) from None
        return tuple(out)

    if register_array:
        ARRAYS[decode] = element
    return encode, decode


ARRAYS: Final[dict[Decoder, tuple[Encoder, Decoder]]] = {}
"""``tuple[T, ...]`` field decoders (T not a scalar) -> T's (encoder, decoder), so the
compiled fast paths can walk such a field's elements inline (see `codec_fast`)."""


def frozenset_codec(element: tuple[Encoder, Decoder], max_depth: int) -> tuple[Encoder, Decoder]:
    enc_list, dec_list = array_codec(None, element, max_depth)

    def encode(value: object, depth: int) -> object:
        if type(value) is not frozenset:
            raise EncodeError(f"expected frozenset, got {type_name(value)}")
        items = typing.cast(list[object], enc_list(tuple(value), depth))
        # Canonical order: by encoded bytes, independent of hash seeds and insertion.
        return sorted(items, key=pack)

    def decode(raw: object, depth: int) -> object:
        items = typing.cast(tuple[object, ...], dec_list(raw, depth))
        result = frozenset(items)
        if len(result) != len(items):
            raise DecodeError("duplicate element in a frozenset")
        return result

    return encode, decode
