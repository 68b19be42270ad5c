"""Real-cluster schedules (`phalanx.jepsen.harness.schedule`) and storage faults
(`phalanx.jepsen.harness.storage_faults`) against the real WAL and checkpoint recovery."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.jepsen import nemesis
from phalanx.jepsen.harness import schedule as real
from phalanx.jepsen.harness.storage_faults import flip_checkpoint_bit, tear_wal_tail
from phalanx.jepsen.nemesis import FaultEvent
from phalanx.storage.files import open_file_storage
from phalanx.storage.interface import StoredCheckpoint

NODES = ("n1", "n2", "n3", "n4", "n5")


@dataclass(frozen=True)
class Opts:
    seed: int
    faults: tuple[str, ...]
    time_s: float = 60.0
    nemesis_scale: float = 4.0


def test_shared_faults_give_exactly_the_simulator_schedule() -> None:
    faults = ("kill", "pause", "partition-one")
    got = real.real_schedule(Opts(seed=7, faults=faults), NODES)
    want = nemesis.generate_schedule(random.Random(7), nodes=NODES, faults=faults,
                                     duration_ns=int(60 / 4 * 1e9))
    assert got == want
    assert got


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32), kinds=st.lists(st.sampled_from(real.REAL_FAULT_KINDS),
                                                   min_size=1, unique=True))
def test_every_episode_starts_then_stops_and_real_only_kinds_are_well_formed(
    seed: int, kinds: list[str]
) -> None:
    events = real.real_schedule(Opts(seed=seed, faults=tuple(kinds)), NODES)
    open_: dict[int, object] = {}
    for e in events:
        if e.action == "start":
            assert e.episode not in open_
            open_[e.episode] = e
        else:
            assert open_.pop(e.episode).fault == e.fault  # type: ignore[attr-defined]
        assert e.at_ns < 15 * 10**9
        if e.fault == nemesis.KILL_MAJORITY:
            assert len(e.nodes) == 3
        if e.fault == nemesis.KILL_ALL:
            assert e.nodes == NODES
        if e.fault in (nemesis.TRUNCATE_WAL, nemesis.FLIP_CHECKPOINT):
            assert len(e.nodes) == 1
        if e.fault == nemesis.PARTITION_BRIDGE:
            left, right = e.groups
            assert len(set(left) & set(right)) == 1
            assert set(left) | set(right) == set(NODES)
        if e.fault in nemesis.REAL_ONLY_FAULT_KINDS:
            assert e.episode >= real.REAL_EPISODE_BASE
            assert e.describe().startswith(f"{e.action} {e.fault}#{e.episode}")
    assert not open_
    assert [e.at_ns for e in events] == sorted(e.at_ns for e in events)
    assert {e.fault for e in events} <= set(kinds) | {nemesis.KILL}


def test_bridge_cuts_only_links_between_the_two_sides() -> None:
    event = FaultEvent(at_ns=0, action="start", fault=nemesis.PARTITION_BRIDGE,
                              episode=real.REAL_EPISODE_BASE,
                              groups=(("n1", "n2", "n3"), ("n3", "n4", "n5")))
    cuts = set(real.bridge_cuts(event, NODES))
    assert ("n1", "n4") in cuts
    assert ("n5", "n2") in cuts
    assert not any("n3" in link for link in cuts)
    assert ("n1", "n2") not in cuts
    assert ("n4", "n5") not in cuts
    assert len(cuts) == 2 * 2 * 2


def _storage_with_entries(path: Path, n: int) -> None:
    st_ = open_file_storage(str(path))
    st_.wal.append_many([(i, b"x" * i) for i in range(1, n + 1)])
    st_.wal.sync()
    st_.close()


def test_a_torn_wal_tail_is_cut_off_and_every_complete_record_survives(tmp_path: Path) -> None:
    _storage_with_entries(tmp_path, 20)
    note = tear_wal_tail(tmp_path, random.Random(1))
    assert note.startswith("tore wal-")
    again = open_file_storage(str(tmp_path))
    assert again.wal.last_index() == 20
    again.close()


def test_a_flipped_checkpoint_bit_is_reported_and_the_older_one_used(tmp_path: Path) -> None:
    st_ = open_file_storage(str(tmp_path), keep_checkpoints=2)
    for index in (10, 20):
        st_.checkpoints.save(StoredCheckpoint(index=index, data=b"state" * 50))
    st_.close()
    note = flip_checkpoint_bit(tmp_path, random.Random(2))
    assert "checkpoint-00000000000000000020.ckpt" in note
    again = open_file_storage(str(tmp_path), keep_checkpoints=2)
    loaded = again.checkpoints.load_latest()
    again.close()
    assert loaded.checkpoint is not None
    assert loaded.checkpoint.index == 10
    assert loaded.problems


def test_storage_faults_on_an_empty_directory_do_nothing(tmp_path: Path) -> None:
    assert tear_wal_tail(tmp_path, random.Random(0)) == "no WAL segment to tear"
    assert flip_checkpoint_bit(tmp_path, random.Random(0)) == "no checkpoint to flip"


def test_run_warns_when_no_fault_was_injected() -> None:
    """A "valid" run with faults asked for but none injected says so (issue 22)."""
    from phalanx.jepsen.harness.cli import no_fault_warning

    warning = no_fault_warning(("kill",), 0, 5.0)
    assert warning is not None
    assert "injected no fault in 5 s (kill)" in warning
    assert "--time" in warning
    assert no_fault_warning(("kill",), 2, 5.0) is None  # faults happened
    assert no_fault_warning((), 0, 5.0) is None  # --nemesis none: nothing was asked for


def test_an_unavailable_cluster_is_found_inside_trio_groups() -> None:
    """`jepsen run` exits 4 ("unknown"), not 70, when the cluster never came up: the error
    arrives wrapped in the cluster nursery's exception group."""
    from phalanx.jepsen.harness.cli import _unavailable
    from phalanx.jepsen.harness.cluster import ClusterUnavailable

    inner = ClusterUnavailable("no leader within 30 s")
    nested = BaseExceptionGroup("outer", [ExceptionGroup("inner", [inner])])
    assert _unavailable(nested, ClusterUnavailable) is inner
    assert _unavailable(inner, ClusterUnavailable) is inner
    mixed = ExceptionGroup("mixed", [inner, ValueError("a bug")])
    assert _unavailable(mixed, ClusterUnavailable) is None  # a bug is re-raised, not hidden
