"""The per-transaction `quiescence` scope (`jepsen/sim/leaderless_scope.py`) and the
`decisions` check, on hand-built stuck reports (the simulator runs are in
`test_leaderless_sim.py`)."""

from __future__ import annotations

from phalanx.consensus.leaderless.status import StuckReport, StuckTx, WaitingCheckpoint
from phalanx.consensus.types import NodeId
from phalanx.jepsen.sim.leaderless_scope import (
    disagreements,
    excuse,
    silent_voters,
    unexcused,
)

A, B, C, D = b"\xaa" * 4, b"\xbb" * 4, b"\xcc" * 4, b"\xdd" * 4
CP = b"\x01" * 4


def waiting(*voters: str, ids: tuple[bytes, ...] = (A,), cid: bytes = CP
            ) -> tuple[WaitingCheckpoint, ...]:
    return (WaitingCheckpoint(checkpoint=cid, waiting_on=tuple(NodeId(v) for v in voters),
                              tx_ids=ids),)


def test_only_what_waits_for_a_silent_voter_or_on_it_is_excused() -> None:
    """A waits in a checkpoint for the silent liar n4, B is endorsed on condition of A, C on
    condition of B (transitively excused), D waits for n2, which is up and voted: judged;
    E is endorsed on condition of X, which n1 holds nothing of, in the checkpoint with A."""
    E, X = b"\xee" * 4, b"\x99" * 4
    report = StuckReport(txs=(
        StuckTx(tx_id=A, deadline_ms=10, checkpoints=waiting("n4")),
        StuckTx(tx_id=C, deadline_ms=12, conditions=(B,)),
        StuckTx(tx_id=B, deadline_ms=11, conditions=(A,)),
        StuckTx(tx_id=D, deadline_ms=13, checkpoints=waiting("n2", ids=(D,))),
        StuckTx(tx_id=E, deadline_ms=14, conditions=(X,)),
    ), undecided=(*waiting("n4", ids=(A, X)), *waiting("n2", ids=(D,), cid=b"\x02" * 4)))
    silent = silent_voters(honest=("n1", "n2", "n3"), reporting={"n1": 0, "n2": 0, "n3": 0},
                           liars={"n4": ("silent",)}, liars_up={"n4": True},
                           unanimous_drop=True)
    assert list(silent) == ["n4"]
    excused = excuse({"n1": report}, silent)
    assert list(excused) == [A, B, E, C]
    assert "the liar n4 (silent)" in excused[A]
    assert "\"Limits\" 1" in excused[A]
    assert "condition of aaaaaa" in excused[B]
    assert "condition of 999999" in excused[E]
    assert "waiting for the liar n4" in excused[E]
    assert "condition of bbbbbb" in excused[C]
    assert unexcused({"n1": report}, excused) == {"n1": (1, 13)}


def test_an_abstainer_excuses_only_its_own_checkpoints() -> None:
    """n3 has not voted in CP (it abstains): A, waiting there for n3, is excused; B waits
    for n3 in another checkpoint n3 voted in: judged."""
    other = waiting("n3", ids=(B,), cid=b"\x02" * 4)
    reports = {
        "n1": StuckReport(txs=(StuckTx(tx_id=A, deadline_ms=1), StuckTx(tx_id=B, deadline_ms=2)),
                          undecided=(*waiting("n3"), *other)),
        "n3": StuckReport(unvoted=(CP,)),
    }
    excused = excuse(reports, {})
    assert list(excused) == [A]
    assert "n3, which abstains" in excused[A]
    assert "Forgotten commits" in excused[A]


def test_down_voters_and_pbft_liars() -> None:
    """An honest node not reporting is silent; in the pbft mode (no unanimous DROP) a
    withholding liar is not, nor a liar with no withholding behaviour in the veto mode."""
    def silent(unanimous_drop: bool) -> list[str]:
        return sorted(silent_voters(
            honest=("n1", "n2", "n3"), reporting={"n1": 0, "n2": 0},
            liars={"n4": ("forge_veto",), "n5": ("equivocate",)},
            liars_up={"n4": True, "n5": True}, unanimous_drop=unanimous_drop))

    assert silent(True) == ["n3", "n4"]
    assert silent(False) == ["n3"]


def test_opposite_decisions_are_reported_unless_excused() -> None:
    decided = {"n1": {A: True, B: False, C: True}, "n2": {A: False, B: False},
               "n3": {C: False}}
    problems = disagreements(decided, {}, lambda t: t[:1].hex())
    assert problems == ["n1 committed aa, n2 dropped it", "n1 committed cc, n3 dropped it"]
    assert disagreements(decided, {A: "x", C: "y"}, lambda t: t[:1].hex()) == []
