"""Compiled fast paths for the strict codec (`phalanx.net.codec`).

Owns: `compile_fast`, which turns one registered class's field list into a specialised
encoder and decoder (straight-line Python source, compiled once at registration, the way
`dataclasses` builds ``__init__``), and the msgpack engine: `pack` and `unpack`, msgspec's
untyped msgpack `Encoder` and `Decoder` (C), one of each for the process.

Why: the generic codec walks a tuple of per-field closures for every message; on the
simulator's and the runtime's hot paths that walk, not msgpack, was most of the cost. The
compiled functions read every field into a local, check all scalar fields with exact
``type(x) is T`` tests in one condition, and build the array (or call the constructor) in one
expression.

Invariants (what makes this safe):
- Same accepted set, same output: a fast path returns only when every check the generic
  path makes has passed, in which case the generic path would have produced the identical
  array or object (fields in declaration order, the same nested codecs). On any doubt (a
  scalar of the wrong type, an int outside the msgpack range, the depth limit, an arity
  mismatch, or an error raised by a nested codec or the class's constructor) it calls the
  generic path, which then raises its precise, path-naming error. Errors are rare, so
  doing the work twice there costs nothing that matters.
- The generated source contains only identifiers made here (``f0``, ``f1``, ...) and field
  names, which `dataclasses` has already required to be identifiers; nothing from input data.
- Construction: when ``cls(**fields)`` provably does nothing but create the instance, set
  each slot and call `__post_init__` (the dataclass-generated ``__init__`` of a slotted class
  with the default ``__new__``, see `_raw_build`), the decoder does exactly that: through a
  mutable layout twin and ``__class__`` assignment (`_slot_twin`) when the class's own slots
  are its fields, else through the slots' raw setters, skipping the frozen ``__init__``'s
  ``object.__setattr__`` per field. The same object results and the same validation runs;
  anything else calls ``cls``.
- The engine sees only exact list/int/str/bytes/bool/None values (the field codecs check
  every value's exact type first) and writes the shortest form of each, byte for byte what
  msgpack-python writes for them. It does not release the GIL and its one hook only raises
  (ext types are refused), so one `Encoder` and one `Decoder` serve every thread. `unpack`
  returns msgpack maps and floats as dict and float: no declared field type accepts them, so
  they fail the field checks (a `DecodeError`, as before).
- Must not import `phalanx.net.codec` (which imports this module), trio, clocks or pickle.
"""

from __future__ import annotations

import dataclasses
import keyword
import types
import typing
from collections.abc import Callable, Mapping

import msgspec

__all__ = ["EnumInfo", "FastField", "compile_fast", "pack", "unpack"]

Coder = Callable[[object, int], object]

EnumInfo = tuple[type, Mapping[object, object], type]
"""An enum field: (the enum class, wire value -> member, the wire value's type)."""

FastField = tuple[str, Coder, Coder, type | None, EnumInfo | None]
"""One field: (name, generic encoder, generic decoder, the exact scalar type its value
passes through unchanged or None, the enum it holds or None). A field that is neither
runs its nested codec."""

pack: Callable[[object], bytes] = msgspec.msgpack.Encoder().encode
"""msgpack-encode a value built of lists, ints, strs, bytes (bin), bools and None."""

def _reject_ext(code: int, data: memoryview) -> object:
    raise ValueError(f"msgpack ext type {code} is not allowed")


unpack: Callable[[bytes | bytearray | memoryview], object] = msgspec.msgpack.Decoder(
    ext_hook=_reject_ext).decode
"""msgpack-decode exactly one value (trailing bytes, truncation and invalid utf-8 raise
`msgspec.DecodeError`, an ext type `ValueError`); arrays come back as lists."""


def compile_fast(
    *,
    type_id: int,
    cls: type,
    fields: tuple[FastField, ...],
    max_depth: int,
    int_min: int,
    int_max: int,
    slow_encode: Coder,
    slow_decode: Coder,
    errors: tuple[type[Exception], type[Exception]],
    arrays: Mapping[Coder, tuple[Coder, Coder]] | None = None,
    optionals: Mapping[Coder, tuple[Coder, Coder]] | None = None,
) -> tuple[Coder, Coder]:
    """The fast (encode, decode) pair for `cls`; each falls back to its `slow_*` twin.

    `errors` is (EncodeError, DecodeError): a nested codec raising one of them sends the
    call to the generic path for its precise message. `arrays` maps the decoder of a
    ``tuple[T, ...]`` field (T not a scalar) to T's (encoder, decoder): such a field's
    elements are walked inline (the array codec's own call and comprehension saved), with
    the array codec's checks (an exact tuple / list, the depth limit) made first; anything
    else calls the array codec. `optionals` maps the decoder of an ``X | None`` field to X's
    (encoder, decoder): None passes inline, anything else goes to X's coder (the optional
    codec's own call saved)."""
    encode_error, decode_error = errors
    for name, *_ in fields:
        if not name.isidentifier() or keyword.iskeyword(name):  # pragma: no cover - dataclasses
            raise TypeError(f"{cls.__name__}: field name {name!r} is not an identifier")
    env: dict[str, object] = {
        "TID": type_id,
        "CLS": cls,
        "MAX_DEPTH": max_depth,
        "INT_MIN": int_min,
        "INT_MAX": int_max,
        "SLOW_ENCODE": slow_encode,
        "SLOW_DECODE": slow_decode,
        "EncodeError": encode_error,
        "DecodeError": decode_error,
    }
    enc_checks: list[str] = []
    dec_checks: list[str] = []
    items: list[str] = []
    kwargs: list[str] = []
    enc_pre: list[str] = []
    dec_pre: list[str] = []
    for i, (name, enc, dec, exact, enum_info) in enumerate(fields):
        var = f"f{i}"
        element = arrays.get(dec) if arrays is not None and exact is None else None
        if element is not None and enum_info is None:
            # Exactly `enc{i}` / `dec{i}` (`array_codec` with no fixed parts and a
            # non-scalar element) for the common case; anything else calls them.
            env[f"enc{i}"], env[f"dec{i}"] = enc, dec
            env[f"EE{i}"], env[f"ED{i}"] = element
            enc_pre += [
                f"if type({var}) is tuple and d < MAX_DEPTH:",
                f"    a{i} = []",
                f"    for x in {var}:",
                f"        a{i}.append(EE{i}(x, d + 1))",
                "else:",
                f"    a{i} = enc{i}({var}, d)",
            ]
            dec_pre += [
                f"if type({var}) is list and d < MAX_DEPTH:",
                f"    a{i} = []",
                f"    for x in {var}:",
                f"        a{i}.append(ED{i}(x, d + 1))",
                f"    a{i} = tuple(a{i})",
                "else:",
                f"    a{i} = dec{i}({var}, d)",
            ]
            items.append(f"a{i}")
            kwargs.append(f"{name}=a{i}")
            continue
        if enum_info is not None:
            # Encode a member as its value; decode a value of the right type through the
            # value -> member table (KeyError: not a member -> the generic path says so).
            env[f"E{i}"], env[f"M{i}"], env[f"V{i}"] = enum_info
            enc_checks.append(f"type({var}) is E{i}")
            dec_checks.append(f"type({var}) is V{i}")
            items.append(f"{var}._value_")
            kwargs.append(f"{name}=M{i}[{var}]")
            continue
        inner = optionals.get(dec) if optionals is not None and exact is None else None
        if inner is not None and enum_info is None:
            env[f"OE{i}"], env[f"OD{i}"] = inner  # exactly what `optional_codec` calls
            items.append(f"(None if {var} is None else OE{i}({var}, d))")
            kwargs.append(f"{name}=(None if {var} is None else OD{i}({var}, d))")
            continue
        if exact is None:
            env[f"enc{i}"] = enc
            env[f"dec{i}"] = dec
            items.append(f"enc{i}({var}, d)")
            kwargs.append(f"{name}=dec{i}({var}, d)")
            continue
        env[f"T{i}"] = exact
        if exact is int:
            enc_checks.append(f"type({var}) is int and INT_MIN <= {var} <= INT_MAX")
        else:
            enc_checks.append(f"type({var}) is T{i}")
        dec_checks.append(f"type({var}) is T{i}")  # msgpack only yields in-range ints
        items.append(var)
        kwargs.append(f"{name}={var}")
    raw_build = _raw_build(cls, [name for name, *_ in fields])
    if raw_build is None:
        construct = f"return CLS({', '.join(kwargs)})"
    else:
        setters, post_init = raw_build
        twin = _slot_twin(cls, [name for name, *_ in fields])
        if twin is not None:
            # Plain slot stores into the layout twin, then `__class__ = CLS` (see `_slot_twin`).
            env["TWIN"] = twin
            steps = ["obj = TWIN()"]
            steps += [f"obj.{arg.split('=', 1)[0]} = {arg.split('=', 1)[1]}" for arg in kwargs]
            steps.append("obj.__class__ = CLS")
        else:
            steps = ["obj = NEW(CLS)"]
            for i, (setter, arg) in enumerate(zip(setters, kwargs, strict=True)):
                env[f"S{i}"] = setter
                steps.append(f"S{i}(obj, {arg.split('=', 1)[1]})")
            env["NEW"] = object.__new__
        if post_init is not None:
            env["POST"] = post_init
            steps.append("POST(obj)")
        steps.append("return obj")
        construct = "\n                ".join(steps)
    if dec_pre:
        construct = "\n                ".join([*dec_pre, construct])
    enc_body = "\n                ".join([*enc_pre, f"return [TID, {', '.join(items)}]"])
    names = [f"f{i}" for i in range(len(fields))]
    reads = "; ".join(f"f{i} = value.{name}" for i, (name, *_) in enumerate(fields))
    enc_cond = " and ".join(enc_checks) or "True"
    dec_cond = " and ".join(dec_checks) or "True"
    unpack = ", ".join(["_", *names]) + ("," if not names else "")
    source = f"""
def encode(value, depth):
    if depth < MAX_DEPTH:
        {reads or "pass"}
        if {enc_cond}:
            d = depth + 1
            try:
                {enc_body}
            except EncodeError:
                pass
    return SLOW_ENCODE(value, depth)

def decode(raw, depth):
    if depth < MAX_DEPTH and len(raw) == {len(fields) + 1}:
        {unpack} = raw
        if {dec_cond}:
            d = depth + 1
            try:
                {construct}
            except (DecodeError, ValueError, TypeError, KeyError):
                pass
    return SLOW_DECODE(raw, depth)
"""
    namespace: dict[str, object] = {}
    exec(compile(source, f"<phalanx codec for {cls.__qualname__}>", "exec"), env, namespace)
    return typing.cast(Coder, namespace["encode"]), typing.cast(Coder, namespace["decode"])


def _slot_twin(cls: type, names: list[str]) -> type | None:
    """A mutable class with `cls`'s exact slot layout, or None when there is none to make.

    Building a frozen slotted record through it (instantiate the twin, store each field with
    a plain slot store, then ``obj.__class__ = cls``) gives the very object the raw setters
    give, about three times cheaper: the frozen class's ``__setattr__`` blocks the
    interpreter's specialised slot store, the twin's does not. CPython checks layout
    compatibility at every ``__class__`` assignment (same base, same slots) and raises
    `TypeError` otherwise; it is also probed once here. Only for a class whose own
    ``__slots__`` are exactly `names` and whose base chain (below `object`) defines no
    ``__new__``, ``__init__`` or ``__setattr__`` (the twin shares that base). The same
    technique as `phalanx.consensus._fastpath.slot_twin` (this module imports no protocol code).
    """
    base = cls.__base__
    if base is None or tuple(names) != cls.__dict__.get("__slots__"):
        return None
    if "__new__" in vars(cls) or any(
        name in vars(k) for k in cls.__mro__[1:-1] for name in ("__new__", "__init__",
                                                                 "__setattr__")):
        return None
    twin = type(f"_{cls.__name__}Twin", (base,), {"__slots__": tuple(names)})
    try:
        probe = twin()
        probe.__class__ = cls
    except TypeError:  # pragma: no cover - layouts CPython finds incompatible
        return None
    return twin


def _raw_build(
    cls: type, names: list[str]
) -> tuple[list[Callable[[object, object], None]], Callable[[object], None] | None] | None:
    """(slot setters in `names` order, `__post_init__` or None) when ``cls(**kwargs)`` is
    exactly `object.__new__(cls)`, one slot store per field in declaration order, then
    `__post_init__()`; else None (build by calling the class).

    That holds for a dataclass whose ``__init__`` is the one `dataclasses` generated (compiled
    from a string, not written in a file) or `phalanx.consensus._fastpath.raw_init`'s (which
    does exactly that, through the same setters), with no InitVar and every field an ``__init__``
    parameter given here, whose instances use the default ``__new__`` and keep every field
    in a slot."""
    if not dataclasses.is_dataclass(cls) or cls.__new__ is not object.__new__:
        return None
    init = cls.__dict__.get("__init__")
    code = getattr(init, "__code__", None)
    generated = code is not None and code.co_filename == "<string>"
    if not (generated or getattr(init, "__raw_init__", False)):
        return None
    fields = dataclasses.fields(cls)
    if [f.name for f in fields] != names or not all(f.init for f in fields):
        return None
    if len(cls.__dataclass_fields__) != len(fields):
        return None  # InitVar (or ClassVar) pseudo-fields: be conservative
    setters: list[Callable[[object, object], None]] = []
    for name in names:
        slot = next((k.__dict__[name] for k in cls.__mro__ if name in k.__dict__), None)
        if not isinstance(slot, types.MemberDescriptorType):
            return None
        setters.append(slot.__set__)
    post_init = getattr(cls, "__post_init__", None)
    return setters, post_init
