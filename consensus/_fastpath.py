"""Cheaper constructors for the records built once or more per message (private).

`consensus/types.py` and `consensus/core.py` declare plain frozen, slotted, keyword-only
dataclasses. Building one through its generated ``__init__`` goes through
`object.__setattr__` for every field (about twice the cost of a slot store) and matches
keywords; on the hot paths (a core's step, the simulator's delivery, the replica's apply,
the history recorder) that is a visible share of the cost. This module owns the three ways
to build them cheaper, and applies the first to the contract's hot records:

- `raw_init(cls)`: replace ``cls.__init__`` with one of the same keyword-only signature and
  defaults that fills the slots through their raw setters, then calls ``__post_init__``.
  Applied here, once at import, to `HOT_RECORDS` (the package's ``__init__`` imports this
  module, so every user of `phalanx.consensus` sees the cheaper ``__init__``); other
  packages decorate their own hot records with it (Raft's messages, the replica layer's
  envelopes, `jepsen.history.Op`).
- `slot_twin(cls)`: a mutable class with `cls`'s exact slot layout: instantiate it, store
  each field, assign ``__class__ = cls``.
- `maker(cls)`: a positional builder through the twin; `new_send`, `new_receive`,
  `new_persisted` and `make_ready` (through `READY_TWIN`) are the contract's.

Invariants: every builder returns the same object the dataclass constructor would (same
class, fields, equality, hash, repr; frozen); validation (``__post_init__``) runs unchanged;
a class a builder cannot serve exactly raises `TypeError` at import time, never later. The
codec's fast decoder (`phalanx.net.codec_fast`) recognises `raw_init`'s ``__init__`` by its
``__raw_init__`` attribute. Pure: no I/O, clocks or randomness.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable
from typing import Any, TypeVar

from phalanx.consensus.core import (
    Persisted,
    ReadState,
    Ready,
    Receive,
    Rejection,
    Send,
    Snapshot,
    Submit,
)
from phalanx.consensus.types import ClientRequest, Entry, HardState, Message, NodeId

_C = TypeVar("_C", bound=type)
_T = TypeVar("_T")


def raw_init(cls: _C) -> _C:
    """Give a frozen, slotted, keyword-only dataclass an ``__init__`` that fills its slots
    through their raw setters, then calls ``__post_init__`` if it has one.

    The generated frozen ``__init__`` goes through `object.__setattr__` for every field,
    which costs about twice as much; records built once or more per message use this. The
    signature (keyword-only, the same defaults), the validation, equality, hashing, repr and
    `dataclasses.fields/replace` are unchanged, and so is the resulting object. The new
    function carries ``__raw_init__ = True`` (the codec's fast decoder builds such classes
    the same way). Misuse (not such a dataclass, an `InitVar`, a default factory) raises
    `TypeError` at import time.
    """
    fields = dataclasses.fields(cls)
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"raw_init needs a frozen slotted dataclass, got {cls.__name__}")
    if len(cls.__dict__["__dataclass_fields__"]) != len(fields):
        raise TypeError(f"raw_init: {cls.__name__} has InitVar or ClassVar pseudo-fields")
    env: dict[str, object] = {}
    args: list[str] = []
    body: list[str] = []
    for i, f in enumerate(fields):
        slot = cls.__dict__.get(f.name)
        if not f.init or not f.kw_only or not isinstance(slot, types.MemberDescriptorType):
            raise TypeError(f"raw_init: {cls.__name__}.{f.name} is not a keyword-only slot")
        if f.default_factory is not dataclasses.MISSING:
            raise TypeError(f"raw_init: {cls.__name__}.{f.name} has a default factory")
        if f.default is dataclasses.MISSING:
            args.append(f.name)
        else:
            env[f"D{i}"] = f.default
            args.append(f"{f.name}=D{i}")
        env[f"S{i}"] = slot.__set__
        body.append(f"S{i}(self, {f.name})")
    post_init = getattr(cls, "__post_init__", None)
    if post_init is not None:
        env["POST"] = post_init
        body.append("POST(self)")
    source = f"def __init__(self, *, {', '.join(args)}):\n    " + "\n    ".join(body or ["pass"])
    namespace: dict[str, object] = {}
    exec(compile(source, f"<raw_init {cls.__qualname__}>", "exec"), env, namespace)
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"  # type: ignore[attr-defined]
    init.__raw_init__ = True  # type: ignore[attr-defined]
    cls.__init__ = init  # type: ignore[misc]
    return cls


HOT_RECORDS: tuple[type, ...] = (
    ClientRequest, Entry, HardState,  # consensus/types.py
    Receive, Submit, Persisted, Send, ReadState, Rejection, Ready,  # consensus/core.py
)
"""The contract's records built once or more per message: `raw_init` is applied to each,
once, when this module is imported."""

for _cls in HOT_RECORDS:
    raw_init(_cls)


_TWINS: dict[type, type] = {}
_MAKERS: dict[type, Callable[..., Any]] = {}


def slot_twin(cls: type) -> type:
    """A mutable class with exactly the slot layout of the frozen, slotted dataclass `cls`.

    The cheapest way CPython offers to build a frozen slotted record: instantiate the twin
    (no ``__init__``), store each field with a plain attribute store (the interpreter
    specialises a store into a slot of a class with the default ``__setattr__``; the frozen
    class's ``__setattr__`` forbids it), then assign ``obj.__class__ = cls``. The object is
    then an ordinary instance of `cls`, indistinguishable from one its ``__init__`` built;
    CPython checks at every assignment that the two layouts are compatible (same base, same
    slots), so a mismatch raises `TypeError` instead of corrupting anything. The twin shares
    `cls`'s first base (which must keep the default ``__new__``, ``__init__`` and
    ``__setattr__``), so it never runs `cls`'s validation itself: a builder calls
    ``__post_init__`` after the swap (`maker` does). Checked once here: `TypeError` for a
    class that is not such a dataclass.
    """
    twin = _TWINS.get(cls)
    if twin is not None:
        return twin
    params = getattr(cls, "__dataclass_params__", None)
    slots = cls.__dict__.get("__slots__")
    base = cls.__base__
    custom = "__new__" in vars(cls) or any(
        name in vars(k)
        for k in cls.__mro__[1:-1]
        for name in ("__new__", "__init__", "__setattr__"))
    if (params is None or not params.frozen or not isinstance(slots, tuple) or base is None
            or custom):
        raise TypeError(f"slot_twin needs a frozen slotted dataclass, got {cls.__name__}")
    if tuple(f.name for f in dataclasses.fields(cls)) != slots:
        raise TypeError(f"slot_twin: {cls.__name__}'s slots are not exactly its fields")
    twin = type(f"_{cls.__name__}Twin", (base,), {"__slots__": slots})
    probe = twin()
    probe.__class__ = cls  # raises TypeError now if the layouts are not compatible
    _TWINS[cls] = twin
    return twin


def maker(cls: type[_T]) -> Callable[..., _T]:
    """A function ``make(field0, field1, ...)`` (positional, every field in declaration
    order, no defaults) that returns the same object as ``cls(field0=..., ...)``, through
    `slot_twin`, then ``__post_init__`` when `cls` has one (so validation is unchanged).

    About three times cheaper than calling the class with keywords (no keyword dictionary,
    no setter calls): for records built once or more per message on a hot path. Cached per
    class. `TypeError` for a class `slot_twin` refuses.
    """
    make = _MAKERS.get(cls)
    if make is not None:
        return make
    twin = slot_twin(cls)
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    env: dict[str, object] = {"TWIN": twin, "CLS": cls}
    body = ["obj = TWIN()", *(f"obj.{name} = {name}" for name in names), "obj.__class__ = CLS"]
    post_init = getattr(cls, "__post_init__", None)
    if post_init is not None:
        env["POST"] = post_init
        body.append("POST(obj)")
    body.append("return obj")
    source = f"def make({', '.join(names)}):\n    " + "\n    ".join(body)
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<maker {cls.__qualname__}>", "exec"), env, namespace)
    make = namespace["make"]
    _MAKERS[cls] = make
    return make  # type: ignore[no-any-return]


# --------------------------------------------------------------------------------------------
# The contract's positional builders


new_send: Callable[[NodeId, Message], Send] = maker(Send)
"""``Send(to=..., message=...)`` from positional arguments, cheaper (`maker`)."""
new_receive: Callable[[NodeId, Message], Receive] = maker(Receive)
"""``Receive(src=..., message=...)`` from positional arguments, cheaper (`maker`)."""
new_persisted: Callable[[int], Persisted] = maker(Persisted)
"""``Persisted(number=...)`` from a positional argument, cheaper (`maker`)."""

READY_TWIN: type = slot_twin(Ready)
"""`Ready`'s layout twin, through which `make_ready` builds: instantiate it, store all
twelve fields, then assign ``__class__ = Ready``."""


def make_ready(
    number: int,
    early_messages: tuple[Send, ...],
    snapshot: Snapshot | None,
    truncate_from: int | None,
    entries: tuple[Entry, ...],
    hard_state: HardState | None,
    must_sync: bool,
    messages: tuple[Send, ...],
    committed: tuple[Entry, ...],
    reads: tuple[ReadState, ...],
    rejected: tuple[Rejection, ...],
    /,
) -> Ready:
    """``Ready(number=..., ..., rejected=...)`` (no `core_state`, no `aborted`) for a core's
    hot path: the same object, built from positional arguments (no keyword matching)
    through `READY_TWIN`."""
    ready = READY_TWIN()
    ready.number = number
    ready.early_messages = early_messages
    ready.snapshot = snapshot
    ready.truncate_from = truncate_from
    ready.entries = entries
    ready.hard_state = hard_state
    ready.must_sync = must_sync
    ready.messages = messages
    ready.committed = committed
    ready.reads = reads
    ready.rejected = rejected
    ready.core_state = None
    ready.aborted = ()
    ready.__class__ = Ready
    return ready  # type: ignore[no-any-return]
