"""The endorsement rule's K (own endorsed pending transactions conflicting with T) is found
through a key index (`Endorser._by_key`, `AppView.keys`): after any schedule it equals a
walk over every own endorsement, also with commands whose keys are unknown (None: key
ranges), which are candidates for everything; the committed-but-unapplied check, which skips
transactions sharing no key, agrees with a full check. Likewise the store's index of pending
records (`TxStore.pending`, `status().pending`) equals a walk over every record, through
commits and GC."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from leaderless_harness import EPOCH, KvApp, endorsement, make_tx, run, solo, tx_id

from phalanx.consensus.core import Receive, Tick
from phalanx.consensus.leaderless.store import TxState
from phalanx.consensus.types import NodeId


class RangeKvApp(KvApp):
    """KvApp whose `scan` commands have no key set (a range read of every key)."""

    def keys(self, command: bytes) -> tuple[str, ...] | None:
        return None if command.startswith(b"scan") else super().keys(command)

    def writes(self, command: bytes) -> tuple[str, ...]:
        return () if command.startswith(b"scan") else super().writes(command)

    def needs_requirements(self, command: bytes) -> tuple[str, ...]:
        return () if command.startswith(b"scan") else super().needs_requirements(command)

    def conflicts(self, a: bytes, b: bytes) -> bool:
        scans = a.startswith(b"scan"), b.startswith(b"scan")
        if any(scans):
            other = b if scans[0] else a
            return not all(scans) and not other.startswith(b"get")
        return super().conflicts(a, b)


def _brute_force(core: object, tx_id_: bytes) -> set[bytes]:
    endorser = core._endorser  # type: ignore[attr-defined]
    store = core._store  # type: ignore[attr-defined]
    record = store.get(tx_id_)
    out = set()
    for other_id in core._kernel.endorsed_ids():  # type: ignore[attr-defined]
        other = store.get(other_id)
        if (other is not None and other.state is TxState.PENDING and other_id != tx_id_
                and endorser.conflicts(record, other)):
            out.add(other_id)
    return out


STEP = st.tuples(st.sampled_from(["set", "add", "get", "scan", "commit", "tick"]),
                 st.integers(0, 3), st.integers(0, 30))


@settings(max_examples=150, deadline=None)
@given(st.lists(STEP, max_size=40))
def test_k_from_the_index_equals_a_walk_over_every_own_endorsement(
        steps: list[tuple[str, int, int]]) -> None:
    core, app = solo(app=RangeKvApp(), gc_horizon_ms=300)
    now = EPOCH
    run(core, app, Tick(now_ms=now))
    txs = []
    for i, (op, key, k) in enumerate(steps):
        if op == "tick":
            now += 10 * k
            run(core, app, Tick(now_ms=now))
        elif op == "commit" and txs:
            tx = txs[k % len(txs)]
            for node in ("n2", "n3"):
                run(core, app, Receive(src=NodeId(node), message=endorsement(node, tx)))
        elif op in ("set", "add", "get", "scan"):
            command = f"{op} k{key} {k}" if op != "scan" else f"scan k {k}"
            reqs = {f"k{key}": b""} if op in ("set", "get") and k % 3 else None
            tx = make_tx(command, no=i + 1, reqs=reqs, deadline=now + 50 + 10 * k,
                         read_only=op in ("get", "scan"))
            txs.append(tx)
            run(core, app, Receive(src=NodeId("n2"), message=tx))
        walked = [r for r in core._store.records.values() if r.state is TxState.PENDING]
        assert core._store.pending() == walked
        assert core.status().pending == len(walked)
        for tx in txs:
            record = core._store.get(tx_id(tx))
            if record is not None and record.state is TxState.PENDING:
                found = core._endorser.conflicting_pending(tx_id(tx), tx)
                assert len(found) == len(set(found))
                assert set(found) == _brute_force(core, tx_id(tx))
                unapplied = [core._store.get(t) for t in core._gate.unapplied_ids()]
                assert core._endorser._unapplied_conflict(record) == any(
                    o is not None and core._endorser.conflicts(record, o) for o in unapplied)
