"""The strict msgpack codec: registered frozen dataclasses to and from canonical bytes.

Owns: `Registry` (stable type id <-> class, with an encoder and a decoder compiled once per
class from its type hints) and the wire shape below. The per-field codecs, `DecodeError` and
`EncodeError` live in `phalanx.net.codec_fields` (re-exported here); the per-class codec
(`Spec`, the generic field walk, the polymorphic field codec) in `phalanx.net.codec_spec`;
the compiled fast paths in `phalanx.net.codec_fast` (compiled at a class's first encode or
decode, not at registration: start-up pays only for the classes a process uses).
Must not import: trio, sockets, clocks, random, pickle, or any protocol module. Protocols
register their classes into a registry (the project's default one is `phalanx.net.wire`);
the codec knows none of them.

Wire shape:
    A message is the msgpack array ``[type_id, f1, f2, ...]``, its fields in declaration
    order (`dataclasses.fields`). Every field is always present, defaults included, so a
    missing or an extra field is an arity error, with one exception: trailing fields declared
    ``field(default=..., metadata={"wire_optional": True})`` (a scalar default: int, str,
    bytes, bool or None) are left off the end of the array while they equal their default,
    and decode to it when absent; present at its default is a decode error (one encoding per
    value). So a field added that way keeps the bytes of every message that does not use it.
    A field whose type is a dataclass, a union of
    dataclasses or a base class (`phalanx.consensus.types.Message`: "any registered subclass")
    is itself such an array, carrying its own type id.

Field types (checked when a class is registered; anything else is a `TypeError` then):
    ===============================  ==============================================
    None, bool, str, bytes           the msgpack nil, bool, str (utf-8), bin
    int                              msgpack int, -2**63 .. 2**64-1; bool is not int
    tuple[T, ...], tuple[A, B]       array (fixed tuples check their arity)
    frozenset[T]                     array sorted by each element's encoded bytes;
                                     a duplicate element is a decode error
    X | None                         nil or X
    enum.Enum / IntEnum subclass     the member's value (all int or all str)
    typing.NewType                   its supertype
    dataclass, union of them, base   ``[type_id, ...]`` of a registered subclass
    ===============================  ==============================================
    Deliberately unsupported: float (no canonical form is needed anywhere), dict/Mapping and
    list/set (messages are immutable; use a tuple of pairs), other unions, `Any`, `object`.

Invariants:
- Canonical: `encode` is a function of the object's value, so equal objects give equal
  bytes and `canonical_bytes` is `encode` (optionally without some top-level fields, for
  signatures). Why: the array is built from the field values in a fixed order with exact
  type checks (True never passes as 1, an IntEnum never as its int); the msgpack engine
  (msgspec's, `codec_fast.pack`) always writes the shortest form of every int, str, bin and
  array header; frozensets are sorted
  by the bytes of their elements; there are no maps and no floats. Registered classes must
  compare by value (``eq=True`` and no ``compare=False`` field), so "equal" means "equal
  field values".
- Strict: `decode` raises `DecodeError` and nothing else on any bytes: oversize frame,
  malformed msgpack, trailing bytes, invalid utf-8, ext types, unknown type id, wrong field
  type, arity, excessive nesting, duplicate set elements, out-of-range enum values, and the
  `ValueError`/`TypeError` of a class's `__post_init__`. The message names the class and
  field path (``Entry.requests[1]: ClientRequest.request_no: expected int, got str``).
  Whatever `decode` returns is a valid object that `encode` accepts again.
- Our own misuse raises: `TypeError` at registration, `EncodeError` when encoding a value
  that does not fit its declared type (or the size and depth limits peers enforce).
- Deterministic and pure: no clocks, no randomness, no set iteration in the output, no pickle.
  Type ids and field order are the schema: changing either changes the wire format.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Callable, Mapping
from typing import Final, TypeVar, overload

from phalanx.net.codec_fast import pack, unpack
from phalanx.net.codec_fields import (
    INT_MAX,
    INT_MIN,
    SCALARS,
    DecodeError,
    Decoder,
    EncodeError,
    Encoder,
    array_codec,
    enum_codec,
    frozenset_codec,
    optional_codec,
    type_name,
)
from phalanx.net.codec_spec import Spec, build_spec, polymorphic

__all__ = [
    "DEFAULT_MAX_DEPTH",
    "DEFAULT_MAX_SIZE",
    "INT_MAX",
    "INT_MIN",
    "DecodeError",
    "EncodeError",
    "Registry",
]

T = TypeVar("T")

TYPE_ID_MAX: Final = 0xFFFF
DEFAULT_MAX_SIZE: Final = 16 * 1024 * 1024
DEFAULT_MAX_DEPTH: Final = 32


# The msgpack engine (msgspec's, `codec_fast.pack` and `unpack`): the field codecs hand it
# only exact list/int/str/bytes/bool/None values.
_pack = pack
_Spec = Spec  # the name this module used to define it under (tests import it)


class Registry:
    """A table of stable type ids for frozen dataclasses, and the codec over them.

    Args:
        max_size: the largest frame, in bytes, that `decode` accepts and `encode` produces.
        max_depth: the deepest nesting of msgpack arrays (a message is depth 1, each tuple,
            frozenset or nested message inside it one more) that either direction accepts.

    Determinism: the encoding depends only on the registered ids and the object's value.
    Registration is meant for import time; encode and decode never change what the table
    maps (decode caches one decoder per `expected` class, and a class's first encode or
    decode puts its compiled fast paths in place of the generic ones: the same results).
    """

    def __init__(
        self, *, max_size: int = DEFAULT_MAX_SIZE, max_depth: int = DEFAULT_MAX_DEPTH
    ) -> None:
        if type(max_size) is not int or max_size < 1:
            raise ValueError(f"max_size must be a positive int, got {max_size!r}")
        if type(max_depth) is not int or max_depth < 1:
            raise ValueError(f"max_depth must be a positive int, got {max_depth!r}")
        self.max_size: Final = max_size
        self.max_depth: Final = max_depth
        self._by_id: dict[int, Spec] = {}
        self._by_class: dict[type, Spec] = {}
        self._referenced: dict[type, str] = {}  # concrete dataclass -> where it is used
        self._expected: dict[type, Decoder] = {
            object: self._polymorphic((object,), "a registered message")[1]
        }

    # ----------------------------------------------------------------------------------
    # Registration (our own code; misuse raises TypeError)

    def register(self, type_id: int, cls: type) -> None:
        """Register `cls` under `type_id` and compile its codec.

        Re-registering the very same pair is a no-op; any other reuse of an id or a class
        raises. Every field type must be supported (see the module docstring) and resolvable
        by `typing.get_type_hints` now; dataclasses it refers to may be registered later.

        Raises:
            TypeError: `cls` is not a frozen, value-comparing dataclass, an id or the class is
                already taken, or a field has an unsupported type.
        """
        if type(type_id) is not int or not 1 <= type_id <= TYPE_ID_MAX:
            raise TypeError(f"type id must be an int in 1..{TYPE_ID_MAX}, got {type_id!r}")
        if not isinstance(cls, type):
            raise TypeError(f"can only register classes, got {cls!r}")
        taken = self._by_id.get(type_id)
        if taken is not None and taken.cls is cls:
            return
        if taken is not None:
            raise TypeError(f"type id {type_id} is already {taken.cls.__name__}")
        if cls in self._by_class:
            other = self._by_class[cls].type_id
            raise TypeError(f"{cls.__name__} is already registered as type id {other}")
        referenced = dict(self._referenced)
        try:
            spec = self._compile(type_id, cls)
        except TypeError:
            self._referenced = referenced  # a rejected class leaves no references behind
            raise
        self._by_id[type_id] = spec
        self._by_class[cls] = spec

    def register_many(self, mapping: Mapping[int, type]) -> None:
        """Register every ``type_id: cls`` pair, in ascending id order."""
        for type_id in sorted(mapping):
            self.register(type_id, mapping[type_id])

    def message(self, type_id: int) -> Callable[[type[T]], type[T]]:
        """Class decorator form of `register`: ``@registry.message(101)``."""

        def decorate(cls: type[T]) -> type[T]:
            self.register(type_id, cls)
            return cls

        return decorate

    def type_id(self, cls: type) -> int:
        """The id `cls` is registered under. Raises `KeyError` if it is not registered."""
        return self._by_class[cls].type_id

    def classes(self) -> dict[int, type]:
        """A copy of the table, ``type_id -> class``, in ascending id order."""
        return {tid: self._by_id[tid].cls for tid in sorted(self._by_id)}

    def unregistered(self) -> tuple[str, ...]:
        """Dataclasses that registered fields refer to but that are not registered yet,
        as ``"Class (used by Owner.field)"``, sorted. Empty once the schema is complete."""
        missing = [
            f"{cls.__name__} (used by {where})"
            for cls, where in self._referenced.items()
            if cls not in self._by_class
        ]
        return tuple(sorted(missing))

    def __contains__(self, cls: object) -> bool:
        return cls in self._by_class

    # ----------------------------------------------------------------------------------
    # Encoding and decoding

    def encode(self, obj: object) -> bytes:
        """The canonical bytes of a registered message (see the module docstring).

        Raises:
            EncodeError: the class is not registered, a field value does not fit its
                declared type, or the frame exceeds `max_size` or `max_depth`.
        """
        spec = self._by_class.get(type(obj))
        if spec is None:
            raise EncodeError(f"{type_name(obj)} is not a registered message class")
        try:
            data = _pack(spec.encode(obj, 0))
        except (ValueError, TypeError, OverflowError) as exc:  # pragma: no cover - defensive
            raise EncodeError(f"{type_name(obj)}: msgpack refused the value: {exc}") from exc
        if len(data) > self.max_size:
            raise EncodeError(
                f"{type_name(obj)} encodes to {len(data)} bytes, over max_size={self.max_size}"
            )
        return data

    def encoder(self) -> Callable[[object], bytes]:
        """A function equal to `encode` (same bytes, same errors), for a hot path.

        It skips `encode`'s per-call lookups. Classes registered later are encoded too.
        Anything unusual (an unregistered class, a value the engine refuses, an oversize
        frame) goes to `encode`, which raises its error.
        """
        by_class = self._by_class
        max_size = self.max_size
        slow = self.encode

        def encode(obj: object) -> bytes:
            spec = by_class.get(type(obj))
            if spec is not None:
                try:
                    data: bytes = pack(spec.encode(obj, 0))
                except (ValueError, TypeError, OverflowError):
                    return slow(obj)  # raises EncodeError
                if len(data) <= max_size:
                    return data
            return slow(obj)

        return encode

    def decoder(self, expected: type | None = None) -> Callable[[bytes], object]:
        """A function equal to ``decode(data, expected=expected)`` for `bytes` frames (same
        result, same errors), with the decoder for `expected` looked up once. Anything
        that is not `bytes` or not a frame goes to `decode`, which raises its error."""
        root = object if expected is None else expected
        if not isinstance(root, type):
            raise TypeError(f"expected must be a class, got {root!r}")
        top = self._expected.get(root)
        if top is None:
            top = self._expected[root] = self._polymorphic((root,), root.__name__)[1]
        max_size = self.max_size
        slow = self.decode

        def decode(data: bytes) -> object:
            if type(data) is bytes and len(data) <= max_size:
                try:
                    raw = unpack(data)
                except Exception:  # malformed: `decode` says how
                    return slow(data, expected=expected)
                return top(raw, 0)
            return slow(data, expected=expected)

        return decode

    def canonical_bytes(self, obj: object, *, omit: tuple[str, ...] = ()) -> bytes:
        """The bytes to sign or hash for `obj`: `encode(obj)` with the top-level fields named
        in `omit` left out (a signature does not cover itself).

        Equal objects give equal bytes. With `omit`, the result is ``[type_id, ...]`` with
        fewer fields than the class has, so it is never a valid frame of any message.

        Raises:
            EncodeError: as `encode`, or a name in `omit` is not a field of the class.
        """
        if not omit:
            return self.encode(obj)
        spec = self._by_class.get(type(obj))
        if spec is None:
            raise EncodeError(f"{type_name(obj)} is not a registered message class")
        unknown = [name for name in omit if name not in spec.names]
        if unknown:
            raise EncodeError(f"{spec.cls.__name__} has no field(s) {unknown}")
        full = typing.cast(list[object], spec.encode(obj, 0))
        kept = [full[0]] + [  # (optional trailing fields at their default are absent)
            value for name, value in zip(spec.names, full[1:]) if name not in omit  # noqa: B905
        ]
        return _pack(kept)

    @overload
    def decode(
        self, data: bytes | bytearray | memoryview, *, expected: type[T], canonical: bool = False
    ) -> T: ...

    @overload
    def decode(
        self,
        data: bytes | bytearray | memoryview,
        *,
        expected: None = None,
        canonical: bool = False,
    ) -> object: ...

    def decode(
        self,
        data: bytes | bytearray | memoryview,
        *,
        expected: type[T] | None = None,
        canonical: bool = False,
    ) -> T | object:
        """Decode one frame into a registered message, checking everything.

        Args:
            data: exactly one encoded message; trailing bytes are an error.
            expected: a class (registered, or a base such as `Message`) the result must be
                an instance of.
            canonical: also require that `data` is the canonical encoding of the result
                (rejects re-ordered frozensets and over-long msgpack forms, so one message
                has exactly one accepted encoding). Costs one re-encode.

        Raises:
            DecodeError: on any input that is not a valid frame; never anything else.
            TypeError: `data` is not bytes-like (our own misuse).
        """
        if type(data) is bytes:  # the common case first
            size = len(data)
        elif not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"decode takes bytes, got {type_name(data)}")
        else:
            size = data.nbytes if isinstance(data, memoryview) else len(data)
        if size > self.max_size:
            raise DecodeError(f"frame of {size} bytes exceeds max_size={self.max_size}")
        try:
            raw = unpack(data)
        except Exception as exc:  # a msgspec.DecodeError, or a RecursionError: "malformed"
            raise DecodeError(f"malformed msgpack: {type(exc).__name__}: {exc}") from None
        root = object if expected is None else expected
        decoder = self._expected.get(root)
        if decoder is None:
            if not isinstance(root, type):
                raise TypeError(f"expected must be a class, got {root!r}")
            decoder = self._expected[root] = self._polymorphic((root,), root.__name__)[1]
        obj = decoder(raw, 0)
        if canonical:
            try:
                again = self.encode(obj)
            except EncodeError as exc:
                raise DecodeError(f"not canonically re-encodable: {exc}") from None
            if again != data:
                raise DecodeError(f"non-canonical encoding of {type_name(obj)}")
        return obj

    # ----------------------------------------------------------------------------------
    # Compilation: one encoder/decoder pair per field type, built once at registration.

    def _compile(self, type_id: int, cls: type) -> Spec:
        name = cls.__name__
        if not dataclasses.is_dataclass(cls):
            raise TypeError(f"{name} is not a dataclass")
        params = cls.__dataclass_params__  # type: ignore[attr-defined]
        if not params.frozen:
            raise TypeError(f"{name} must be a frozen dataclass (messages are immutable)")
        if not params.eq:
            raise TypeError(f"{name} must compare by value (eq=True): canonical bytes need it")
        try:
            hints = typing.get_type_hints(cls, localns={cls.__name__: cls})
        except Exception as exc:
            raise TypeError(f"cannot resolve the type hints of {name}: {exc}") from exc
        for attr, hint in hints.items():
            if isinstance(hint, dataclasses.InitVar):
                raise TypeError(f"{name}.{attr}: InitVar fields cannot be decoded")
        pairs: list[tuple[str, Encoder, Decoder]] = []
        for field in dataclasses.fields(cls):
            where = f"{name}.{field.name}"
            if not field.init:
                raise TypeError(f"{where}: init=False fields cannot be decoded")
            if not field.compare:
                raise TypeError(f"{where}: compare=False breaks 'equal objects, equal bytes'")
            enc, dec = self._build(hints[field.name], where)
            pairs.append((field.name, enc, dec))
        return build_spec(type_id, cls, tuple(pairs), max_depth=self.max_depth,
                          fast_spec=self._fast_spec)

    def _fast_spec(self, type_id: int) -> Spec:
        """`type_id`'s spec with its fast paths, compiled at first use (a process pays only for
        the classes it uses) and put in place of the uncompiled one. They are exact
        shortcuts of the generic paths, so when they are compiled changes no result or
        error; two threads compiling at once make the same code."""
        spec = self._by_id[type_id]
        if spec.compile_fast is None:
            return spec
        fast_encode, fast_decode = spec.compile_fast()
        done = dataclasses.replace(spec, encode=fast_encode, decode=fast_decode,
                                   compile_fast=None)
        self._by_id[type_id] = done
        self._by_class[spec.cls] = done
        return done

    def _build(self, tp: object, where: str) -> tuple[Encoder, Decoder]:
        """Compile the codec pair for one declared type, or raise TypeError naming `where`."""
        if tp is None:
            tp = type(None)
        if tp in SCALARS:
            return SCALARS[tp]
        if isinstance(tp, typing.NewType):
            return self._build(tp.__supertype__, where)
        origin = typing.get_origin(tp)
        args = typing.get_args(tp)
        if origin is tuple:
            if len(args) == 2 and args[1] is Ellipsis:
                return array_codec(None, self._build(args[0], f"{where}[]"), self.max_depth)
            if args == ((),):  # tuple[()]
                args = ()
            parts = tuple(self._build(a, f"{where}[{i}]") for i, a in enumerate(args))
            return array_codec(parts, SCALARS[type(None)], self.max_depth)
        if origin is frozenset:
            return frozenset_codec(self._build(args[0], f"{where}[]"), self.max_depth)
        if origin is typing.Union or origin is types.UnionType:
            return self._union(args, where)
        if isinstance(tp, type) and tp is not typing.Any:
            if issubclass(tp, enum.Enum):
                return enum_codec(tp, where)
            if dataclasses.is_dataclass(tp):
                if not tp.__dataclass_params__.frozen:  # type: ignore[attr-defined]
                    raise TypeError(f"{where}: {tp.__name__} must be a frozen dataclass")
                self._referenced.setdefault(tp, where)
                return self._polymorphic((tp,), tp.__name__)
            if tp.__module__ != "builtins":
                # A plain class is a base: "any registered subclass" (e.g. `Message`).
                return self._polymorphic((tp,), f"registered {tp.__name__}")
        raise TypeError(f"{where}: unsupported field type {tp!r} (see phalanx.net.codec)")

    def _union(self, args: tuple[object, ...], where: str) -> tuple[Encoder, Decoder]:
        members = [a for a in args if a is not type(None)]
        optional = len(members) < len(args)
        if len(members) == 1:
            inner = self._build(members[0], where)
        else:
            allowed: list[type] = []
            for member in members:
                ok = isinstance(member, type) and not issubclass(member, enum.Enum)
                if not ok or typing.cast(type, member).__module__ == "builtins":
                    raise TypeError(
                        f"{where}: unions may only join dataclasses or message bases "
                        f"(and None), got {member!r}"
                    )
                self._build(member, where)  # validates and records the member
                allowed.append(typing.cast(type, member))
            label = " | ".join(t.__name__ for t in allowed)
            inner = self._polymorphic(tuple(allowed), label)
        return optional_codec(inner) if optional else inner

    def _polymorphic(self, allowed: tuple[type, ...], label: str) -> tuple[Encoder, Decoder]:
        return polymorphic(self._by_id, self._by_class, allowed, label)
