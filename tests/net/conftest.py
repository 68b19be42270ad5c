"""Fixtures of the transport tests: a cluster CA with node, client and foreign credentials
(`creds`), and the transport's log records (`logs`)."""


from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from transport_fakes import LogWaiter

from phalanx.ops import pki


@pytest.fixture(scope="module")
def creds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pki.CredentialPaths]:
    root = tmp_path_factory.mktemp("cluster")
    ca = pki.create_ca()
    pki.write_ca(ca, root / "ca")
    out = {
        name: pki.write_credentials(pki.issue_node_cert(ca, name), root / "nodes")
        for name in ("n1", "n2", "n3", "n9")
    }
    out["alice"] = pki.write_credentials(pki.issue_client_cert(ca, "alice"), root / "clients")
    foreign = pki.write_credentials(pki.issue_node_cert(pki.create_ca(), "n1"), root / "foreign")
    out["foreign-n1"] = pki.CredentialPaths(
        certificate=foreign.certificate,
        private_key=foreign.private_key,
        ca_certificate=out["n1"].ca_certificate,
    )
    return out


@pytest.fixture
def logs() -> Iterator[LogWaiter]:
    logger = logging.getLogger("phalanx.net.transport")
    waiter = LogWaiter()
    old_level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(waiter)
    try:
        yield waiter
    finally:
        logger.removeHandler(waiter)
        logger.setLevel(old_level)
