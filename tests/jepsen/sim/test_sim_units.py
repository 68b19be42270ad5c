"""Unit tests of the simulator's pure parts: event loop, trace, network model, fault schedules,
invariant checker."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.consensus.types import ClientRequest, Entry, EntryKind, Message
from phalanx.jepsen import nemesis
from phalanx.jepsen.sim.invariants import InvariantChecker, LogMirror
from phalanx.jepsen.sim.loop import HORIZON_NS, EventLoop, Trace
from phalanx.jepsen.sim.network import NetworkConfig, SimNetwork


def test_loop_orders_by_time_then_schedule_order() -> None:
    loop = EventLoop()
    seen: list[str] = []
    loop.call_at(5, lambda: seen.append("b"))
    loop.call_at(3, lambda: seen.append("a"))
    loop.call_at(5, lambda: seen.append("c"))
    loop.call_at(9, lambda: seen.append("late"))
    loop.run_until(5)
    assert seen == ["a", "b", "c"]
    assert loop.now == 5
    with pytest.raises(ValueError, match="before now"):
        loop.call_at(4, lambda: None)
    loop.run_until(100)
    assert seen[-1] == "late"
    assert loop.now == 100


# A scheduled event: (delay, the delays of the events it schedules when it runs).
_delays = st.one_of(
    st.integers(0, 3),
    st.integers(0, 3 * HORIZON_NS),
    st.sampled_from([HORIZON_NS - 1, HORIZON_NS, HORIZON_NS + 1, 2 * HORIZON_NS]),
)
_plans = st.lists(st.tuples(_delays, st.lists(_delays, max_size=3)), min_size=1, max_size=40)


@settings(deadline=None, max_examples=150)
@given(plans=_plans, stops=st.lists(st.integers(0, 4 * HORIZON_NS), max_size=4))
def test_loop_runs_events_in_time_then_schedule_order(
    plans: list[tuple[int, list[int]]], stops: list[int]
) -> None:
    """The near/far split of the queue (the horizon) never changes the order: events run
    sorted by (time, scheduling order), including those scheduled while running, across
    `run_until` boundaries, exactly as one heap would run them."""
    loop = EventLoop()
    ran: list[tuple[int, int]] = []  # (time, schedule number) of each event run
    scheduled: list[tuple[int, int]] = []  # (time, schedule number) of each event scheduled

    def schedule(delay: int, children: list[int]) -> None:
        number = len(scheduled)
        scheduled.append((loop.now + delay, number))

        def run() -> None:
            ran.append((loop.now, number))
            for child in children:
                schedule(child, [])

        loop.call_later(delay, run)

    for delay, children in plans:
        schedule(delay, children)
    for stop in sorted(stops):
        loop.run_until(max(stop, loop.now))
        assert all(when <= loop.now for when, _ in ran)
    loop.run_until(10 * HORIZON_NS)
    assert loop.pending() == 0
    assert ran == sorted(scheduled)  # each exactly once, in (time, scheduling order)


def test_trace_hash_depends_on_content_and_time() -> None:
    def digest(times: list[int], texts: list[str]) -> str:
        loop = EventLoop()
        trace = Trace(loop, keep_all=True)
        for t, text in zip(times, texts, strict=True):
            loop.run_until(t)
            trace(text)
        return trace.hexdigest()

    base = digest([1, 2], ["x", "y"])
    assert base == digest([1, 2], ["x", "y"])
    assert base != digest([1, 3], ["x", "y"])
    assert base != digest([1, 2], ["x", "z"])


class Ping(Message):
    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        self.n = n

    def __str__(self) -> str:
        return f"Ping {self.n}"


Got = list[tuple[str, str, int]]


def _network(seed: int, config: NetworkConfig) -> tuple[EventLoop, SimNetwork, Got]:
    loop = EventLoop()
    got: list[tuple[str, str, int]] = []

    def deliver(src: str, dst: str, m: Message) -> None:
        assert isinstance(m, Ping)
        got.append((src, dst, m.n))

    net = SimNetwork(loop, random.Random(seed), Trace(loop), deliver, config=config)
    return loop, net, got


def test_network_delivers_reorders_and_respects_directed_cuts() -> None:
    loop, net, got = _network(1, NetworkConfig())
    for i in range(200):
        net.send("a", "b", Ping(i))
    net.block([("b", "a")])
    net.send("b", "a", Ping(999))
    loop.run_until(10**10)
    assert sorted(n for _, _, n in got) == list(range(200))
    assert [n for _, _, n in got] != list(range(200)), "jittered latency must reorder"
    assert net.stats.dropped_partition == 1
    net.heal()
    net.send("b", "a", Ping(7))
    loop.run_until(2 * 10**10)
    assert got[-1] == ("b", "a", 7)


def test_network_cut_drops_messages_in_flight() -> None:
    loop, net, got = _network(2, NetworkConfig())
    net.send("a", "b", Ping(1))
    net.block([("a", "b")])
    loop.run_until(10**10)
    assert got == []


def test_network_loss_and_duplication_rates() -> None:
    loop, net, got = _network(3, NetworkConfig(loss=0.3, duplicate=0.2))
    for i in range(2000):
        net.send("a", "b", Ping(i))
    loop.run_until(10**11)
    assert 500 < net.stats.dropped_loss < 700
    assert net.stats.duplicated > 200
    assert len(got) == 2000 - net.stats.dropped_loss + net.stats.duplicated


def test_network_is_deterministic_per_seed() -> None:
    def run(seed: int) -> list[tuple[str, str, int]]:
        loop, net, got = _network(seed, NetworkConfig(loss=0.1, duplicate=0.1))
        for i in range(300):
            net.send("a", "b", Ping(i))
        loop.run_until(10**10)
        return got

    assert run(5) == run(5)
    assert run(5) != run(6)


# -- nemesis ----------------------------------------------------------------------------------

NODES = ("n1", "n2", "n3", "n4", "n5")


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32), kinds=st.sets(st.sampled_from(nemesis.FAULT_KINDS), min_size=1))
def test_schedules_pair_starts_with_stops_and_spare_a_majority(seed: int, kinds: set[str]) -> None:
    faults = tuple(k for k in nemesis.FAULT_KINDS if k in kinds)
    duration = 5_000_000_000
    sched = nemesis.generate_schedule(
        random.Random(seed), nodes=NODES, faults=faults, duration_ns=duration
    )
    assert sched == nemesis.generate_schedule(
        random.Random(seed), nodes=NODES, faults=faults, duration_ns=duration
    )
    assert nemesis.schedule_from_json(nemesis.schedule_to_json(sched)) == sched
    open_: dict[int, nemesis.FaultEvent] = {}
    down: dict[int, tuple[str, ...]] = {}
    last = 0
    for e in sched:
        assert e.at_ns >= last
        last = e.at_ns
        assert e.at_ns < duration
        assert e.fault in faults or (e.fault == "kill" and "lose-unfsynced" in faults)
        if e.action == "start":
            open_[e.episode] = e
            if e.fault in ("kill", "pause"):
                down[e.episode] = e.nodes
            assert sum(len(d) for d in down.values()) <= 2
            assert len(open_) <= 2
        else:
            assert open_.pop(e.episode).fault == e.fault
            down.pop(e.episode, None)
    assert not open_


def test_parse_faults() -> None:
    assert nemesis.parse_faults("all") == nemesis.FAULT_KINDS
    assert nemesis.parse_faults("none") == ()
    assert nemesis.parse_faults("loss,kill") == ("kill", "loss")
    with pytest.raises(nemesis.ScheduleError, match="bogus"):
        nemesis.parse_faults("kill,bogus")


def test_fault_event_rejects_bad_json() -> None:
    with pytest.raises(nemesis.ScheduleError):
        nemesis.schedule_from_json('[{"at_ns": 1, "action": "explode", "fault": "kill"}]')
    with pytest.raises(nemesis.ScheduleError):
        nemesis.schedule_from_json('{"not": "a list"}')


# -- invariants -------------------------------------------------------------------------------


def _cmd(index: int, term: int, tag: str = "c") -> Entry:
    req = ClientRequest(client_id=tag, request_no=index, command=b"x")
    return Entry(index=index, term=term, kind=EntryKind.COMMAND, requests=(req,))


def test_election_safety_flags_two_leaders_in_a_term() -> None:
    chk = InvariantChecker()
    chk.observe_role("n1", role="leader", term=2, log=None, at_ns=1)
    chk.observe_role("n1", role="leader", term=2, log=None, at_ns=2)
    chk.observe_role("n2", role="follower", term=2, log=None, at_ns=3)
    assert chk.ok
    chk.observe_role("n2", role="leader", term=2, log=None, at_ns=4)
    assert [v.invariant for v in chk.violations] == ["election-safety"]


def test_state_machine_safety_and_leader_completeness() -> None:
    chk = InvariantChecker()
    chk.observe_apply("n1", _cmd(1, 1), 0)
    chk.observe_apply("n2", _cmd(1, 1), 0)
    assert chk.ok
    complete = LogMirror(entries=[_cmd(1, 1), _cmd(2, 2)])
    chk.observe_role("n3", role="leader", term=3, log=complete, at_ns=5)
    assert chk.ok
    snapshotted = LogMirror(snapshot_index=1, snapshot_term=1)
    chk.observe_role("n2", role="leader", term=4, log=snapshotted, at_ns=6)
    assert chk.ok
    chk.observe_role("n4", role="leader", term=5, log=LogMirror(entries=[_cmd(1, 5, "z")]), at_ns=7)
    assert [v.invariant for v in chk.violations] == ["leader-completeness"]
    chk.observe_apply("n3", _cmd(1, 2), 8)
    assert [v.invariant for v in chk.violations][-1] == "state-machine-safety"


def test_log_matching() -> None:
    chk = InvariantChecker()
    a = LogMirror(entries=[_cmd(1, 1), _cmd(2, 1), _cmd(3, 2)])
    b = LogMirror(entries=[_cmd(1, 1), _cmd(2, 1), _cmd(3, 3)])  # diverges at the tail: fine
    chk.check_log_matching({"a": a, "b": b}, 0)
    assert chk.ok
    c = LogMirror(entries=[_cmd(1, 1), _cmd(2, 1, "other"), _cmd(3, 2)])
    chk.check_log_matching({"a": a, "c": c}, 0)
    assert [v.invariant for v in chk.violations] == ["log-matching"]


def test_monotone_commit_allows_lower_after_restart_only() -> None:
    chk = InvariantChecker()
    chk.observe_commit("n1", incarnation=0, commit=5, at_ns=0)
    chk.observe_commit("n1", incarnation=1, commit=2, at_ns=1)
    assert chk.ok
    chk.observe_commit("n1", incarnation=1, commit=1, at_ns=2)
    assert [v.invariant for v in chk.violations] == ["monotone-commit"]


def test_log_mirror_truncate_and_snapshot() -> None:
    log = LogMirror(entries=[_cmd(1, 1), _cmd(2, 1), _cmd(3, 1)])
    log.truncate_from(2)
    assert log.last_index() == 1
    with pytest.raises(ValueError, match="expected 2"):
        log.append([_cmd(3, 1)])
    log.install_snapshot(10, 4)
    assert log.last_index() == 10
    assert log.get(10) is None
    log.append([_cmd(11, 4)])
    assert log.get(11) == _cmd(11, 4)


def test_run_until_stops_after_the_event_that_exhausts_a_budget() -> None:
    loop = EventLoop()
    seen: list[int] = []
    for t in range(1, 11):
        loop.call_at(t, lambda t=t: seen.append(t))  # type: ignore[misc]
    loop.event_budget = 3
    loop.run_until(100)
    assert seen == [1, 2, 3, 4]  # stops once events_run (4) exceeds the budget
    assert loop.now == 4  # the time of the last event run, not `until`
    loop.event_budget = 1 << 62
    loop.call_at(6, lambda: setattr(loop, "halted", True))
    loop.run_until(100)
    assert seen == [1, 2, 3, 4, 5, 6]  # halted by the callback at t=6 (scheduled after 6's)
    assert loop.now == 6


def test_network_byte_budget_halts_the_loop() -> None:
    loop = EventLoop()
    net = SimNetwork(loop, random.Random(0), Trace(loop), lambda s, d, m: None,
                     encode=lambda m: b"x" * 10, decode=lambda b: Ping(0))
    net.byte_budget = 25
    net.send("a", "b", Ping(1))
    net.send("a", "b", Ping(2))
    assert not loop.halted
    net.send("a", "b", Ping(3))
    assert loop.halted


def test_network_routes_and_watches() -> None:
    loop = EventLoop()
    fallback: list[tuple[str, str]] = []
    routed: list[tuple[str, int]] = []
    watched: list[int] = []

    def watch(src: str, dst: str, m: Message) -> None:
        assert isinstance(m, Ping)
        watched.append(m.n)

    def receive(src: str, m: Message) -> None:
        assert isinstance(m, Ping)
        routed.append((src, m.n))

    net = SimNetwork(loop, random.Random(3), Trace(loop), lambda s, d, m: fallback.append((s, d)),
                     watch=watch, watch_types=frozenset({Ping}))
    net.route("b", receive)
    net.block([("a", "c")])
    net.send("a", "b", Ping(1))
    net.send("a", "c", Ping(2))  # cut, but watched before any fault applies
    net.send("c", "d", Ping(3))
    loop.run_until(10**10)
    assert routed == [("a", 1)]
    assert fallback == [("c", "d")]
    assert watched == [1, 2, 3]
    other = SimNetwork(loop, random.Random(3), Trace(loop), lambda s, d, m: None,
                       watch=watch, watch_types=frozenset({int}))
    other.send("a", "b", Ping(4))
    assert watched == [1, 2, 3], "a class outside watch_types is not watched"


@pytest.mark.parametrize("memo", [0, 1, 3])
def test_network_decode_memo_reuses_decoded_messages_by_bytes(memo: int) -> None:
    loop = EventLoop()
    decoded: list[bytes] = []
    got: list[tuple[int, Message]] = []

    def decode(data: bytes) -> Message:
        decoded.append(data)
        return Ping(int(data))

    net = SimNetwork(loop, random.Random(4), Trace(loop),
                     lambda s, d, m: got.append((m.n, m)),  # type: ignore[attr-defined]
                     encode=lambda m: str(m.n).encode(),  # type: ignore[attr-defined]
                     decode=decode, decode_memo=memo)
    for n in (1, 1, 2, 1, 3, 4, 1):
        net.send("a", "b", Ping(n))
        loop.run_until(loop.now + 10**9)  # one at a time: arrival order = send order
    assert [n for n, _ in got] == [1, 1, 2, 1, 3, 4, 1]
    if memo == 0:
        assert decoded == [b"1", b"1", b"2", b"1", b"3", b"4", b"1"]
    elif memo == 1:  # cleared whenever a second distinct frame arrives
        assert decoded == [b"1", b"2", b"1", b"3", b"4", b"1"]
        assert got[0][1] is got[1][1]
    else:
        assert decoded == [b"1", b"2", b"3", b"4", b"1"]  # the 4th distinct frame cleared it
        assert got[0][1] is got[1][1] is got[3][1]
    with pytest.raises(ValueError, match="decode_memo"):
        SimNetwork(loop, random.Random(4), Trace(loop), lambda s, d, m: None, decode_memo=-1)


def test_a_frame_sent_to_several_peers_is_decoded_once_whatever_arrives_between() -> None:
    """A broadcast's copies (and equal frames other nodes send to several peers, as a
    gossip wave's leaf calls) are decoded once, to one object, even when one-off frames
    arriving between them flush the general memo (at n = 180, one batch's MAC'd commits
    did so every few ms; this memo holds 1 entry)."""
    loop = EventLoop()
    decoded: list[bytes] = []
    got: dict[str, list[Message]] = {}

    def decode(data: bytes) -> Message:
        decoded.append(data)
        return Ping(int(data))

    net = SimNetwork(loop, random.Random(4), Trace(loop),
                     lambda s, d, m: got.setdefault(d, []).append(m),
                     encode=lambda m: str(m.n).encode(),  # type: ignore[attr-defined]
                     decode=decode, decode_memo=1)
    shared, again = Ping(7), Ping(7)  # two senders' equal frames
    for dst in ("b", "c", "d", "e"):
        net.send("a", dst, shared)
    for i in range(20):  # one-off frames, in flight with the copies (random latencies)
        net.send("x", "y", Ping(100 + i))
    for dst in ("f", "g"):
        net.send("z", dst, again)
    loop.run_until(loop.now + 10**10)
    assert decoded.count(b"7") == 1
    copies = [got[d][0] for d in "bcdefg"]
    assert all(c is copies[0] for c in copies)
    assert len(decoded) == 21 == net.decoded
    net.send("a", "b", Ping(8))  # a frame sent once only: not kept there
    assert b"8" not in net._shared


def test_the_shared_frame_memo_is_bounded() -> None:
    loop = EventLoop()
    net = SimNetwork(loop, random.Random(4), Trace(loop), lambda s, d, m: None,
                     encode=lambda m: str(m.n).encode(),  # type: ignore[attr-defined]
                     decode=lambda data: Ping(int(data)), decode_memo=2)
    for i in range(50):
        frame = Ping(i)
        net.send("a", "b", frame)
        net.send("a", "c", frame)
    loop.run_until(loop.now + 10**10)
    assert list(net._shared) == [str(i).encode() for i in range(42, 50)]  # 4 x 2, newest


def test_run_raises_the_young_gc_threshold_only_while_it_runs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import gc

    from phalanx.jepsen.sim import run as run_module

    seen: list[tuple[int, int, int]] = []
    monkeypatch.setattr(run_module, "_run", lambda cfg: seen.append(gc.get_threshold()))
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 9, 8)
        run_module.run(run_module.RunConfig(seed=1))
        assert seen == [(run_module.GC_THRESHOLD0, 9, 8)]
        assert gc.get_threshold() == (700, 9, 8)
        gc.set_threshold(0, 9, 8)  # automatic collection off: left off
        run_module.run(run_module.RunConfig(seed=1))
        assert seen[-1] == (0, 9, 8)
        gc.set_threshold(50_000, 9, 8)  # already higher: left alone
        run_module.run(run_module.RunConfig(seed=1))
        assert seen[-1] == (50_000, 9, 8)
    finally:
        gc.set_threshold(*before)
