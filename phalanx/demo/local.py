"""`phalanx demo`: a durable single-process KV replica that crashes mid-write and recovers.

Owns: the local crash/recovery demonstration (until the networked runtime exists). It drives
the real replica layer (`phalanx.apps.replica`) over real files with fsync on: every write is
appended to the WAL and fsynced before it is applied and acknowledged; checkpoints are taken
every few entries and the WAL prefix is compacted behind them. Then it simulates a crash in the
middle of writing a record (a torn WAL tail), reopens everything from disk, and checks that
every acknowledged write survived.

Must not import: trio, consensus cores. Exit code 0 only if the verification passed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

from phalanx.apps import kv_wire
from phalanx.apps.kv import KvStateMachine
from phalanx.apps.kv_types import Put
from phalanx.apps.replica import ApplyStatus, CheckpointPolicy, Replica
from phalanx.consensus.types import ClientRequest, Configuration, Entry, EntryKind, NodeId
from phalanx.net import wire
from phalanx.storage.files import Storage, open_file_storage
from phalanx.storage.interface import SyncPolicy

CLIENT = "demo-client"




def _entry(index: int) -> Entry:
    command = kv_wire.encode_command(Put(key=_key(index), value=_value(index)))
    request = ClientRequest(client_id=CLIENT, request_no=index, command=command)
    return Entry(index=index, term=1, kind=EntryKind.COMMAND, requests=(request,))


def _key(i: int) -> str:
    return f"user/{i:06d}"


def _value(i: int) -> bytes:
    return f"balance={i * 7 % 1000}".encode()


def _open(path: str, every: int) -> tuple[Storage, Replica]:
    storage = open_file_storage(path, sync=SyncPolicy.GROUP, segment_bytes=64 << 10)
    replica = Replica(
        KvStateMachine(),
        checkpoints=storage.checkpoints,
        wal=storage.wal,
        decode_entry=wire.decode_entry,
        policy=CheckpointPolicy(every_entries=every, every_bytes=0),
        config=Configuration(voters=(NodeId("local"),)),
    )
    return storage, replica


def _tear_newest_segment(path: str, record_len: int) -> tuple[str, int]:
    """Cut the newest WAL segment in the middle of its last record: what a power loss during
    the write leaves behind. Returns (file name, bytes cut)."""
    segments = sorted(n for n in os.listdir(path) if n.startswith("wal-") and n.endswith(".seg"))
    name = segments[-1]
    full = os.path.join(path, name)
    cut = max(1, record_len // 2)
    os.truncate(full, os.path.getsize(full) - cut)
    return name, cut


def run(argv: Sequence[str] | None = None) -> int:
    """Parse `argv` (without the program name) and run the demo."""
    parser = argparse.ArgumentParser(prog="phalanx demo", description=_DESCRIPTION)
    _add_arguments(parser)
    return _main(parser.parse_args(argv))


_DESCRIPTION = (
    "Run a durable single-process KV replica: write keys (each fsynced to the WAL before it "
    "is acknowledged), crash in the middle of a write, recover from the newest checkpoint plus "
    "WAL replay, and verify that every acknowledged write survived."
)


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--keys", type=int, default=500, help="keys to write (default 500)")
    parser.add_argument(
        "--crash-at", type=int, default=None,
        help="the write during which the crash happens (default: 80%% of --keys)",
    )
    parser.add_argument(
        "--checkpoint-every", type=int, default=100,
        help="checkpoint after this many entries (default 100)",
    )
    parser.add_argument(
        "--dir", default=None, help="data directory to use and keep (default: a temp dir, removed)"
    )


def add_demo_command(subparsers: Any) -> argparse.ArgumentParser:
    """Register `phalanx demo` on an argparse subparsers object (`handler=` is set)."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "demo", help="crash/recovery demo of a durable KV replica", description=_DESCRIPTION
    )
    _add_arguments(parser)
    parser.set_defaults(handler=_main)
    return parser


def _main(args: argparse.Namespace) -> int:
    keys: int = args.keys
    crash_at: int = args.crash_at if args.crash_at is not None else max(1, keys * 4 // 5)
    every: int = args.checkpoint_every
    if keys < 1 or not 1 <= crash_at <= keys or every < 1:
        print("error: need --keys >= 1, 1 <= --crash-at <= --keys, --checkpoint-every >= 1",
              file=sys.stderr)
        return 2
    keep = args.dir is not None
    path = args.dir if keep else tempfile.mkdtemp(prefix="phalanx-demo-")
    os.makedirs(path, exist_ok=True)
    if os.listdir(path):
        print(f"error: {path} is not empty", file=sys.stderr)
        return 2
    try:
        return _demo(path, keys, crash_at, every)
    finally:
        if not keep:
            shutil.rmtree(path, ignore_errors=True)


def _demo(path: str, keys: int, crash_at: int, every: int) -> int:
    say = print
    say("phalanx demo: a durable single-process KV replica")
    say(f"  data directory : {path}")
    say(f"  plan           : write {keys} keys, crash during write #{crash_at}, recover, verify")
    say("  durability     : each write is appended to the WAL and fsynced before it is")
    say(f"                   applied and acknowledged; checkpoint every {every} entries")
    say("")
    say("1. Writing keys")
    storage, replica = _open(path, every)
    acknowledged: dict[str, bytes] = {}
    progress = max(1, (crash_at - 1) // 5)
    for i in range(1, crash_at):
        entry = _entry(i)
        storage.wal.append(i, wire.encode(entry))
        storage.wal.sync()  # durable before the client hears "ok"
        (applied,) = replica.apply(entry)
        replica.poll()
        if applied.status is ApplyStatus.APPLIED:
            acknowledged[_key(i)] = _value(i)
        if i % progress == 0 or i == crash_at - 1:
            st = replica.status()
            say(f"   wrote {i:>6} keys, {len(acknowledged):>6} acknowledged; "
                f"last checkpoint at entry {st.checkpoint_index}, "
                f"WAL holds entries {storage.wal.first_index()}..{storage.wal.last_index()}")
    checkpoint_before = replica.status().checkpoint_index

    say("")
    say(f"2. Crash during write #{crash_at} ({_key(crash_at)})")
    doomed = wire.encode(_entry(crash_at))
    storage.wal.append(crash_at, doomed)  # written, never fsynced, never acknowledged
    segment, cut = _tear_newest_segment(path, len(doomed))
    say(f"   the record was half written: {segment} lost its last {cut} bytes")
    say("   the process dies: no close, no flush; all in-memory state is gone")
    del storage, replica  # abandon without closing: nothing more reaches the disk

    say("")
    say("3. Recovering from disk")
    storage, replica = _open(path, every)
    recovery = storage.wal.recovery
    if recovery.torn_path is not None:
        say(f"   WAL: torn tail cut off in {os.path.basename(recovery.torn_path)} at offset "
            f"{recovery.torn_offset} ({recovery.torn_bytes} bytes: {recovery.torn_reason})")
    else:
        say("   WAL: no torn tail found")
    report = replica.restore_latest()
    for problem in report.problems:
        say(f"   checkpoint problem (skipped): {problem}")
    say(f"   loaded checkpoint at entry {report.checkpoint_index}, "
        f"replayed {report.replayed} WAL entries -> applied index {report.applied_index}")

    say("")
    say("4. Verifying every acknowledged write")
    kv = replica.machine
    if not isinstance(kv, KvStateMachine):  # pragma: no cover - we built it above
        raise TypeError("unexpected state machine")
    lost = [k for k, v in acknowledged.items() if kv.get(k) != v]
    crashed_key_present = kv.get(_key(crash_at)) is not None
    say(f"   acknowledged writes found intact : {len(acknowledged) - len(lost)} of "
        f"{len(acknowledged)}")
    say(f"   the torn, unacknowledged write   : "
        f"{'present' if crashed_key_present else 'absent (as expected: never acknowledged)'}")
    exactly_once = True
    index = replica.applied_index
    if crash_at > 1:
        # The client never heard back about its last write (say) and retries it: the retry is
        # committed as a new log entry carrying the same (client id, request number).
        last = _entry(crash_at - 1).requests
        index += 1
        retry = Entry(index=index, term=1, kind=EntryKind.COMMAND, requests=last)
        storage.wal.append(index, wire.encode(retry))
        storage.wal.sync()
        (outcome,) = replica.apply(retry)
        exactly_once = outcome.status is ApplyStatus.DUPLICATE
        say("   a client retry of the last acknowledged write: "
            + ("answered from the session table, not applied twice" if exactly_once
               else f"{outcome.status.value.upper()} (exactly-once violated)"))

    say("")
    say(f"5. Carrying on: writing the remaining keys #{crash_at}..#{keys}")
    for i in range(crash_at, keys + 1):
        index += 1
        request = _entry(i).requests
        entry = Entry(index=index, term=1, kind=EntryKind.COMMAND, requests=request)
        storage.wal.append(index, wire.encode(entry))
        storage.wal.sync()
        (applied,) = replica.apply(entry)
        replica.poll()
        if applied.status is ApplyStatus.APPLIED:
            acknowledged[_key(i)] = _value(i)
    lost_after = [k for k, v in acknowledged.items() if kv.get(k) != v]
    say(f"   {keys - crash_at + 1} more writes acknowledged; all {len(acknowledged)} "
        f"acknowledged keys readable: {'yes' if not lost_after else 'NO'}")
    verified = not lost and not lost_after and not crashed_key_present and exactly_once
    storage.close()

    say("")
    say("Summary")
    say(f"  keys written          : {keys} ({crash_at - 1} before the crash, "
        f"#{crash_at} torn by it and written again after recovery)")
    say(f"  keys acknowledged     : {len(acknowledged)}")
    say(f"  crash point           : during write #{crash_at}")
    say(f"  checkpoint index      : {report.checkpoint_index} "
        f"(newest before the crash: {checkpoint_before})")
    say(f"  entries replayed      : {report.replayed}")
    say(f"  verification          : {'PASSED' if verified else 'FAILED'}"
        f"{'' if verified else f' ({len(lost)} acknowledged writes lost)'}")
    return 0 if verified else 1


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
