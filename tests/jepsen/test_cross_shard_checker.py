"""The cross-shard bank checker on hand-made histories: a clean one passes; a double
credit, a lost credit, a forged credit and a negative balance are each caught."""

from __future__ import annotations

from phalanx.jepsen.cross_shard_bank import ShardSpec, check_cross_shard, encode_state
from phalanx.jepsen.history import History, HistoryRecorder
from phalanx.services.clustersend_node import credit_value

A, B = "ca" * 8, "cb" * 8
SHARDS = (ShardSpec(name="A", cluster_id=A, opening=200),
          ShardSpec(name="B", cluster_id=B, opening=200))


def _history(*reads: tuple[str, tuple[tuple[str, str], ...]]) -> History:
    rec = HistoryRecorder()
    for t, (shard, state) in enumerate(reads):
        rec.invoke(process=0, f="read", key=shard, time=2 * t)
        rec.complete(process=0, type="ok", value=state, time=2 * t + 1)
    return rec.history()


CREDIT = credit_value("bal/b0", 30, "t1")
A_BEFORE = (("bal/a0", b"100"), ("bal/a1", b"100"))
A_AFTER = (("bal/a0", b"70"), ("bal/a1", b"100"), (f"cs/out/{B}/0000000000", CREDIT))
B_BEFORE = (("bal/b0", b"100"), ("bal/b1", b"100"))
B_AFTER = (("bal/b0", b"130"), ("bal/b1", b"100"), (f"cs/in/{A}/0000000000", CREDIT))


def _read(shard: str, items: tuple[tuple[str, bytes], ...]
          ) -> tuple[str, tuple[tuple[str, str], ...]]:
    return shard, encode_state(items)


def test_a_clean_transfer_with_the_credit_in_flight_passes() -> None:
    h = _history(_read("A", A_BEFORE), _read("B", B_BEFORE), _read("A", A_AFTER),
                 _read("B", B_BEFORE), _read("B", B_AFTER), _read("A", A_AFTER))
    result = check_cross_shard(h, SHARDS)
    assert result.valid is True, result.details
    assert result.details["final_balances"] == {"A": 170, "B": 230}


def test_a_double_credit_is_caught() -> None:
    doubled = (("bal/b0", b"160"), ("bal/b1", b"100"), (f"cs/in/{A}/0000000000", CREDIT))
    result = check_cross_shard(_history(_read("A", A_AFTER), _read("B", doubled)), SHARDS)
    assert result.valid is False
    assert result.details["unbalanced_reads"] == 1


def test_a_lost_credit_is_caught() -> None:
    result = check_cross_shard(_history(_read("A", A_AFTER), _read("B", B_BEFORE)), SHARDS)
    assert result.valid is False
    assert result.details["lost_credits"] == 1
    assert result.details["unbalanced_reads"] == 0  # each shard's books alone balance


def test_a_credit_without_its_debit_is_caught() -> None:
    result = check_cross_shard(_history(_read("A", A_BEFORE), _read("B", B_AFTER)), SHARDS)
    assert result.valid is False
    assert result.details["forged_credits"] == 1


def test_a_negative_balance_is_caught() -> None:
    overdrawn = (("bal/a0", b"-10"), ("bal/a1", b"210"))
    result = check_cross_shard(_history(_read("A", overdrawn), _read("B", B_BEFORE)), SHARDS)
    assert result.valid is False
    assert result.details["negative_balances"] == 1


def test_no_read_of_a_shard_is_not_valid() -> None:
    assert check_cross_shard(_history(_read("A", A_BEFORE)), SHARDS).valid is False
