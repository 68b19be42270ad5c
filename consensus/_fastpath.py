"""Cheaper constructors for the records built once or more per message (private).

`consensus/types.py` and `consensus/core.py` declare plain frozen, slotted, keyword-only
dataclasses. Building one through its generated ``__init__`` goes through
`object.__setattr__` for every field (about twice the cost of a slot store) and matches
keywords; on the hot paths (a core's step, the simulator's delivery, the replica's apply,
the history recorder) that is a visible share of the cost. This module gathers the three ways
to build them cheaper:

- `raw_init(cls)` (`phalanx.consensus._raw_init`, re-exported here): replace ``cls.__init__``
  with one of the same keyword-only signature and defaults that fills the slots through
  their raw setters, then calls ``__post_init__``. The contract's hot records (`HOT_RECORDS`)
  get it where they are declared, once at import (`TYPES_HOT_RECORDS` at the end of
  `consensus/types.py`, `CORE_HOT_RECORDS` of `consensus/core.py`), so every user sees the
  cheaper ``__init__`` and a client that only needs `ClientRequest` loads no core; other
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
from collections.abc import Callable
from typing import Any, TypeVar

from phalanx.consensus._raw_init import raw_init
from phalanx.consensus.core import (
    CORE_HOT_RECORDS,
    Persisted,
    ReadState,
    Ready,
    Receive,
    Rejection,
    Send,
    Snapshot,
)
from phalanx.consensus.types import TYPES_HOT_RECORDS, Entry, HardState, Message, NodeId

_T = TypeVar("_T")

__all__ = ["HOT_RECORDS", "READY_TWIN", "make_ready", "maker", "new_persisted", "new_receive",
           "new_send", "raw_init", "slot_twin"]


HOT_RECORDS: tuple[type, ...] = (*TYPES_HOT_RECORDS, *CORE_HOT_RECORDS)
"""The contract's records built once or more per message: `raw_init` is applied to each,
once, by the module that declares it (`phalanx.consensus.types`, `phalanx.consensus.core`),
so every user sees the cheaper ``__init__`` whichever module it imports first."""


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
