"""Trailing optional fields of wire messages: left off the wire at their default.

Owns: `optional_tail` (a class's trailing ``wire_optional`` fields, checked) and
`omit_defaults` (wraps a class's encoder/decoder pair). `phalanx.net.codec` uses both when it
registers a class; its module docstring states the rule: a field declared with
``field(default=..., metadata={"wire_optional": True})`` (a scalar default), after every
other field, is omitted from the array while it and every later one hold their defaults,
and a default sent explicitly is refused (`DecodeError`), so each value has ONE encoding
(canonical bytes for signing and hashing). Old encodings therefore stay byte-identical when
a message gains such a field.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Final

from phalanx.net.codec_fields import DecodeError, Decoder, Encoder

OPTIONAL_DEFAULTS: Final = (int, str, bytes, bool, type(None))


def optional_tail(cls: type) -> tuple[tuple[str, object], ...]:
    """The (name, default) of `cls`'s trailing ``wire_optional`` fields, in order (see the
    module docstring); TypeError when one is not trailing or its default is not a scalar."""
    fields = dataclasses.fields(cls)
    flags = [bool(f.metadata.get("wire_optional")) for f in fields]
    if not any(flags):
        return ()
    first = flags.index(True)
    if not all(flags[first:]):
        raise TypeError(f"{cls.__name__}: wire_optional fields must all come last")
    tail = []
    for f in fields[first:]:
        if type(f.default) not in OPTIONAL_DEFAULTS:
            raise TypeError(f"{cls.__name__}.{f.name}: a wire_optional field needs a scalar "
                            f"default (int, str, bytes, bool or None), got {f.default!r}")
        tail.append((f.name, f.default))
    return tuple(tail)


def omit_defaults(
    label: str, arity: int, optional: tuple[tuple[str, object], ...],
    encode: Encoder, decode: Decoder,
) -> tuple[Encoder, Decoder]:
    """Wrap a class's codec pair: trailing optional fields equal to their default are left
    off the array, and padded back (after checking the last present one is not at its
    default: one encoding per value) before `decode` sees the array."""
    first = arity - len(optional)  # array position of the first optional field
    defaults = [default for _, default in optional]
    kinds = [type(default) for default in defaults]

    def encode_tail(value: object, depth: int) -> object:
        out = typing.cast(list[object], encode(value, depth))
        while len(out) > first:
            last = out[-1]
            i = len(out) - 1 - first
            if type(last) is not kinds[i] or last != defaults[i]:
                break
            out.pop()
        return out

    def decode_tail(raw: object, depth: int) -> object:
        items = typing.cast(list[object], raw)
        n = len(items)
        if first < n <= arity:
            i = n - 1 - first  # the last field present is optional: not at its default
            if type(items[-1]) is kinds[i] and items[-1] == defaults[i]:
                raise DecodeError(
                    f"{label}: non-canonical: {optional[i][0]} is present at its default")
        if first <= n < arity:
            items = items + defaults[n - first:]
        return decode(items, depth)

    return encode_tail, decode_tail
