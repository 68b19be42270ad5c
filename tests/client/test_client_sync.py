"""Tests for phalanx.client.sync_client.SyncClient: the blocking wrapper, driven from plain
threads."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import trio
from client_fakes import Certs, FakeNode, KvBackend, addresses, make_certs, serve_kv, start_nodes

from phalanx.client.async_client import ClientClosed, ClientTimeout, KvCommandError
from phalanx.client.errors import ClusterUnreachable
from phalanx.client.sync_client import SyncClient
from phalanx.net.transport import Backoff


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("pki"), ("n1", "n2"))


@contextmanager
def fake_cluster(certs: Certs, backend: KvBackend) -> Iterator[dict[str, FakeNode]]:
    """Fake nodes served by a trio loop on their own thread (the test itself is synchronous)."""
    ready = threading.Event()
    holder: dict[str, object] = {}

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            holder["nodes"] = await start_nodes(nursery, certs, {"n1": serve_kv}, backend)
            holder["token"] = trio.lowlevel.current_trio_token()
            holder["stop"] = stop = trio.Event()
            ready.set()
            await stop.wait()
            nursery.cancel_scope.cancel()

    thread = threading.Thread(target=trio.run, args=(main,), daemon=True)
    thread.start()
    assert ready.wait(20)
    try:
        yield holder["nodes"]  # type: ignore[misc]
    finally:
        stop: trio.Event = holder["stop"]  # type: ignore[assignment]
        trio.from_thread.run_sync(stop.set, trio_token=holder["token"])  # type: ignore[arg-type]
        thread.join(20)


def test_sync_client_from_many_threads(certs: Certs) -> None:
    backend = KvBackend()
    errors: list[BaseException] = []
    with fake_cluster(certs, backend) as nodes, SyncClient(
        addresses(nodes), ssl_context=certs.client_context(), timeout=10.0
    ) as client:

        def worker(t: int) -> None:
            try:
                for i in range(20):
                    client.put(f"t{t}/{i}", str(i).encode())
                    assert client.get(f"t{t}/{i}") == str(i).encode()
                assert client.cas(f"t{t}/0", b"0", b"x") is True
                assert client.delete(f"t{t}/1") is True
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert errors == []
        assert len(client.scan("t3/")) == 19
        assert client.get("t3/0") == b"x"
        with pytest.raises(KvCommandError):
            client.scan("t", limit=0)
        assert client.status("n1").node == "n1"
        assert client.statistics().connections_opened == 1
    assert len(backend.applied) == 8 * 22
    assert backend.expired == []
    with pytest.raises(ClientClosed):
        client.put("k", b"v")
    client.close()  # idempotent


def test_sync_client_timeout_and_bad_arguments(certs: Certs) -> None:
    with pytest.raises(TypeError, match="ssl_context"):
        SyncClient([("n1", "127.0.0.1", 1)])
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        port = sock.getsockname()[1]
        with SyncClient([("n1", "127.0.0.1", port)], ssl_context=certs.client_context(),
                        timeout=30, attempt_timeout=0.1, fail_fast=True,
                        backoff=Backoff(base=0.01, cap=0.05)) as client, pytest.raises(
            ClusterUnreachable, match="connection refused by every node: n1"
        ):
            client.put("k", b"v")  # at once, not after the 30 s timeout
        with SyncClient([("n1", "127.0.0.1", port)], ssl_context=certs.client_context(),
                        timeout=0.3, attempt_timeout=0.1,
                        backoff=Backoff(base=0.01, cap=0.05)) as client, pytest.raises(
            ClientTimeout
        ):
            client.put("k", b"v")  # by default: tried until the deadline (a starting cluster)
    with socket.socket() as sock:  # listening, never accepting: a timeout, indeterminate
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        with SyncClient([("n1", "127.0.0.1", port)], ssl_context=certs.client_context(),
                        timeout=0.3, attempt_timeout=0.1,
                        backoff=Backoff(base=0.01, cap=0.05)) as client, pytest.raises(
            ClientTimeout
        ):
            client.put("k", b"v")
