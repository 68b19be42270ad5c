"""Recovery-time objective (`phalanx.apps.recovery_target`, `[checkpoint] recovery_target`):
the interval follows the target and the measured rates, a write burst triggers checkpoints
that keep load plus replay under the target (a deliberately broken rule is caught), and the
config key's errors."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from phalanx.apps import kv_wire
from phalanx.apps.kv import KvStateMachine
from phalanx.apps.kv_types import Put
from phalanx.apps.recovery_target import (
    APPLY_TO_REPLAY,
    DEFAULT_REPLAY_RATE,
    MAX_INTERVAL_BYTES,
    MIN_INTERVAL_BYTES,
    SAMPLE_BYTES,
    RecoveryTarget,
)
from phalanx.apps.replica import TIMED_EVERY, CheckpointPolicy, Replica
from phalanx.consensus.types import ClientRequest, Configuration, Entry, EntryKind, NodeId
from phalanx.net import wire
from phalanx.ops.config_toml import node_config_dict
from phalanx.ops.node_config import CheckpointConfig, ConfigError, load_node_config
from phalanx.runtime.recovery_policy import recovery_target as node_recovery_target
from phalanx.storage.memory import MemoryDisk

CONFIG = Configuration(voters=(NodeId("n1"),))


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class TimedKv(KvStateMachine):
    """The KV store on a fake clock: applying costs len(command)/replay_rate seconds and
    restoring len(data)/load_rate, the machine's "true" speeds the target must learn."""

    def __init__(self, clock: FakeClock, *, replay_rate: float, load_rate: float) -> None:
        super().__init__()
        self.clock, self.replay_rate, self.load_rate = clock, replay_rate, load_rate

    def apply(self, command: bytes) -> bytes:
        self.clock.now += len(command) / self.replay_rate
        return super().apply(command)

    def restore(self, data: bytes) -> None:
        self.clock.now += len(data) / self.load_rate
        super().restore(data)


def entry(index: int, value_bytes: int) -> Entry:
    cmd = kv_wire.encode_command(Put(key=f"k{index % 97}", value=b"x" * value_bytes))
    return Entry(index=index, term=1, kind=EntryKind.COMMAND,
                 requests=(ClientRequest(client_id="c", request_no=index, command=cmd),))


def open_replica(disk: MemoryDisk, clock: FakeClock, target: RecoveryTarget | None, *,
                 replay_rate: float, load_rate: float) -> Replica:
    storage = disk.open()
    return Replica(TimedKv(clock, replay_rate=replay_rate, load_rate=load_rate),
                   checkpoints=storage.checkpoints, wal=storage.wal,
                   decode_entry=lambda b: wire.decode(b, expected=Entry),
                   policy=CheckpointPolicy(every_entries=0, every_bytes=0),
                   config=CONFIG, recovery=target)


# ------------------------------------------------------------------------ the interval rule


def test_the_interval_follows_the_target_and_the_rates() -> None:
    clock = FakeClock()
    t = RecoveryTarget(2.0, clock=clock, load_rate=50e6, replay_rate=10e6)
    assert t.interval_bytes == 10_000_000  # nothing to load yet: 10 MB/s * 2 s / 2
    t.note_checkpoint(50_000_000)  # loading it takes 1 s: 1 s left, half of it replays
    assert t.interval_bytes == 5_000_000
    est = t.estimate()
    assert est.feasible
    assert est.load_seconds == pytest.approx(1.0)
    assert est.worst_seconds == pytest.approx(2.0)
    assert RecoveryTarget(4.0, clock=clock, load_rate=50e6, replay_rate=10e6).interval_bytes \
        == 20_000_000  # a target twice as long: twice the interval (rarer checkpoints)
    t.note_checkpoint(10**12)  # loading alone exceeds the target: the floor, flagged
    assert t.interval_bytes == MIN_INTERVAL_BYTES
    assert not t.estimate().feasible
    fast = RecoveryTarget(60.0, clock=clock, replay_rate=1e9)
    assert fast.interval_bytes == MAX_INTERVAL_BYTES  # the memory bound


def test_bytes_applied_during_a_write_come_off_the_interval() -> None:
    t = RecoveryTarget(2.0, clock=FakeClock(), load_rate=50e6, replay_rate=10e6)
    t.note_checkpoint(50_000_000)  # 1 s of replay budget: 10 MB
    t.note_written(1_000_000)  # a write lets 1 MB arrive: the interval is the rest
    assert t.interval_bytes == 9_000_000
    assert t.estimate().worst_seconds == pytest.approx(2.0)
    slow = RecoveryTarget(2.0, clock=FakeClock(), load_rate=50e6, replay_rate=10e6)
    slow.note_checkpoint(50_000_000)
    slow.note_written(6_000_000)  # writes outlast an interval: the next waits, tail 2 x 6 MB
    assert not slow.estimate().feasible
    assert slow.estimate().worst_seconds > 2.0


def test_measured_rates_replace_the_defaults_and_move_the_interval() -> None:
    t = RecoveryTarget(1.0, clock=FakeClock(), min_bytes=1)
    assert t.estimate().replay_rate == DEFAULT_REPLAY_RATE
    t.note_apply(SAMPLE_BYTES // 2, 0.1, replay=True)  # below a sample: no change yet
    assert t.replay_samples == 0
    t.note_apply(SAMPLE_BYTES // 2, 0.1, replay=True)  # 256 KiB replayed in 0.2 s: the
    assert t.estimate().replay_rate == pytest.approx(SAMPLE_BYTES / 0.2)  # first replaces
    assert t.interval_bytes == int(SAMPLE_BYTES / 0.2 * 0.5)
    for _ in range(40):  # the machine got 10x faster: the average follows
        t.note_apply(SAMPLE_BYTES, 0.02, replay=True)
    assert t.estimate().replay_rate == pytest.approx(SAMPLE_BYTES / 0.02, rel=0.01)
    live = RecoveryTarget(1.0, clock=FakeClock())
    live.note_apply(SAMPLE_BYTES, 0.02)  # a live apply leaves out the WAL read and decode
    assert live.estimate().replay_rate == pytest.approx(SAMPLE_BYTES / 0.02 * APPLY_TO_REPLAY)
    t.note_load(100_000_000, 0.5)
    assert t.estimate().load_rate == pytest.approx(200e6)
    assert t.estimate().load_seconds == pytest.approx(0.5)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_a_bad_target_is_our_callers_error(bad: float) -> None:
    with pytest.raises(ValueError, match="recovery target must be a positive"):
        RecoveryTarget(bad, clock=FakeClock())


def test_an_aligned_policy_refuses_a_target() -> None:
    storage = MemoryDisk("n1").open()
    with pytest.raises(ValueError, match="fixed sequence numbers"):
        Replica(KvStateMachine(), checkpoints=storage.checkpoints,
                policy=CheckpointPolicy(every_entries=64, every_bytes=0, aligned=True),
                recovery=RecoveryTarget(2.0, clock=FakeClock()))


# ------------------------------------------------------------------------ a write burst


def burst_worst(make_target: Callable[[FakeClock], RecoveryTarget] | None, *,
                replay_rate: float, load_rate: float, value_bytes: int, entries: int,
                seed: int) -> tuple[float, float, int]:
    """Apply a burst of `entries` writes; return (the worst load + replay a restart would
    have taken at any point, by the machine's true speeds; the time a real restart after the
    burst took, on the fake clock; checkpoints written)."""
    clock, disk = FakeClock(), MemoryDisk("n1")
    target = make_target(clock) if make_target is not None else None
    replica = open_replica(disk, clock, target, replay_rate=replay_rate, load_rate=load_rate)
    wal = replica._wal
    assert wal is not None
    ckpt_bytes = since = 0
    worst = 0.0
    for index in range(1, entries + 1):
        e = entry(index, value_bytes)
        wal.append(index, wire.encode(e))
        wal.sync()
        replica.apply(e)
        since += len(e.requests[0].command)
        for taken in replica.poll():
            ckpt_bytes, since = len(taken.data), 0  # durable at once (inline writer)
        worst = max(worst, ckpt_bytes / load_rate + since / replay_rate)
    written = replica.status().checkpoints_written
    disk.crash(random.Random(seed))
    clock2 = FakeClock()
    again = open_replica(disk, clock2, RecoveryTarget(1.0, clock=clock2),
                         replay_rate=replay_rate, load_rate=load_rate)
    report = again.restore_latest()
    assert report.applied_index == entries  # nothing synced was lost
    measured = again.recovery
    assert measured is not None
    assert measured.load_samples == (1 if written else 0)
    if written:  # the restart measured the load rate (the envelope is a few % of it)
        assert measured.estimate().load_rate == pytest.approx(load_rate, rel=0.1)
    return worst, clock2.now, written


SMALL = 1024
"""The interval's floor in these tests: their fake machines replay KB/s, not MB/s."""
CMD_BYTES = {v: len(entry(1, v).requests[0].command) for v in (500, 1000, 2000, 4000)}


def burst_case(target: float, k: int, value_bytes: int, load_share: float,
               ) -> tuple[dict[str, float | int], float]:
    """A burst on a machine whose true replay rate allows `k` entries per interval with
    nothing to load, and whose ~97-key state loads in `load_share` of the target; the target
    starts from half the true replay rate (the defaults err low: module docstring)."""
    cmd = CMD_BYTES[value_bytes]
    replay_rate = k * cmd * 2 / target
    load_rate = 97 * value_bytes / (load_share * target)
    params: dict[str, float | int] = dict(
        replay_rate=replay_rate, load_rate=load_rate, value_bytes=value_bytes,
        entries=max(6 * k, 2 * TIMED_EVERY * SAMPLE_BYTES // cmd), seed=k)
    return params, replay_rate / 2


@settings(max_examples=12, deadline=None, phases=(Phase.explicit, Phase.generate))
@given(target=st.floats(0.3, 2.0), k=st.integers(10, 60),
       value_bytes=st.sampled_from(sorted(CMD_BYTES)), load_share=st.floats(0.05, 0.6))
def test_a_write_burst_triggers_checkpoints_that_hold_the_target(
        target: float, k: int, value_bytes: int, load_share: float) -> None:
    params, start_rate = burst_case(target, k, value_bytes, load_share)
    made: list[RecoveryTarget] = []

    def make(clock: FakeClock) -> RecoveryTarget:
        made.append(RecoveryTarget(target, clock=clock, load_rate=params["load_rate"],
                                   replay_rate=start_rate, min_bytes=SMALL))
        return made[-1]

    replay = (f"replay: burst_case({target!r}, {k}, {value_bytes}, {load_share!r}) "
              "then burst_worst")
    worst, restart, written = burst_worst(make, **params)  # type: ignore[arg-type]
    assert written >= 1, replay
    assert made[0].replay_samples >= 1, replay
    assert made[0].estimate().feasible, replay
    assert worst <= target, replay
    assert restart <= target, replay


class IgnoresLoad(RecoveryTarget):
    """Deliberate bug: sizes the interval as if loading the checkpoint were free and one
    interval were the whole replay."""

    def _compute(self) -> int:
        return int(min(self._max, max(self._min, self.target_seconds * self._replay_rate)))


def test_the_burst_check_catches_a_rule_that_ignores_the_load() -> None:
    params, start_rate = burst_case(1.0, 30, 1000, 0.8)
    good, _, _ = burst_worst(lambda clock: RecoveryTarget(
        1.0, clock=clock, replay_rate=start_rate, load_rate=params["load_rate"],
        min_bytes=SMALL), **params)  # type: ignore[arg-type]
    bad, _, _ = burst_worst(lambda clock: IgnoresLoad(
        1.0, clock=clock, replay_rate=start_rate, load_rate=params["load_rate"],
        min_bytes=SMALL), **params)  # type: ignore[arg-type]
    assert good <= 1.0 < bad


def test_without_a_target_the_fixed_interval_lets_a_burst_run_past_it() -> None:
    # The control for the property above: the default 16 MiB trigger over the same burst.
    worst, restart, written = burst_worst(None, replay_rate=DEFAULT_REPLAY_RATE,
                                          load_rate=1e6, value_bytes=4000, entries=3000,
                                          seed=2)
    assert written == 0
    assert worst > 2.0
    assert restart > 2.0


# ------------------------------------------------------------------------ config


_MINIMAL = ("[node]\nid='n1'\nprotocol='raft'\ndata_dir='d'\npeer_listen='h:1'\n"
            "client_listen='h:2'\n[tls]\nca='a'\ncert='b'\nkey='c'\n")


@pytest.mark.parametrize(("text", "seconds"), [
    ("'2s'", 2.0), ("'500ms'", 0.5), ("'1.5m'", 90.0), ("' 3 s '", 3.0), ("'.25s'", 0.25)])
def test_recovery_target_reads_a_duration(tmp_path: Path, text: str, seconds: float) -> None:
    path = tmp_path / "n1.toml"
    path.write_text(_MINIMAL + f"[checkpoint]\nrecovery_target = {text}\n")
    config = load_node_config(path)
    assert config.checkpoint.recovery_target == pytest.approx(seconds)
    doc = node_config_dict(config, relative_to=tmp_path)
    checkpoint = doc["checkpoint"]
    assert isinstance(checkpoint, dict)
    path.write_text(_MINIMAL + f"[checkpoint]\nrecovery_target = "
                    f"'{checkpoint['recovery_target']}'\n")
    assert load_node_config(path).checkpoint == config.checkpoint  # round trip


@pytest.mark.parametrize("text", ["2", "'2'", "'0s'", "'-1s'", "'2 hours'", "'fast'",
                                  "'25h'", "true"])
def test_a_bad_recovery_target_is_a_one_line_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "n1.toml"
    path.write_text(_MINIMAL + f"[checkpoint]\nrecovery_target = {text}\n")
    with pytest.raises(ConfigError) as exc:
        load_node_config(path)
    message = str(exc.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: checkpoint.recovery_target: expected a duration like")


def test_checkpoint_config_checks_the_target_and_the_node_honours_it(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="recovery_target must be"):
        CheckpointConfig(recovery_target=0.0)
    assert CheckpointConfig().recovery_target is None
    path = tmp_path / "n1.toml"
    path.write_text(_MINIMAL + "[checkpoint]\nrecovery_target = '2s'\n")
    config = load_node_config(path)
    raft = CheckpointPolicy(every_entries=10, every_bytes=10)
    target = node_recovery_target(config, raft)
    assert target is not None
    assert target.target_seconds == 2.0
    aligned = CheckpointPolicy(every_entries=64, every_bytes=0, aligned=True)
    assert node_recovery_target(config, aligned) is None  # PBFT: fixed, certified points
