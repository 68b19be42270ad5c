"""The per-class codec of the strict msgpack codec (`phalanx.net.codec`).

Owns: `Spec` (one registered class: its type id, field names and codec pair), `build_spec`
(the generic field-by-field encoder and decoder of one class, wrapped for trailing
wire-optional fields, with the compiled fast paths of `phalanx.net.codec_fast` put in place
at first use) and `polymorphic` (the codec of a field holding any registered class among
some allowed ones, as its own ``[type_id, ...]`` array). `Registry` (in `phalanx.net.codec`)
owns the tables and calls these; the wire shape and invariants are documented there.
Must not import: `phalanx.net.codec` (which imports this module), trio, clocks or pickle.
Invariant: the generic paths here define the accepted set and the errors; a fast path is an
exact shortcut of them (`phalanx.net.codec_fast`).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping

from phalanx.net.codec_fast import compile_fast
from phalanx.net.codec_fields import (
    ARRAYS,
    ENUMS,
    EXACT,
    INT_MAX,
    INT_MIN,
    OPTIONALS,
    DecodeError,
    Decoder,
    EncodeError,
    Encoder,
    at_path,
    type_name,
)
from phalanx.net.codec_optional import omit_defaults, optional_tail

__all__ = ["Spec", "build_spec", "polymorphic"]


@dataclasses.dataclass(frozen=True, slots=True)
class Spec:
    """One registered class with its compiled field codecs."""

    type_id: int
    cls: type
    names: tuple[str, ...]
    encode: Encoder
    decode: Decoder
    generic_encode: Encoder
    """The field-by-field walk `encode` falls back to (kept for its error messages)."""
    generic_decode: Decoder
    compile_fast: Callable[[], tuple[Encoder, Decoder]] | None = None
    """Until compiled: builds the fast pair that `encode`/`decode` put in place at first use."""


def build_spec(
    type_id: int, cls: type, pairs: tuple[tuple[str, Encoder, Decoder], ...], *,
    max_depth: int, fast_spec: Callable[[int], Spec],
) -> Spec:
    """The `Spec` of class `cls` (id `type_id`) from its fields' codec `pairs` (name,
    encoder, decoder), in declaration order: the generic walk over the fields (its errors
    name the field path), wrapped for trailing wire-optional fields, and the fast paths
    compiled at first use (`encode`/`decode` call `fast_spec(type_id)` then, which puts the
    compiled spec in the registry's tables in place of this one)."""
    label = cls.__name__
    arity = len(pairs) + 1
    constructor: Callable[..., object] = cls
    # Fast path: a scalar field whose value has exactly its type skips the call.
    encoders = tuple((name, enc, EXACT.get(dec)) for name, enc, dec in pairs)
    decoders = tuple((name, dec, EXACT.get(dec)) for name, _, dec in pairs)

    def encode(value: object, depth: int) -> object:
        if depth >= max_depth:
            raise EncodeError(f"{label}: nesting deeper than max_depth={max_depth}")
        depth += 1
        out: list[object] = [type_id]
        for field_name, enc, exact in encoders:
            item = getattr(value, field_name)
            if type(item) is int:
                if exact is int and INT_MIN <= item <= INT_MAX:
                    out.append(item)
                    continue
            elif type(item) is exact:
                out.append(item)
                continue
            try:
                out.append(enc(item, depth))
            except EncodeError as exc:
                raise EncodeError(at_path(f"{label}.{field_name}", exc)) from None
        return out

    def decode(raw: object, depth: int) -> object:
        # The caller checked that raw is a non-empty list starting with type_id.
        items = typing.cast(list[object], raw)
        if depth >= max_depth:
            raise DecodeError(f"{label}: nesting deeper than max_depth={max_depth}")
        if len(items) != arity:
            raise DecodeError(f"{label}: expected {arity - 1} fields, got {len(items) - 1}")
        depth += 1
        kwargs: dict[str, object] = {}
        for (field_name, dec, exact), item in zip(decoders, items[1:]):  # noqa: B905
            if type(item) is exact:
                kwargs[field_name] = item
                continue
            try:
                kwargs[field_name] = dec(item, depth)
            except DecodeError as exc:
                raise DecodeError(at_path(f"{label}.{field_name}", exc)) from None
        try:
            return constructor(**kwargs)
        except (ValueError, TypeError) as exc:
            raise DecodeError(f"{label} rejected its fields: {exc}") from None

    names = tuple(name for name, _, _ in pairs)
    optional = optional_tail(cls)

    def compile_paths() -> tuple[Encoder, Decoder]:
        fast_encode: Encoder
        fast_decode: Decoder
        fast_encode, fast_decode = compile_fast(
            type_id=type_id,
            cls=cls,
            fields=tuple(
                (name, enc, dec, EXACT.get(dec), ENUMS.get(dec)) for name, enc, dec in pairs
            ),
            max_depth=max_depth,
            int_min=INT_MIN,
            int_max=INT_MAX,
            slow_encode=encode,
            slow_decode=decode,
            errors=(EncodeError, DecodeError),
            arrays=ARRAYS,
            optionals=OPTIONALS,
        )
        if optional:
            fast_encode, fast_decode = omit_defaults(
                label, arity, optional, fast_encode, fast_decode)
        return fast_encode, fast_decode

    def encode_first(value: object, depth: int) -> object:
        return fast_spec(type_id).encode(value, depth)

    def decode_first(raw: object, depth: int) -> object:
        return fast_spec(type_id).decode(raw, depth)

    generic_encode: Encoder = encode
    generic_decode: Decoder = decode
    if optional:
        generic_encode, generic_decode = omit_defaults(
            label, arity, optional, encode, decode)
    return Spec(
        type_id=type_id, cls=cls, names=names, encode=encode_first, decode=decode_first,
        generic_encode=generic_encode, generic_decode=generic_decode,
        compile_fast=compile_paths,
    )


def polymorphic(by_id: Mapping[int, Spec], by_class: Mapping[type, Spec],
                allowed: tuple[type, ...], label: str) -> tuple[Encoder, Decoder]:
    """The codec of a field holding any registered class among `allowed` (a dataclass, a
    union of them, or a base such as `Message`) as its own ``[type_id, ...]`` array. It
    looks classes up in the registry's live tables `by_id` and `by_class` at each call, so
    classes registered later, and fast paths compiled later, are used."""

    def encode(value: object, depth: int) -> object:
        spec = by_class.get(type(value))
        if spec is None:
            raise EncodeError(f"{type_name(value)} is not a registered message class")
        if not isinstance(value, allowed):
            raise EncodeError(f"expected {label}, got {type_name(value)}")
        return spec.encode(value, depth)

    def decode(raw: object, depth: int) -> object:
        if type(raw) is not list or not raw:
            raise DecodeError(f"expected {label} as [type_id, ...], got {type_name(raw)}")
        type_id = raw[0]
        if type(type_id) is not int:
            raise DecodeError(f"expected an int type id, got {type_name(type_id)}")
        spec = by_id.get(type_id)
        if spec is None:
            raise DecodeError(f"unknown type id {type_id}")
        if not issubclass(spec.cls, allowed):
            raise DecodeError(f"expected {label}, got {spec.cls.__name__}")
        return spec.decode(raw, depth)

    return encode, decode
