"""Operation histories: the `Op` record, invoke/completion pairing, JSON Lines I/O and a recorder.

Owns:
    The on-disk history format shared by the simulator, the real-cluster harness and every
    checker: JSON Lines, one event per line, Jepsen's op model unchanged::

        {"index": 0, "time": 1500, "process": 3, "type": "invoke", "f": "cas", "key": "k1",
         "value": [null, 7]}

    `index` counts from 0 in file order; `time` is integer nanoseconds (virtual in the
    simulator) and never decreases down the file; `process` is an int or a string;
    `type` is ``invoke | ok | fail | info``; `f` names the operation; `key` (optional, a
    JSON scalar) names the independent object; `value` is any JSON value (arrays become
    tuples, objects become `immutables.Map`); `error` and `node` are optional.

Semantics:
    * ``ok``: the operation happened, with the completion's value as its result.
    * ``fail``: the operation certainly did not happen.
    * ``info``, or an invoke with no completion: it may or may not have happened, at any
      point after its invocation. A process that completes with ``info`` never invokes
      again (Jepsen's rule; clients continue under a fresh process id).
    * Each client process has at most one outstanding operation, and its completion names
      the same ``f`` and ``key`` as its invoke.
    * Events of process ``"nemesis"`` (fault injection) are not paired; checkers of client
      workloads ignore them.
    * File order is the real-time order: an operation precedes another iff its completion
      appears on an earlier line than the other's invoke. ``time`` agrees with that order
      (it never decreases) and is kept for humans, plots and latency figures.

Invariants (checked by `History`, violations raise `HistoryError` naming the line):
    indexes strictly increase, times never decrease, pairing per process as above.

Must not import: the simulator, consensus cores (only `phalanx.consensus._fastpath.raw_init` and
`maker`, dataclass helpers), trio, or anything doing I/O besides reading and writing the
history file itself. Never pickle.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal, TypeAlias, cast

import immutables

from phalanx.consensus._fastpath import maker, raw_init

#: A JSON value as held by an `Op`: immutable, hashable.
Value: TypeAlias = (
    "bool | int | float | str | tuple[Value, ...] | immutables.Map[str, Value] | None"
)
#: A key names one independent object (P-compositionality splits histories by key).
Key: TypeAlias = bool | int | float | str | None
Process: TypeAlias = int | str
OpType: TypeAlias = Literal["invoke", "ok", "fail", "info"]

INVOKE: Final = "invoke"
OK: Final = "ok"
FAIL: Final = "fail"
INFO: Final = "info"
OP_TYPES: Final[tuple[OpType, ...]] = (INVOKE, OK, FAIL, INFO)
COMPLETION_TYPES: Final[tuple[OpType, ...]] = (OK, FAIL, INFO)

#: The process id of fault-injection events; exempt from pairing, ignored by client checkers.
NEMESIS: Final = "nemesis"

_FIELDS: Final = ("index", "time", "process", "type", "f", "key", "value", "error", "node")


class HistoryError(ValueError):
    """A history is malformed. The message names the line (1-based) and field when known."""

    def __init__(self, message: str, *, line: int | None = None) -> None:
        self.line = line
        super().__init__(f"line {line}: {message}" if line is not None else message)


@raw_init
@dataclass(frozen=True, slots=True, kw_only=True)
class Op:
    """One history event (Jepsen op). Ref: Kingsbury, jepsen.history; Herlihy & Wing 1990 §2.

    Attributes:
        index: position in the history, from 0, strictly increasing down the file.
        time: nanoseconds (virtual in the simulator); never decreases down the file.
        process: the logical client (int) or ``"nemesis"``.
        type: ``invoke``, ``ok``, ``fail`` or ``info``.
        f: the operation's name (``read``, ``write``, ``cas`` for the register workload).
        key: the independent object operated on, or None.
        value: the argument (invoke) or result (completion).
        error: why an op failed or is indeterminate, if the client said.
        node: which server the client talked to, if known.
    """

    index: int
    time: int
    process: Process
    type: OpType
    f: str
    key: Key = None
    value: Value = None
    error: Value = None
    node: int | str | None = None

    def __post_init__(self) -> None:
        # Fast path: exact ints and strings and plain scalar values (what recorders write)
        # pass every check below and need no normalising; anything else takes the checks.
        if (
            type(self.index) is int and self.index >= 0 and type(self.time) is int
            and type(self.process) in _INT_OR_STR and self.type in OP_TYPES
            and type(self.f) is str and self.f
            and type(self.key) in _PLAIN_SCALARS and type(self.value) in _PLAIN_SCALARS
            and type(self.error) in _PLAIN_SCALARS
            and (self.node is None or type(self.node) in _INT_OR_STR)
        ):
            return
        if not _is_int(self.index) or self.index < 0:
            raise HistoryError(f"field 'index' must be a non-negative integer, got {self.index!r}")
        if not _is_int(self.time):
            raise HistoryError(f"field 'time' must be an integer (ns), got {self.time!r}")
        if not (_is_int(self.process) or isinstance(self.process, str)):
            raise HistoryError(f"field 'process' must be an int or a string, got {self.process!r}")
        if self.type not in OP_TYPES:
            raise HistoryError(f"field 'type' must be one of {OP_TYPES}, got {self.type!r}")
        if not isinstance(self.f, str) or not self.f:
            raise HistoryError(f"field 'f' must be a non-empty string, got {self.f!r}")
        if not _is_scalar(self.key):
            raise HistoryError(f"field 'key' must be a JSON scalar, got {self.key!r}")
        if self.node is not None and not (_is_int(self.node) or isinstance(self.node, str)):
            raise HistoryError(f"field 'node' must be an int or a string, got {self.node!r}")
        # Normalise to immutable, hashable JSON (lists -> tuples, dicts -> Map) and reject
        # what JSON cannot hold; cheap for the scalars registers use.
        if not _is_scalar(self.value):
            object.__setattr__(self, "value", value_from_json(self.value))
        if not _is_scalar(self.error):
            object.__setattr__(self, "error", value_from_json(self.error, where="error"))

    def __str__(self) -> str:
        key = "" if self.key is None else f" key={self.key!r}"
        return (
            f"#{self.index} t={self.time} p={self.process} {self.type} {self.f}{key} {self.value!r}"
        )

    def to_json(self) -> dict[str, object]:
        """The op as a JSON object (optional fields omitted when None)."""
        out: dict[str, object] = {
            "index": self.index,
            "time": self.time,
            "process": self.process,
            "type": self.type,
            "f": self.f,
        }
        if self.key is not None:
            out["key"] = self.key
        out["value"] = value_to_json(self.value)
        if self.error is not None:
            out["error"] = value_to_json(self.error)
        if self.node is not None:
            out["node"] = self.node
        return out


_new_op: Callable[
    [int, int, Process, OpType, str, Key, Value, Value, int | str | None], Op] = maker(Op)
"""``Op(index, time, process, type, f, key, value, error, node)`` by position (`maker`)."""


@raw_init
@dataclass(frozen=True, slots=True, kw_only=True)
class OpPair:
    """A client operation: its invoke and its completion (None while pending forever).

    `outcome` is the completion's type, or ``info`` when there is no completion.
    """

    invoke: Op
    completion: Op | None

    @property
    def outcome(self) -> OpType:
        return INFO if self.completion is None else self.completion.type

    @property
    def indeterminate(self) -> bool:
        """True if the operation may or may not have taken effect."""
        return self.outcome == INFO


@dataclass(frozen=True, slots=True)
class History:
    """A validated history: ops in file order plus their invoke/completion pairing.

    Construct with `History.of(ops)`; `read_history` / `parse_history` also record the source
    line of every op so later errors (e.g. a checker rejecting a value) can name it.
    """

    ops: tuple[Op, ...]
    pairs: tuple[OpPair, ...]
    nemesis: tuple[Op, ...]
    lines: tuple[int, ...] = field(default=())

    @classmethod
    def of(cls, ops: Iterable[Op], *, lines: Sequence[int] | None = None) -> History:
        """Validate order and pairing; raises `HistoryError` naming the offending line.

        `lines[i]` is the 1-based source line of ``ops[i]``; default ``i + 1``.
        """
        ops = tuple(ops)
        line_of = tuple(lines) if lines is not None else tuple(range(1, len(ops) + 1))
        if len(line_of) != len(ops):
            raise ValueError("lines must give one line number per op")
        pairs: list[OpPair | None] = []
        open_: dict[Process, tuple[int, Op]] = {}  # process -> (slot in pairs, invoke)
        retired: dict[Process, int] = {}  # process -> line of its info completion
        nemesis: list[Op] = []
        for i, op in enumerate(ops):
            line = line_of[i]
            if i and op.index <= ops[i - 1].index:
                raise HistoryError(
                    f"field 'index' must increase ({op.index} after {ops[i - 1].index})", line=line
                )
            if i and op.time < ops[i - 1].time:
                raise HistoryError(
                    f"field 'time' went backwards ({op.time} after {ops[i - 1].time})", line=line
                )
            if op.process == NEMESIS:
                nemesis.append(op)
                continue
            if op.type == INVOKE:
                if op.process in open_:
                    prev = open_[op.process][1]
                    raise HistoryError(
                        f"process {op.process!r} invokes while op #{prev.index} is outstanding",
                        line=line,
                    )
                if op.process in retired:
                    raise HistoryError(
                        f"process {op.process!r} invokes again after its indeterminate (info) "
                        f"completion on line {retired[op.process]}; use a fresh process id",
                        line=line,
                    )
                open_[op.process] = (len(pairs), op)
                pairs.append(None)
                continue
            if op.process not in open_:
                raise HistoryError(
                    f"{op.type} completion for process {op.process!r}, which has no "
                    "outstanding invoke",
                    line=line,
                )
            slot, inv = open_.pop(op.process)
            if op.f != inv.f:
                raise HistoryError(
                    f"field 'f' of completion is {op.f!r} but op #{inv.index} invoked {inv.f!r}",
                    line=line,
                )
            if op.key != inv.key:
                raise HistoryError(
                    f"field 'key' of completion is {op.key!r} but op #{inv.index} invoked "
                    f"key {inv.key!r}",
                    line=line,
                )
            if op.type == INFO:
                retired[op.process] = line
            pairs[slot] = OpPair(invoke=inv, completion=op)
        for slot, inv in open_.values():
            pairs[slot] = OpPair(invoke=inv, completion=None)
        done = tuple(p for p in pairs if p is not None)
        return cls(ops=ops, pairs=done, nemesis=tuple(nemesis), lines=line_of)

    def line_of(self, op: Op) -> int | None:
        """The source line of `op` (1-based), if it belongs to this history."""
        for i, candidate in enumerate(self.ops):
            if candidate.index == op.index:
                return self.lines[i]
        return None

    def keys(self) -> tuple[Key, ...]:
        """The distinct keys of client operations, in order of first invocation."""
        seen: dict[Key, None] = {}
        for pair in self.pairs:
            seen.setdefault(pair.invoke.key, None)
        return tuple(seen)

    def __len__(self) -> int:
        return len(self.ops)


class _Same:
    """Sentinel type: echo the invoke's value in a completion."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "SAME"


SAME: Final = _Same()


class HistoryRecorder:
    """Builds a history as operations happen, assigning indexes; enforces pairing as it goes.

    Time is supplied by the caller (virtual ns in the simulator, a monotonic clock in a
    real harness), so the recorder itself is deterministic.

    Usage::

        rec = HistoryRecorder()
        rec.invoke(process=1, f="write", key="x", value=3, time=10)
        rec.complete(process=1, type="ok", time=25)  # value defaults to the invoke's
        history = rec.history()
    """

    def __init__(self) -> None:
        self._ops: list[Op] = []
        self._open: dict[Process, Op] = {}
        self._retired: set[Process] = set()

    @property
    def ops(self) -> tuple[Op, ...]:
        return tuple(self._ops)

    def outstanding(self, process: Process) -> Op | None:
        """The invoke `process` is waiting on, if any."""
        return self._open.get(process)

    def invoke(
        self,
        *,
        process: Process,
        f: str,
        key: Key = None,
        value: Value = None,
        time: int,
        node: int | str | None = None,
    ) -> Op:
        """Record an invocation. Raises `HistoryError` on misuse (see `History` rules)."""
        if process == NEMESIS:
            raise HistoryError("use nemesis() to record fault-injection events")
        if process in self._open:
            raise HistoryError(f"process {process!r} already has an outstanding op")
        if process in self._retired:
            raise HistoryError(f"process {process!r} was retired by an info completion")
        op = self._append(
            process=process, type=INVOKE, f=f, key=key, value=value, time=time, node=node
        )
        self._open[process] = op
        return op

    def complete(
        self,
        *,
        process: Process,
        type: OpType,
        time: int,
        value: Value | _Same = SAME,
        error: Value = None,
        node: int | str | None = None,
    ) -> Op:
        """Record the completion of `process`'s outstanding op.

        `value` is the result (a read's value); by default (`SAME`) the invoke's value is
        echoed, which is what writes and cas conventionally record. After ``type="info"``
        the process is retired and may not invoke again.
        """
        if type not in COMPLETION_TYPES:
            raise HistoryError(f"completion type must be one of {COMPLETION_TYPES}, got {type!r}")
        inv = self._open.pop(process, None)
        if inv is None:
            raise HistoryError(f"process {process!r} has no outstanding op to complete")
        result = inv.value if isinstance(value, _Same) else value
        op = self._append(
            process=process,
            type=type,
            f=inv.f,
            key=inv.key,
            value=result,
            time=time,
            error=error,
            node=node if node is not None else inv.node,
        )
        if type == INFO:
            self._retired.add(process)
        return op

    def nemesis(self, *, f: str, value: Value = None, time: int) -> Op:
        """Record a fault-injection event (process ``"nemesis"``, type ``info``)."""
        return self._append(process=NEMESIS, type=INFO, f=f, key=None, value=value, time=time)

    def history(self) -> History:
        """The validated history so far (outstanding ops appear as pending)."""
        return History.of(self._ops)

    def _append(
        self,
        *,
        process: Process,
        type: OpType,
        f: str,
        key: Key,
        value: Value,
        time: int,
        error: Value = None,
        node: int | str | None = None,
    ) -> Op:
        if self._ops and time < self._ops[-1].time:
            raise HistoryError(f"time went backwards ({time} after {self._ops[-1].time})")
        # `Op(index=..., ..., node=...)`, positionally through `_new_op` (the same object and
        # validation, cheaper). `value_from_json` returns None and plain scalars unchanged:
        # skip the call then.
        op = _new_op(
            len(self._ops), time, process, type, f, key,
            value if value is None or value.__class__ in _SCALAR_TYPES else value_from_json(value),
            error if error is None else value_from_json(error),
            node,
        )
        self._ops.append(op)
        return op


# --- JSON values -----------------------------------------------------------------------------


def value_from_json(raw: object, *, where: str = "value") -> Value:
    """Convert a decoded JSON value into an immutable `Value` (lists -> tuples, objects -> Map).

    Raises `HistoryError` for anything JSON cannot hold (NaN, infinities, non-string keys).
    """
    if raw is None or isinstance(raw, _SCALAR_TYPES):
        return raw
    if isinstance(raw, float):
        if not math.isfinite(raw):
            raise HistoryError(f"field '{where}' holds a non-finite number")
        return raw
    if isinstance(raw, (list, tuple)):
        return tuple(value_from_json(v, where=where) for v in raw)
    if isinstance(raw, Mapping):
        items: dict[str, Value] = {}
        for k, v in raw.items():
            if not isinstance(k, str):
                raise HistoryError(f"field '{where}' has a non-string object key {k!r}")
            items[k] = value_from_json(v, where=where)
        return immutables.Map(items)
    raise HistoryError(f"field '{where}' is not a JSON value: {raw!r}")


def value_to_json(value: Value) -> object:
    """The plain-JSON form of a `Value` (tuples -> lists, Maps -> dicts)."""
    if isinstance(value, tuple):
        return [value_to_json(v) for v in value]
    if isinstance(value, immutables.Map):
        return {k: value_to_json(v) for k, v in value.items()}
    return value


# --- JSON Lines --------------------------------------------------------------------------------


def op_from_json(obj: object, *, line: int | None = None) -> Op:
    """Build an `Op` from one decoded JSON object; errors name `line` and the field."""
    if not isinstance(obj, dict):
        raise HistoryError("each line must be a JSON object", line=line)
    unknown = sorted(k for k in obj if k not in _FIELDS)
    if unknown:
        raise HistoryError(f"unknown field(s) {', '.join(map(repr, unknown))}", line=line)
    for name in ("index", "time", "process", "type", "f"):
        if name not in obj:
            raise HistoryError(f"missing field '{name}'", line=line)
    try:
        return Op(
            index=cast(int, obj["index"]),
            time=cast(int, obj["time"]),
            process=cast(Process, obj["process"]),
            type=cast(OpType, obj["type"]),
            f=cast(str, obj["f"]),
            key=cast(Key, obj.get("key")),
            value=value_from_json(obj.get("value")),
            error=value_from_json(obj.get("error"), where="error"),
            node=cast("int | str | None", obj.get("node")),
        )
    except HistoryError as exc:
        raise HistoryError(str(exc), line=line) from None


def parse_history(lines: Iterable[str]) -> History:
    """Parse JSON Lines text (blank lines are skipped) into a validated `History`."""
    ops: list[Op] = []
    numbers: list[int] = []
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise HistoryError(
                f"invalid JSON: {exc.msg} (column {exc.colno})", line=number
            ) from None
        ops.append(op_from_json(obj, line=number))
        numbers.append(number)
    return History.of(ops, lines=numbers)


def read_history(path: str | Path) -> History:
    """Read a JSON Lines history file. Raises `HistoryError` (malformed) or `OSError`."""
    with Path(path).open(encoding="utf-8") as fh:
        try:
            return parse_history(fh)
        except UnicodeDecodeError as exc:
            raise HistoryError(f"not UTF-8 text: {exc.reason}") from None


def dump_ops(ops: Iterable[Op]) -> Iterator[str]:
    """One compact JSON line (without newline) per op."""
    for op in ops:
        yield json.dumps(op.to_json(), separators=(",", ":"), allow_nan=False)


def write_history(path: str | Path, ops: Iterable[Op] | History) -> None:
    """Write ops as JSON Lines (atomically enough for a harness: one write of the whole file)."""
    seq = ops.ops if isinstance(ops, History) else ops
    text = "".join(line + "\n" for line in dump_ops(seq))
    Path(path).write_text(text, encoding="utf-8")


_INT_OR_STR = frozenset((int, str))
_PLAIN_SCALARS = frozenset((type(None), bool, int, str))
"""Exact types `Op`'s fast path accepts (floats need the finiteness check)."""
_SCALAR_TYPES = (bool, int, str)
"""JSON scalars other than null and floats (a tuple: `isinstance` with `a | b` builds a
union per call)."""


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_scalar(x: object) -> bool:
    if isinstance(x, float):
        return math.isfinite(x)
    return x is None or isinstance(x, _SCALAR_TYPES)
