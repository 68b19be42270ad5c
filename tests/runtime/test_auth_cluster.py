"""Authentication on real nodes: a node refuses to start with another node's certificate,
and client roles and session ownership hold end to end through the client library.

The attacks:
- a node given another node's certificate used to start, pass as that node to its peers
  and keep replacing their connections (276 replacements in 18 s and a leader change);
- a read-only client could write; a client could write under another client's session id.
The explicit insecure mode (``[client] auth = "none"``) still lets anyone in, loudly.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from prometheus_client import generate_latest
from runtime_helpers import RawClient, make_cluster
from test_cluster import cluster
from test_process import write_configs

from phalanx.apps import kv_wire
from phalanx.apps.kv_types import KvError, KvErrorCode, Put
from phalanx.client.async_client import Forbidden, open_client
from phalanx.net.client_protocol import ReadConsistency, StatusCall, StatusReply
from phalanx.ops import pki
from phalanx.runtime.node import NodeError, open_node, serve_node


async def test_a_node_with_another_nodes_certificate_refuses_to_start(tmp_path: Path) -> None:
    n1, n2, _ = make_cluster(tmp_path)
    stolen = dataclasses.replace(n1, tls=n2.tls)
    with pytest.raises(NodeError, match="names node 'n2', not this node 'n1'; refusing"):
        async with open_node(stolen):
            pass  # pragma: no cover - must not start
    # refused before its storage was opened: only the IDENTITY `make_cluster` wrote is there
    assert sorted(p.name for p in n1.data_dir.iterdir()) == ["IDENTITY"]


def test_node_run_with_another_nodes_certificate_exits_with_one_line(tmp_path: Path) -> None:
    n1, n2, _ = make_cluster(tmp_path)
    path = write_configs(tmp_path, [dataclasses.replace(n1, tls=n2.tls)])["n1"]
    done = subprocess.run([sys.executable, "-m", "phalanx", "node", "run", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1, done.stderr
    assert "names node 'n2', not this node 'n1'" in done.stderr


async def test_roles_and_sessions_hold_through_the_client_library(tmp_path: Path) -> None:
    def context(who: pki.CredentialPaths) -> dict[str, object]:
        return {"ssl_context": pki.client_context(who.ca_certificate, certificate=who.certificate,
                                                  private_key=who.private_key,
                                                  check_hostname=False),
                "client_id": pki.new_client_id(who.certificate), "timeout": 20.0}

    with trio.fail_after(60):
        async with cluster(tmp_path) as c:
            ca = pki.load_ca(tmp_path / "ca")  # make_cluster's CA
            clients = tmp_path / "clients"
            reader = pki.write_credentials(
                pki.issue_client_cert(ca, "reader", role="read-only"), clients)
            alice = pki.write_credentials(pki.issue_client_cert(ca, "alice"), clients)
            await c.leader()
            nodes = [(n.id, n.client_address.host, n.client_address.port)
                     for n in c.nodes.values()]
            async with open_client(nodes, **context(alice)) as writer:  # type: ignore[arg-type]
                await writer.put("k", b"v")
            async with open_client(nodes, **context(reader)) as client:  # type: ignore[arg-type]
                with pytest.raises(Forbidden, match="writes need role read-write; client "
                                   "'reader' has role read-only"):
                    await client.put("k", b"overwritten")
                assert await client.get("k") == b"v"
                assert await client.get("k", stale=True) == b"v"
                # A write disguised as a read is answered by the query path: not applied.
                put = kv_wire.encode_command(Put(key="k", value=b"sneaky"))
                for consistency in ReadConsistency:
                    result = kv_wire.decode_result(
                        await client.call(put, read_only=True, consistency=consistency))
                    assert isinstance(result, KvError)
                    assert result.code is KvErrorCode.NOT_A_QUERY
                assert await client.get("k") == b"v"
            spoof = {**context(alice), "client_id": "reader/1"}
            async with open_client(nodes, **spoof) as client:  # type: ignore[arg-type]
                with pytest.raises(Forbidden, match="session 'reader/1#0' does not belong"):
                    await client.put("k", b"spoofed")
            assert sum(n.client_port.stats.forbidden_calls for n in c.nodes.values()) >= 2
            scraped = b"".join(generate_latest(n.metrics.registry) for n in c.nodes.values())
            assert b"phalanx_client_forbidden_calls_total" in scraped


async def test_the_insecure_mode_serves_anyone_and_says_so(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    configs = [dataclasses.replace(c, client_auth="none") for c in make_cluster(tmp_path, n=1)]
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            node = await nursery.start(serve_node, configs[0])
            anonymous = await RawClient.connect(node.client_address, configs[0].tls.ca)
            await anonymous.send(StatusCall(nonce=1))
            status = await anonymous.receive()
            assert isinstance(status, StatusReply)
            assert status.client_auth == "none"
            await anonymous.aclose()
            nursery.cancel_scope.cancel()
    assert any(r.levelname == "WARNING" and "INSECURE" in r.getMessage() for r in caplog.records)
