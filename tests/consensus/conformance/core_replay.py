"""Replaying one recorded input sequence into a fresh core, and a Ready as bytes.

Owns: `recorded(subject, seed)` (a fault-free cluster run with lossy, duplicating links that
records, per node, the inputs its first core was stepped with, that core's Readys and the
random generator state it was built with), `replay(...)` (a fresh replica and core from a
fresh setup, built in `SimNode`'s order, fed those inputs) and `ready_bytes` (every field
of a Ready, messages and records through the codec: two Readys are equal outputs iff
their bytes are).
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass

from sim_cluster import MS, SimCluster
from subjects import SUBJECTS, Subject

from phalanx.consensus.core import Input, Ready, snapshot_bytes
from phalanx.jepsen.sim.network import NetworkConfig
from phalanx.net.codec import Registry
from phalanx.runtime.persistence import DurableState
from phalanx.storage.memory import MemoryDisk


@dataclass(frozen=True, slots=True)
class Recording:
    subject: Subject
    node: str
    rng_state: object
    inputs: tuple[Input, ...]
    outputs: tuple[bytes, ...]


def _part(codec: Registry, value: object) -> bytes:
    try:
        return codec.encode(value)
    except Exception:
        return repr(value).encode()


def ready_bytes(codec: Registry, ready: Ready) -> bytes:
    """The canonical bytes of everything `ready` asks a driver to do."""
    parts = [str(ready.number).encode(), str(ready.must_sync).encode(),
             str(ready.truncate_from).encode()]
    for sends in (ready.early_messages, ready.messages):
        parts += [s.to.encode() + b">" + _part(codec, s.message) for s in sends]
        parts.append(b"|")
    if ready.snapshot is not None:
        parts += [_part(codec, ready.snapshot.meta), snapshot_bytes(ready.snapshot.data)]
    for records in (ready.entries, ready.committed, ready.reads, ready.rejected):
        parts += [_part(codec, r) for r in records]
        parts.append(b"|")
    parts += [_part(codec, ready.hard_state), _part(codec, ready.core_state)]
    return b"\x00".join(parts)


@functools.cache
def recorded(name: str, seed: int) -> tuple[Recording, ...]:
    subject = next(s for s in SUBJECTS if s.name == name)
    cluster = SimCluster(subject, seed, record=True,
                         network=NetworkConfig(loss=0.05, duplicate=0.05))
    for node in cluster.nodes.values():
        node.start()
    cluster.workload(600 * MS)
    out = []
    for node in cluster.names:
        probe = cluster.probes[node][0]
        assert probe.inputs is not None
        assert probe.readys is not None
        out.append(Recording(
            subject=subject, node=node, rng_state=cluster.rng_states[node][0],
            inputs=tuple(probe.inputs),
            outputs=tuple(ready_bytes(cluster.codec, r) for r in probe.readys)))
    return tuple(out)


def replay(rec: Recording) -> tuple[bytes, ...]:
    """A fresh replica and core of a fresh setup, built as the recorded ones were (the
    replica first: a core may read it, as the leaderless core reads the applied versions),
    fed the recorded inputs. After each step the Ready's snapshot is installed and its
    committed entries applied, as `SimNode` does before stepping the next input (the memory
    disk's fsync is instantaneous), so the replica the core reads is the recorded one."""
    setup = rec.subject.make_setup()
    rng = random.Random()
    rng.setstate(rec.rng_state)  # type: ignore[arg-type]
    empty = DurableState(hard_state=None, snapshot=None, snapshot_data=None, entries=())
    replica = setup.make_replica(rec.node, MemoryDisk(rec.node).open(), empty)
    core = setup.make_core(rec.node, empty, rng)
    out = []
    for inp in rec.inputs:
        ready = core.step(inp)
        out.append(ready_bytes(setup.codec, ready))
        if ready.snapshot is not None:
            replica.install(ready.snapshot.meta, snapshot_bytes(ready.snapshot.data))
        for entry in ready.committed:
            replica.apply(entry)
    return tuple(out)
