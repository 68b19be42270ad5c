"""Sequential specifications ("models") that the linearizability checker searches against.

Owns:
    The `Model` protocol and the `RegisterModel` (read / write / compare-and-set on one
    register whose initial value is absent, written ``null``). Later workloads (bank, set)
    add their models here or beside it and register them in `MODELS`.

A model works in two phases:

    1. `prepare(pair)` turns one client operation (invoke + completion) into the model's
       own compact *call* (or `None` when the operation constrains nothing, e.g. a read
       whose result is unknown). It validates the operation's values and raises
       `HistoryError` for malformed input: histories are untrusted input.
    2. `step(state, call)` is the pure sequential specification: ``(legal, next_state)``.

Invariants:
    * `step` is pure and deterministic; states are hashable and two states compare equal
      exactly when the model cannot tell them apart (the checker memoises on them).
    * Register values are JSON scalars or null. Values are compared by JSON type *and*
      value (``1``, ``1.0`` and ``true`` are three different values), which is why the
      register's state is a tagged pair rather than the raw Python value.

Must not import: the checker, the simulator, consensus cores or anything doing I/O.
"""

from __future__ import annotations

from typing import Final, Protocol, TypeAlias, TypeVar

from phalanx.jepsen.history import FAIL, INFO, HistoryError, OpPair, Value

S = TypeVar("S")
C = TypeVar("C")


class Model(Protocol[S, C]):
    """A sequential specification over states `S`, checking prepared calls `C`."""

    @property
    def name(self) -> str:
        """The workload name (``register``)."""
        ...

    def initial(self) -> S:
        """The state before any operation."""
        ...

    def prepare(self, pair: OpPair) -> C | None:
        """The call for one operation, or None if it constrains nothing.

        Called only for operations that may have happened (not ``fail``). Raises
        `HistoryError` for a malformed operation (unknown ``f``, bad value shape).
        """
        ...

    def step(self, state: S, call: C) -> tuple[bool, S]:
        """Apply `call` to `state`: (legal, next state). Pure."""
        ...

    def describe_state(self, state: S) -> Value:
        """The state as a JSON value, for counterexamples."""
        ...


# --- register --------------------------------------------------------------------------------

#: A register value tagged with its JSON type, so True, 1 and 1.0 stay distinct when compared
#: and hashed. Tag order: null, boolean, integer, number, string.
Tagged: TypeAlias = tuple[int, bool | int | float | str | None]

_NULL: Final[Tagged] = (0, None)

READ: Final = 0
WRITE: Final = 1
CAS: Final = 2

#: A prepared register call: (kind, a, b). read: (READ, observed, _); write: (WRITE, new, _);
#: cas: (CAS, expected, new).
RegisterCall: TypeAlias = tuple[int, Tagged, Tagged]


def tag(value: Value, *, what: str = "value") -> Tagged:
    """Tag a JSON scalar; raises `HistoryError` for arrays and objects."""
    if value is None:
        return _NULL
    if isinstance(value, bool):
        return (1, value)
    if isinstance(value, int):
        return (2, value)
    if isinstance(value, float):
        return (3, value)
    if isinstance(value, str):
        return (4, value)
    raise HistoryError(f"register {what} must be a JSON scalar or null, got {value!r}")


class RegisterModel:
    """A read/write/compare-and-set register; absent (null) until first written.

    Ref: Herlihy & Wing 1990 §3 (registers); Jepsen/Knossos ``cas-register``.

    Operations (``f``, invoke value, ok completion value):
        * ``read``: invoke null, completes with the value read (null if absent).
        * ``write``: value v; the register becomes v.
        * ``cas``: value ``[expected, new]``; succeeds (``ok``) only if the register holds
          `expected`, where expected null means "absent"; then it holds `new`. A cas whose
          comparison fails must complete ``fail`` (it did not happen).
    ``info`` / pending writes and cas may or may not have happened; reads with an unknown
    result are dropped.
    """

    __slots__ = ()

    @property
    def name(self) -> str:
        return "register"

    def initial(self) -> Tagged:
        return _NULL

    def prepare(self, pair: OpPair) -> RegisterCall | None:
        inv, done = pair.invoke, pair.completion
        if done is not None and done.type == FAIL:
            raise ValueError("prepare() is not called for failed operations")
        indeterminate = done is None or done.type == INFO
        where = f"op #{inv.index} ({inv.f})"
        if inv.f == "read":
            if indeterminate or done is None:
                return None
            return (READ, tag(done.value, what=f"value read by {where}"), _NULL)
        if inv.f == "write":
            return (WRITE, tag(inv.value, what=f"value written by {where}"), _NULL)
        if inv.f == "cas":
            v = inv.value
            if not (isinstance(v, tuple) and len(v) == 2):
                raise HistoryError(f"{where}: cas value must be [expected, new], got {v!r}")
            return (CAS, tag(v[0], what=f"expected of {where}"), tag(v[1], what=f"new of {where}"))
        raise HistoryError(f"{where}: the register workload has no operation {inv.f!r}")

    def step(self, state: Tagged, call: RegisterCall) -> tuple[bool, Tagged]:
        kind, a, b = call
        if kind == READ:
            return state == a, state
        if kind == WRITE:
            return True, a
        if state == a:
            return True, b
        return False, state

    def describe_state(self, state: Tagged) -> Value:
        return state[1]


#: Workload name -> model factory; the CLI's ``--workload`` choices.
MODELS: Final = {"register": RegisterModel}
