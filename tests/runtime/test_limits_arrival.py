"""Size limits are enforced when a request ARRIVES at a node, before it is proposed: an
oversized value, key, command or client id is answered ERROR at once and never reaches the
log, the peers or any WAL (the attack: 2-4 MiB values were replicated into every log and only
then refused by `apply`; 8-15 MiB values caused elections and never committed)."""

from __future__ import annotations

from pathlib import Path

from test_cluster import call, cluster, put

from phalanx.apps import kv_wire
from phalanx.apps.kv_types import MAX_COMMAND_BYTES, MAX_VALUE_BYTES, CompareAndSet
from phalanx.apps.replica import MAX_CLIENT_ID_BYTES
from phalanx.consensus.types import ClientRequest
from phalanx.net.client_protocol import ClientCall, ReplyStatus


def _stored_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


async def test_oversized_requests_are_refused_on_arrival_and_never_logged(
        tmp_path: Path) -> None:
    async with cluster(tmp_path) as c:
        leader = await c.leader()
        client = await c.client(leader)
        assert (await call(client, put("tester/c1", 1, "k", b"small"))).status is ReplyStatus.OK
        before = {n.id: _stored_bytes(n.config.data_dir) for n in c.nodes.values()}
        applied = leader.replica.applied_index
        big_value = put("tester/c1", 2, "k", b"v" * (MAX_VALUE_BYTES + 1))
        big_key = put("tester/c1", 3, "k" * 2000, b"v")
        big_cas = ClientCall(request=ClientRequest(client_id="tester/c1", request_no=4, command=(
            kv_wire.encode_command(CompareAndSet(key="k", expected=b"e" * MAX_COMMAND_BYTES,
                                                 new=b"n")))))
        long_id = put("tester/" + "x" * MAX_CLIENT_ID_BYTES, 1, "k", b"v")
        for message, words in ((big_value, "value exceeds"), (big_key, "key exceeds"),
                               (big_cas, "command of"), (long_id, "client id longer")):
            reply = await call(client, message)
            assert reply.status is ReplyStatus.ERROR, reply
            assert words in reply.message
        assert leader.statistics().driver.refused_calls == 4
        assert leader.replica.applied_index == applied  # nothing was proposed
        # A later small write commits; no node's storage grew by anything like a MiB.
        assert (await call(client, put("tester/c1", 5, "k", b"after"))).status is ReplyStatus.OK
        for node in c.nodes.values():
            assert _stored_bytes(node.config.data_dir) - before[node.id] < 64 * 1024
        await client.aclose()


def test_kv_admit_refuses_only_size_problems() -> None:
    from phalanx.apps.kv import KvStateMachine
    from phalanx.apps.kv_types import Put, Scan, Txn

    kv = KvStateMachine()
    enc = kv_wire.encode_command
    assert kv.admit(enc(Put(key="k", value=b"v" * MAX_VALUE_BYTES)), False) is None
    assert "value exceeds" in (kv.admit(enc(Put(key="k", value=b"v" * (MAX_VALUE_BYTES + 1))),
                                        False) or "")
    assert "key exceeds" in (kv.admit(enc(Put(key="é" * 600, value=b"")), False) or "")
    many = Txn(compares=(), success=tuple(Put(key=f"k{i}", value=b"") for i in range(129)))
    assert "txn holds at most" in (kv.admit(enc(many), False) or "")
    assert kv.admit(enc(Scan(prefix="p" * 2000, limit=0)), True) is not None
    assert kv.admit(enc(Scan(prefix="p", limit=0)), True) is None  # apply answers that one
    assert kv.admit(b"\xff" * 5000, False) is None  # malformed: apply's typed error
