"""Would msgspec speed up phalanx's wire codec on its real messages? (issue 23, item 2)

Usage (from bench/)::

    ../.venv/bin/python codec_msgspec.py                 # all samples, 7 interleaved rounds
    ../.venv/bin/python codec_msgspec.py --rounds 3 --number 5000

msgspec is not a dependency of phalanx: ``pip install msgspec`` into the venv first.

For each sample message of the Raft and PBFT write paths (built as the cores build them:
100-byte commands, node ids ``n1``...), prints microseconds per encode and per decode of:

- ``phalanx``: the codec in use, through its hot-path forms (`Registry.encoder()` and
  `Registry.decoder()`: what the transport, the WAL and the simulator call);
- ``msgspec+dc``: msgspec keeping the messages frozen dataclasses, as the codec's public
  API requires (``register_all({id: DataclassType})``). msgspec writes a dataclass as a
  msgpack MAP, never as our ``[type_id, fields...]`` array, so every registered class needs
  a twin ``msgspec.Struct`` (``array_like=True, tag=type_id``: that array, byte for byte)
  and each message is converted to its twin before encoding and back after decoding
  (`msgspec.convert`, ``from_attributes=True``: the only C-level conversion msgspec offers);
- ``msgspec-Struct``: the twin's encode/decode alone: the upper bound, reached only if
  every message class of every protocol became a `msgspec.Struct` (a different public API).

and whether the twin's bytes equal ours (``same``; the twins leave the ``wire_optional``
fields at their default on the wire: omitting them would take a Python step per message).
Rounds interleave the three paths, so a change of machine load hits all of them alike; the
figure is the median over rounds, in process CPU time (not wall time: the machine is
shared). The load average is printed with the table.

On the real path (``--inproc PAIRS``): runs `inproc_cpu.py` (3 Raft nodes, a client, TLS,
fsync, one process) PAIRS times as is and PAIRS times with `phalanx.net.wire`'s ``encode``,
``decode``, ``decode_entry`` and ``canonical_bytes`` replaced by the twins (``msgspec+dc``),
alternating, and prints each run's process CPU per write. Messages the twins do not know
(registered after the twins were built) and ``canonical=True`` decodes take the codec in use;
their count is printed. ``--codec-share`` runs it once with the codec in use, adding up the
main thread's CPU time inside it: the codec's own CPU per write on that path.

Must not be imported by the package.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import importlib
import os
import statistics
import subprocess
import sys
import time
import types
import typing
from collections.abc import Callable

import msgspec

from phalanx.consensus.pbft.messages import Commit, Prepare, PrePrepare
from phalanx.consensus.raft.messages import AppendEntries, AppendEntriesResponse
from phalanx.consensus.types import ClientRequest, Entry, EntryKind, NodeId
from phalanx.net import wire
from phalanx.net.client_protocol import ClientCall, ClientReply, ReplyStatus
from phalanx.net.codec import DecodeError

MAPPINGS = (
    "phalanx.consensus.raft.messages:RAFT_MESSAGES",
    "phalanx.consensus.pbft.messages:PBFT_MESSAGES",
    "phalanx.net.client_protocol:CLIENT_MESSAGES",
)


def _register() -> None:
    for spec in MAPPINGS:
        module, attr = spec.split(":")
        wire.register_all(getattr(importlib.import_module(module), attr))


class Twins:
    """One `msgspec.Struct` per registered class (``[type_id, fields...]`` on the wire)."""

    def __init__(self, classes: dict[int, type]) -> None:
        self.module = types.ModuleType("_codec_msgspec_twins")
        sys.modules[self.module.__name__] = self.module
        self.module.typing = typing  # type: ignore[attr-defined]
        self.names = {cls: f"T{tid}" for tid, cls in classes.items()}
        self.classes = classes
        self.struct: dict[type, type] = {}
        for tid, cls in classes.items():
            hints = typing.get_type_hints(cls)
            fields: list[tuple[str, str] | tuple[str, str, object]] = []
            for f in dataclasses.fields(cls):
                if f.metadata.get("wire_optional"):
                    fields.append((f.name, self._type(hints[f.name]), f.default))
                else:
                    fields.append((f.name, self._type(hints[f.name])))
            twin = msgspec.defstruct(
                self.names[cls], fields, module=self.module.__name__, array_like=True,
                tag=tid, omit_defaults=True, frozen=True,
            )
            setattr(self.module, self.names[cls], twin)
            self.struct[cls] = twin
        self.dataclass = {twin: cls for cls, twin in self.struct.items()}
        union = typing.Union[tuple(self.struct.values())]  # type: ignore[valid-type]  # noqa: UP007
        self.decoder = msgspec.msgpack.Decoder(union)
        self.encoder = msgspec.msgpack.Encoder()

    def _type(self, tp: object) -> str:
        if tp is None or tp is type(None):
            return "None"
        if tp in (int, str, bytes, bool):
            return typing.cast(type, tp).__name__
        if isinstance(tp, typing.NewType):
            return self._type(tp.__supertype__)
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if origin is tuple:
            if len(args) == 2 and args[1] is Ellipsis:
                return f"tuple[{self._type(args[0])}, ...]"
            return "tuple[" + ", ".join(self._type(a) for a in args) + "]"
        if origin is frozenset:
            return f"frozenset[{self._type(args[0])}]"
        if origin is typing.Union or origin is types.UnionType:
            return "typing.Union[" + ", ".join(self._type(a) for a in args) + "]"
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            name = f"E_{tp.__name__}"
            setattr(self.module, name, tp)
            return name
        if tp in self.names:
            return self.names[tp]
        base = typing.cast(type, tp)
        subs = [self.names[c] for c in self.classes.values() if issubclass(c, base)]
        return "typing.Union[" + ", ".join(subs) + "]"

    def encode(self, obj: object) -> bytes:
        twin: object = msgspec.convert(obj, self.struct[type(obj)], from_attributes=True)
        return self.encoder.encode(twin)

    def decode(self, data: bytes) -> object:
        twin = self.decoder.decode(data)
        return msgspec.convert(twin, self.dataclass[type(twin)], from_attributes=True)


def samples() -> dict[str, object]:
    def request(i: int) -> ClientRequest:
        return ClientRequest(client_id=f"client-{i}", request_no=1000 + i, command=b"v" * 100)

    def entries(n: int) -> tuple[Entry, ...]:
        return tuple(
            Entry(index=500 + i, term=3, kind=EntryKind.COMMAND, requests=(request(i),))
            for i in range(n)
        )

    digest, sig = b"d" * 32, b"s" * 64
    return {
        "ClientCall": ClientCall(request=request(0)),
        "ClientReply": ClientReply(client_id="client-0", request_no=1000,
                                   status=ReplyStatus.OK, replica="n1", result=b"ok"),
        "Entry": entries(1)[0],
        "AppendEntries(1)": AppendEntries(term=3, leader_id=NodeId("n1"), prev_log_index=499,
                                          prev_log_term=3, entries=entries(1), leader_commit=499),
        "AppendEntries(8)": AppendEntries(term=3, leader_id=NodeId("n1"), prev_log_index=499,
                                          prev_log_term=3, entries=entries(8), leader_commit=499),
        "AppendEntriesResponse": AppendEntriesResponse(term=3, success=True, match_index=500),
        "PrePrepare(1)": PrePrepare(view=0, seq=77, digest=digest, batch=(request(0),),
                                    replica=NodeId("n1"), signature=sig),
        "PrePrepare(16)": PrePrepare(view=0, seq=77, digest=digest,
                                     batch=tuple(request(i) for i in range(16)),
                                     replica=NodeId("n1"), signature=sig),
        "Prepare": Prepare(view=0, seq=77, digest=digest, replica=NodeId("n2"), signature=sig),
        "Commit": Commit(view=0, seq=77, digest=digest, replica=NodeId("n2"), auth=b"a" * 32),
    }


def _time(fn: Callable[[object], object], arg: object, number: int) -> float:
    start = time.process_time()  # CPU, not wall: the machine is shared
    for _ in range(number):
        fn(arg)
    return (time.process_time() - start) / number * 1e6


def _patch_wire(mode: str) -> dict[str, float]:
    """Route the default registry's ``encode``/``decode`` (the instance's methods, which the
    WAL and state journals call) and `phalanx.net.wire`'s module functions (the transport's
    and the client port's) through the twins (``mode="twins"``), or through the codec in use
    with the main thread's CPU time spent in them added up (``mode="time"``)."""
    _register()
    registry = wire.default_registry()
    counts: dict[str, float] = {"calls": 0, "fallback": 0, "cpu": 0.0}
    slow_encode, slow_decode = registry.encode, registry.decode
    slow_canonical = registry.canonical_bytes
    clock = time.thread_time
    if mode == "time":
        def encode(obj: object) -> bytes:
            start = clock()
            try:
                return slow_encode(obj)
            finally:
                counts["cpu"] += clock() - start
                counts["calls"] += 1

        def decode(data: bytes, *, expected: type | None = None,
                   canonical: bool = False) -> object:
            start = clock()
            try:
                return slow_decode(data, expected=expected, canonical=canonical)
            finally:
                counts["cpu"] += clock() - start
                counts["calls"] += 1
    else:
        twins = Twins(registry.classes())
        struct_of, dataclass_of = twins.struct, twins.dataclass
        encode_twin, decode_twin = twins.encoder.encode, twins.decoder.decode

        def encode(obj: object) -> bytes:
            twin = struct_of.get(type(obj))
            if twin is None:
                counts["fallback"] += 1
                return slow_encode(obj)
            counts["calls"] += 1
            return encode_twin(msgspec.convert(obj, twin, from_attributes=True))

        def decode(data: bytes, *, expected: type | None = None,
                   canonical: bool = False) -> object:
            if canonical:
                counts["fallback"] += 1
                return slow_decode(data, expected=expected, canonical=True)
            try:
                twin = decode_twin(data)
            except msgspec.DecodeError:
                counts["fallback"] += 1
                return slow_decode(data, expected=expected)  # an unknown class, or an error
            counts["calls"] += 1
            obj: object = msgspec.convert(twin, dataclass_of[type(twin)], from_attributes=True)
            if expected is not None and not isinstance(obj, expected):
                raise DecodeError(f"expected {expected.__name__}, got {type(obj).__name__}")
            return obj

    def canonical_bytes(obj: object, *, omit: tuple[str, ...] = ()) -> bytes:
        if omit:
            counts["fallback"] += 1
            return slow_canonical(obj, omit=omit)
        return encode(obj)

    registry.encode = encode  # type: ignore[method-assign]
    registry.decode = decode  # type: ignore[method-assign,assignment]
    registry.canonical_bytes = canonical_bytes  # type: ignore[method-assign]
    wire.encode = encode
    wire.decode = decode  # type: ignore[assignment]
    wire.decode_entry = decode  # type: ignore[assignment]
    wire.canonical_bytes = canonical_bytes
    return counts


def _inproc(pairs: int, writes: int, tick_ms: int) -> None:
    """A/B of `inproc_cpu.py` with the codec in use and with the twins, interleaved."""
    here = os.path.dirname(os.path.abspath(__file__))
    tick = ["--tick-ms", str(tick_ms)]
    runs = {
        "phalanx": [sys.executable, os.path.join(here, "inproc_cpu.py"), "--writes", str(writes),
                    *tick],
        "msgspec+dc": [sys.executable, os.path.abspath(__file__), "--patched-inproc",
                       str(writes), "--patch", "twins", *tick],
    }
    cpu: dict[str, list[float]] = {name: [] for name in runs}
    for i in range(pairs):
        order = list(runs) if i % 2 == 0 else list(reversed(runs))
        for name in order:
            out = subprocess.run(runs[name], check=True, capture_output=True, text=True).stdout
            line = next(ln for ln in out.splitlines() if "per write" in ln)
            cpu[name].append(float(line.split("CPU ")[1].split(" ms")[0]))
            extra = [ln for ln in out.splitlines() if ln.startswith("codec calls")]
            print(f"{name:11} {line}" + (f"  [{extra[0]}]" if extra else ""), flush=True)
    for name, values in cpu.items():
        print(f"{name:11} median CPU per write {statistics.median(values):.3f} ms "
              f"over {len(values)} runs")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--number", type=int, default=3000, help="calls per path per round")
    p.add_argument("--inproc", type=int, default=0, metavar="PAIRS",
                   help="A/B on the real path instead: PAIRS runs of inproc_cpu.py each way")
    p.add_argument("--writes", type=int, default=1000, help="writes per --inproc run")
    p.add_argument("--tick-ms", type=int, default=200,
                   help="the nodes' tick in --inproc runs: long, so that idle ticks and "
                        "heartbeats (more of them in a slower run) stay out of the figure")
    p.add_argument("--codec-share", action="store_true",
                   help="run inproc_cpu.py once, adding up the CPU spent in the codec")
    p.add_argument("--patched-inproc", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--patch", choices=("twins", "time"), default="time", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.codec_share:
        args.patched_inproc, args.patch = args.writes, "time"
    if args.patched_inproc:
        counts = _patch_wire(args.patch)
        import inproc_cpu  # bench/ is on sys.path when this script runs

        warmup = 100
        inproc_cpu.main(["--writes", str(args.patched_inproc), "--tick-ms", str(args.tick_ms),
                         "--warmup", str(warmup)])
        writes = args.patched_inproc + warmup  # the counts include the warm-up's writes
        if args.patch == "time":
            print(f"codec calls: {counts['calls'] / writes:.1f} per write, "
                  f"{counts['cpu'] / writes * 1e3:.3f} ms CPU per write in the codec "
                  f"(warm-up and start-up included)")
        else:
            print(f"codec calls: {counts['calls']:.0f} through the twins, "
                  f"{counts['fallback']:.0f} not")
        return
    if args.inproc:
        _inproc(args.inproc, args.writes, args.tick_ms)
        return
    _register()
    registry = wire.default_registry()
    twins = Twins(registry.classes())
    encode, decode = registry.encoder(), registry.decoder()
    print(f"msgspec {msgspec.__version__}; load average {os.getloadavg()[0]:.2f}")
    print(f"{'message':24} {'bytes':>5} {'same':>4} | {'encode µs: phalanx':>18} "
          f"{'msgspec+dc':>10} {'Struct':>7} | {'decode µs: phalanx':>18} "
          f"{'msgspec+dc':>10} {'Struct':>7}")
    for name, msg in samples().items():
        ours = encode(msg)
        theirs = twins.encode(msg)
        twin: object = msgspec.convert(msg, twins.struct[type(msg)], from_attributes=True)
        assert twins.decode(ours) == msg
        assert decode(ours) == msg
        paths: list[tuple[Callable[[typing.Any], object], object]] = [
            (encode, msg), (twins.encode, msg), (twins.encoder.encode, twin),
            (decode, ours), (twins.decode, ours), (twins.decoder.decode, ours),
        ]
        times: list[list[float]] = [[] for _ in paths]
        for _ in range(args.rounds):
            for i, (fn, arg) in enumerate(paths):
                times[i].append(_time(fn, arg, args.number))
        med = [statistics.median(t) for t in times]
        print(f"{name:24} {len(ours):5} {'yes' if ours == theirs else 'NO':>4} | "
              f"{med[0]:18.2f} {med[1]:10.2f} {med[2]:7.2f} | "
              f"{med[3]:18.2f} {med[4]:10.2f} {med[5]:7.2f}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
