"""The cross-shard bank: commands, a shard's books, and the checker of a two-shard history.

Owns the accounting shared by `phalanx demo --scenario cross-shard` (`phalanx.demo.cross_shard`)
and `phalanx jepsen run --shards 2 --workload cross-shard-bank`
(`phalanx.jepsen.harness.shards`), on the KV app with the cluster-sending service
(`phalanx.services.clustersend_node`):

    * balances live at ``bal/<account>``; a transfer to another shard is ONE transaction in
      the sending shard that debits the account and writes a credit to outbox slot
      ``cs/out/<dst cluster>/<seq>`` (`transfer_command`); the receiving shard records it
      at ``cs/in/<src cluster>/<seq>`` and credits the account in one transaction;
    * `shard_books(items, other)`: (balances, credits sent to `other`, credits received
      from `other`) in one atomic read of a shard's whole state.

The checker (`check_cross_shard`) is a pure function of a history whose ``read`` ops (key:
the shard's name, ok value: the shard's whole state as ``((key, value), ...)``, values
decoded as latin-1) were each ONE atomic read. It requires:

    1. books: at every read of shard S, balances + sent - received == S's opening total
       (a credit applied twice, a debit lost, a credit torn from its inbox entry fail it);
    2. no negative balance at any read;
    3. no forged credit: every inbox slot any read shows equals the sending shard's outbox
       slot in its last read (a credit without its debit);
    4. by the end (the last read of each shard, after healing): every outbox slot is in the
       other shard's inbox with the same value and nothing else is there (a lost credit),
       so the shards' balances add up to the opening total of both.

Must not import trio, the client or anything doing I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from phalanx.apps.kv_types import Compare, Put, Txn
from phalanx.apps.kv_wire import encode_command
from phalanx.jepsen.checker import CheckerResult
from phalanx.jepsen.history import OK, History
from phalanx.services.clustersend_node import credit_value, parse_credit

CHECKER: Final = "cross-shard-bank"
MAX_REPORTED: Final = 10


def balance_key(account: str) -> str:
    return f"bal/{account}"


def outbox_key(dst_cluster: str, seq: int) -> str:
    return f"cs/out/{dst_cluster}/{seq:010d}"


def transfer_command(src_account: str, read_balance: bytes | None, amount: int,
                     dst_cluster: str, seq: int, dst_account: str, note: str) -> bytes:
    """Debit `src_account` and queue the credit for `dst_account` in the other shard, in one
    transaction guarded by the balance read and a free outbox slot."""
    old = int(read_balance) if read_balance is not None else 0
    out = outbox_key(dst_cluster, seq)
    return encode_command(Txn(
        compares=(Compare(key=balance_key(src_account), expected=read_balance),
                  Compare(key=out, expected=None)),
        success=(Put(key=balance_key(src_account), value=str(old - amount).encode()),
                 Put(key=out, value=credit_value(balance_key(dst_account), amount, note)))))


def local_transfer_command(src: str, src_balance: bytes | None, dst: str,
                           dst_balance: bytes | None, amount: int) -> bytes:
    """Move `amount` between two accounts of one shard, guarded by both balance reads."""
    old_src = int(src_balance) if src_balance is not None else 0
    old_dst = int(dst_balance) if dst_balance is not None else 0
    return encode_command(Txn(
        compares=(Compare(key=balance_key(src), expected=src_balance),
                  Compare(key=balance_key(dst), expected=dst_balance)),
        success=(Put(key=balance_key(src), value=str(old_src - amount).encode()),
                 Put(key=balance_key(dst), value=str(old_dst + amount).encode()))))


def shard_books(items: tuple[tuple[str, bytes], ...], other: str) -> tuple[int, int, int]:
    """(sum of balances, credits sent to `other`, credits received from `other`) in one
    atomic read of a shard's whole state."""
    balances = sent = received = 0
    for key, value in items:
        if key.startswith("bal/"):
            balances += int(value)
        elif key.startswith((f"cs/out/{other}/", f"cs/in/{other}/")):
            credit = parse_credit(value)
            amount = credit[1] if credit is not None else 0
            if key.startswith("cs/out/"):
                sent += amount
            else:
                received += amount
    return balances, sent, received


def encode_state(items: tuple[tuple[str, bytes], ...]) -> tuple[tuple[str, str], ...]:
    """A shard's state as a history value (bytes as latin-1, so every byte survives)."""
    return tuple((k, v.decode("latin-1")) for k, v in items
                 if k.startswith(("bal/", "cs/out/", "cs/in/")))


def decode_state(value: object) -> tuple[tuple[str, bytes], ...] | None:
    """The inverse of `encode_state`, or None for a value of another shape."""
    if not isinstance(value, tuple):
        return None
    out = []
    for item in value:
        if not (isinstance(item, tuple) and len(item) == 2
                and isinstance(item[0], str) and isinstance(item[1], str)):
            return None
        out.append((item[0], item[1].encode("latin-1")))
    return tuple(out)


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardSpec:
    """What the checker knows of one shard: its cluster id and opening total."""

    name: str
    cluster_id: str
    opening: int


def _slots(items: tuple[tuple[str, bytes], ...], prefix: str) -> dict[str, bytes]:
    return {k[len(prefix):]: v for k, v in items if k.startswith(prefix)}


def check_cross_shard(history: History, shards: tuple[ShardSpec, ShardSpec]
                      ) -> CheckerResult:
    """Check `history`'s atomic shard reads (module docstring, rules 1-4)."""
    reads: dict[str, list[tuple[int, tuple[tuple[str, bytes], ...]]]] = {
        s.name: [] for s in shards}
    problems: list[str] = []
    for op in history.ops:
        if op.type != OK or op.f != "read" or op.key not in reads:
            continue
        state = decode_state(op.value)
        if state is None:
            problems.append(f"op {op.index}: unreadable shard state")
            continue
        reads[str(op.key)].append((op.index, state))
    unbalanced = negative = forged = 0
    a, b = shards
    for me, other in ((a, b), (b, a)):
        last_other = reads[other.name][-1][1] if reads[other.name] else None
        other_out = (_slots(last_other, f"cs/out/{me.cluster_id}/")
                     if last_other is not None else None)
        for index, state in reads[me.name]:
            balances, sent, received = shard_books(state, other.cluster_id)
            if balances + sent - received != me.opening:
                unbalanced += 1
                problems.append(f"op {index}: shard {me.name}'s books do not balance: "
                      f"balances {balances} + sent {sent} - received {received} != "
                      f"{me.opening}")
            for key, value in state:
                if key.startswith("bal/") and int(value) < 0:
                    negative += 1
                    problems.append(f"op {index}: {me.name} {key} is negative ({int(value)})")
            if other_out is None:
                continue
            for slot, value in _slots(state, f"cs/in/{other.cluster_id}/").items():
                if other_out.get(slot) != value:
                    forged += 1
                    problems.append(f"op {index}: {me.name}'s inbox slot {slot} from "
                          f"{other.name} is not in {other.name}'s outbox")
    lost = extra = 0
    final: dict[str, int] = {}
    if all(reads[s.name] for s in shards):
        last = {s.name: reads[s.name][-1][1] for s in shards}
        for src, dst in ((a, b), (b, a)):
            sent_slots = _slots(last[src.name], f"cs/out/{dst.cluster_id}/")
            got_slots = _slots(last[dst.name], f"cs/in/{src.cluster_id}/")
            for slot in sorted(set(sent_slots) - set(got_slots)):
                lost += 1
                problems.append(f"credit {src.name}->{dst.name} slot {slot} never received "
                      f"by the end")
            extra += len(set(got_slots) - set(sent_slots))
            final[src.name] = shard_books(last[src.name], dst.cluster_id)[0]
        total = a.opening + b.opening
        if lost == 0 and forged == 0 and sum(final.values()) != total:
            problems.append(f"money not conserved at the end: {final} != {total}")
    else:
        problems.append("no successful read of "
                        + " and ".join(s.name for s in shards if not reads[s.name]))
    valid = not problems
    return CheckerResult(checker=CHECKER, valid=valid, details={
        "reads": {s.name: len(reads[s.name]) for s in shards},
        "unbalanced_reads": unbalanced, "negative_balances": negative,
        "forged_credits": forged, "lost_credits": lost, "unmatched_inbox": extra,
        "final_balances": dict(final), "problems": problems[:MAX_REPORTED]})


__all__ = ["CHECKER", "ShardSpec", "balance_key", "check_cross_shard", "decode_state",
           "encode_state", "local_transfer_command", "outbox_key", "shard_books",
           "transfer_command"]
