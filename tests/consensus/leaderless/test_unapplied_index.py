"""`ReleaseGate`'s key index of released-but-unapplied transactions (`_Unapplied`): after any
sequence of releases, applies, collections and restores, `unapplied_touching(keys)` holds
every unapplied transaction that shares a key with `keys` (or names a range), and only
unapplied ones, and the gate rule blocks exactly as the walk over `released` it replaced."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from leaderless_harness import EPOCH, make_tx, tx_id

from phalanx.consensus.leaderless.messages import Requirement, TransactionProof
from phalanx.consensus.leaderless.release import Committed, ReleaseGate

KEYS = ("a", "b", "c", "d")


class _App:
    def __init__(self) -> None:
        self.index = 0

    def applied(self) -> int:
        return self.index

    def versions(self, keys: object) -> tuple[bytes, ...]:
        return tuple(b"" for _ in keys)  # type: ignore[attr-defined]

    def base_versions(self, keys: object) -> tuple[bytes, ...]:
        return tuple(b"" for _ in keys)  # type: ignore[attr-defined]


def _naive_unapplied(gate: ReleaseGate, applied: int) -> list[Committed]:
    return [c for c in gate.released.values() if c.index > applied]


OPS = st.lists(st.tuples(st.sampled_from(["add", "add", "release", "apply", "collect",
                                          "restore"]),
                         st.integers(0, 15)), max_size=60)


@settings(max_examples=100, deadline=None)
@given(OPS)
def test_index_matches_a_walk_after_any_operations(ops: list[tuple[str, int]]) -> None:
    app = _App()
    gate = ReleaseGate(app, start_index=0)  # type: ignore[arg-type]
    no = 0
    for op, k in ops:
        if op == "add":
            no += 1
            keys = None if k == 15 else tuple(sorted({KEYS[k % 4], KEYS[(k // 4) % 4]}))
            writes = () if k % 3 == 0 or keys is None else keys[:1]
            tx = make_tx(f"add {KEYS[k % 4]}{no} 1", no=no, deadline=EPOCH + k,
                         reqs={KEYS[k % 4]: b""})
            gate.add(Committed(tx_id=tx_id(tx), proof=TransactionProof(tx=tx),
                               request_command=b"", writes=writes, keys=keys))
        elif op == "release" and gate.gated:
            gate.release_now(next(iter(gate.gated.values())))
        elif op == "apply":
            app.index = min(gate.last_index, app.index + 1 + k % 3)
        elif op == "collect" and gate.released:
            gate.collect(next(iter(gate.released)))
        elif op == "restore":
            gate.sort_released()  # what a restore calls: the index is rebuilt
        unapplied = _naive_unapplied(gate, app.index)
        for probe in (None, (KEYS[k % 4],), (KEYS[k % 4], KEYS[(k + 1) % 4])):
            got = set(gate.unapplied_touching(probe))
            want = set(gate.gated) | {c.tx_id for c in unapplied if probe is None
                                      or c.keys is None or set(probe) & {*c.keys, *c.writes}}
            assert got == want, (probe, got, want)
        for item in gate.gated.values():
            assert item.proof is not None
            reqs = item.proof.tx.requirements
            blocked = any(isinstance(r, Requirement) and r.key in c.writes
                          for c in unapplied for r in reqs)
            assert gate.ready(item) is not blocked
