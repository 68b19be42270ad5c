"""The gossip checker (`phalanx.jepsen.gossip_checker`) on hand-made histories: each property
(delivered everywhere, not forged, once) fails exactly when broken, and the rules for
killed origins, restarted receivers and full logs hold."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from phalanx.jepsen.gossip_checker import (
    DELIVERIES,
    PUBLISH,
    FinalRead,
    check_gossip,
    final_reads,
    publish_ok_value,
)
from phalanx.jepsen.history import FAIL, INFO, OK, History, HistoryError, HistoryRecorder

TTL = 1000
Entry = tuple[str, int, int, str, int]


def _history(publishes: Sequence[tuple[str, str, str, tuple[str, int, int, int] | None]],
             finals: Mapping[str, FinalRead | None]) -> History:
    """`publishes`: (node, payload, outcome, ok value); `finals`: node -> read (None: fail)."""
    rec = HistoryRecorder()
    t = 0
    for i, (node, payload, outcome, ok) in enumerate(publishes):
        t += 1
        rec.invoke(process=i, f=PUBLISH, key=node, value=payload, time=t)
        value = publish_ok_value(*ok) if ok is not None else None
        rec.complete(process=i, type=outcome, time=t, value=value)  # type: ignore[arg-type]
    for j, (node, final) in enumerate(sorted(finals.items())):
        p = 1000 + j
        rec.invoke(process=p, f=DELIVERIES, key=node, time=t)
        if final is None:
            rec.complete(process=p, type=FAIL, time=t, value=None)
        else:
            rec.complete(process=p, type=OK, time=t, value=final.to_value())
    return rec.history()


def _read(entries: Sequence[Entry], *, incarnation: int = 1, started: int = 0,
          capacity: int = 100) -> FinalRead:
    return FinalRead(incarnation=incarnation, started_ms=started, capacity=capacity,
                     rumors=tuple(entries))


R1: Entry = ("n1", 1, 0, "a", 100)
R2: Entry = ("n2", 1, 0, "b", 200)
PUBS = [("n1", "a", OK, ("n1", 1, 0, 100)), ("n2", "b", OK, ("n2", 1, 0, 200))]


def _check(publishes: Sequence[tuple[str, str, str, tuple[str, int, int, int] | None]],
           finals: Mapping[str, FinalRead | None]) -> object:
    return check_gossip(_history(publishes, finals), rumor_ttl_ms=TTL).valid


def test_everything_everywhere_once_is_valid() -> None:
    finals = {n: _read([R1, R2]) for n in ("n1", "n2", "n3")}
    result = check_gossip(_history(PUBS, finals), rumor_ttl_ms=TTL)
    assert result.valid is True
    assert result.details["required"] == 2


def test_a_required_rumor_missing_at_one_node_is_caught() -> None:
    finals = {"n1": _read([R1, R2]), "n2": _read([R1, R2]), "n3": _read([R1])}
    result = check_gossip(_history(PUBS, finals), rumor_ttl_ms=TTL)
    assert result.valid is False
    assert result.details["missing"] == {"n3": 1}
    assert "n3 lacks 1 required rumor(s), e.g. n2/1/0" in result.details["problems"]


def test_a_node_down_at_the_end_is_not_checked() -> None:
    assert _check(PUBS, {"n1": _read([R1, R2]), "n2": _read([R1, R2]), "n3": None}) is True


def test_rumors_of_an_origin_killed_after_acknowledging_are_not_required() -> None:
    # n2 restarted (incarnation 2): its acknowledged rumor b died with its first process.
    finals = {"n1": _read([R1]), "n2": _read([R1], incarnation=2, started=150),
              "n3": _read([R1])}
    result = check_gossip(_history(PUBS, finals), rumor_ttl_ms=TTL)
    assert result.valid is True
    assert result.details["required"] == 1


def test_info_and_failed_publishes_are_never_required() -> None:
    pubs = [*PUBS, ("n3", "c", INFO, None), ("n3", "d", FAIL, None)]
    finals = {n: _read([R1, R2]) for n in ("n1", "n2", "n3")}
    assert _check(pubs, finals) is True


def test_a_restarted_node_owes_what_anti_entropy_still_holds() -> None:
    # n3's process started at 2000: R1 (100) and R2 (200) were published more than
    # ttl/2 = 500 before, so it does not owe them.
    late = {"n1": _read([R1, R2]), "n2": _read([R1, R2]),
            "n3": _read([], incarnation=5, started=2000)}
    assert _check(PUBS, late) is True
    # Started at 650: R2 (200 >= 650 - 500) is owed, R1 (100) is not.
    early = {"n1": _read([R1, R2]), "n2": _read([R1, R2]),
             "n3": _read([R1], incarnation=5, started=650)}
    assert _check(PUBS, early) is False
    early["n3"] = _read([R2], incarnation=5, started=650)
    assert _check(PUBS, early) is True


@pytest.mark.parametrize(("entry", "why"), [
    (("n1", 1, 7, "zzz", 300), "no one published this payload"),
    (("n3", 1, 0, "a", 300), "published at n1, not n3"),
    (("n1", 1, 9, "a", 300), "not the acknowledged rumor id"),
])
def test_forged_entries_are_caught(entry: Entry, why: str) -> None:
    finals = {"n1": _read([R1, R2]), "n2": _read([R1, R2, entry])}
    result = check_gossip(_history(PUBS, finals), rumor_ttl_ms=TTL)
    assert result.valid is False
    assert any(why in p for p in result.details["problems"])  # type: ignore[attr-defined]


def test_a_failed_publish_that_shows_up_is_forged_and_an_info_one_is_not() -> None:
    failed = [*PUBS, ("n3", "c", FAIL, None)]
    maybe = [*PUBS, ("n3", "c", INFO, None)]
    finals = {"n1": _read([R1, R2, ("n3", 4, 0, "c", 300)]), "n2": _read([R1, R2])}
    assert _check(failed, finals) is False
    assert _check(maybe, finals) is True


def test_one_id_with_two_payloads_is_caught() -> None:
    pubs = [*PUBS, ("n1", "c", INFO, None)]
    finals = {"n1": _read([R1, R2]), "n2": _read([R1, R2, ("n1", 1, 5, "c", 300)]),
              "n3": _read([R1, R2, ("n1", 1, 5, "a", 300)])}
    assert _check(pubs, finals) is False


def test_a_rumor_twice_at_a_node_is_caught() -> None:
    finals = {"n1": _read([R1, R2]), "n2": _read([R1, R2, R1])}
    result = check_gossip(_history(PUBS, finals), rumor_ttl_ms=TTL)
    assert result.valid is False
    assert result.details["duplicates"] == 1


def test_a_full_log_cannot_show_what_it_dropped() -> None:
    finals = {"n1": _read([R1, R2]), "n2": _read([R2], capacity=1)}
    result = check_gossip(_history(PUBS, finals), rumor_ttl_ms=TTL)
    assert result.valid == "unknown"
    assert result.details["missing"] == {}


def test_no_final_read_or_no_acknowledged_publish_is_unknown() -> None:
    assert _check(PUBS, {"n1": None, "n2": None}) == "unknown"
    assert _check([("n1", "a", INFO, None)], {"n1": _read([])}) == "unknown"


def test_final_reads_round_trip_and_malformed_values_raise() -> None:
    finals = {"n1": _read([R1, R2], incarnation=3, started=50)}
    assert final_reads(_history(PUBS, finals)) == finals
    rec = HistoryRecorder()
    rec.invoke(process=0, f=DELIVERIES, key="n1", time=0)
    rec.complete(process=0, type=OK, time=0, value=(1, 2))
    with pytest.raises(HistoryError, match="deliveries"):
        check_gossip(rec.history(), rumor_ttl_ms=TTL)
