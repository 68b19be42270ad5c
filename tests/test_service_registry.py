"""The node-service registry (`phalanx.services`): lookups, errors, clashes, every lazy
reference resolving, wire ids in their ranges, `cluster init --service`, and the rule that
makes services plug-ins: outside the registry and a service's own modules, no code compares
a service's name."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from test_protocol_registry import ROOT, SCANNED, name_comparisons

from phalanx import services
from phalanx.ops.local_cluster import ClusterError, init_cluster
from phalanx.ops.node_config import load_node_config
from phalanx.protocols import Lazy
from phalanx.services import ServiceSpec, UnknownService
from phalanx.services.builtin import SPECS as BUILTIN
from phalanx.services.messages import SERVICE_CALL_MESSAGES


def test_builtin_services_are_registered_and_clashes_raise() -> None:
    assert "gossip" in services.names()
    assert list(services.names()) == sorted(services.names())
    with pytest.raises(UnknownService, match=r"'nope'.*gossip"):
        services.get("nope")
    gossip = services.get("gossip")
    assert services.register(gossip) is gossip
    with pytest.raises(ValueError, match="already registered"):
        services.register(dataclasses.replace(gossip, summary="another"))


@pytest.mark.parametrize("spec", BUILTIN, ids=lambda s: s.name)
def test_every_lazy_reference_of_a_service_resolves(spec: ServiceSpec) -> None:
    for field in dataclasses.fields(spec):
        value = getattr(spec, field.name)
        if isinstance(value, Lazy):
            assert value.load() is not None, field.name
    peer = dict(spec.messages.load())
    ids = set(peer)
    if spec.client_messages is not None:
        client = spec.client_messages.load()
        # a type may serve both paths (the block certifier's CertificateFetch: peers and
        # `chain export` ask alike), but an id never names two classes
        assert all(peer[i] is client[i] for i in ids & set(client))
        ids |= set(client)
    # the runtime range, the apps range for an app's own service (the block certifier's
    # chain types) or the inter-cluster range (cluster-sending), never a consensus core's
    assert all(500 <= i < 600 or 400 <= i < 500 or 600 <= i < 700 for i in ids)
    assert not ids & set(SERVICE_CALL_MESSAGES)


def test_cluster_init_service_writes_tables_and_signing_keys_for_raft(tmp_path: Path) -> None:
    cluster = init_cluster(tmp_path / "c", nodes=3, base_port=23100, services=("gossip",),
                           service_options={"gossip": {"tick_ms": 40}})
    node = load_node_config(cluster.node_config_path("n1"))
    assert node.protocol == "raft"
    assert node.services["gossip"]["tick_ms"] == 40
    assert node.keys is not None
    assert node.keys.signing_key.is_file()
    assert all(p.signing_public_key for p in node.peers)
    plain = init_cluster(tmp_path / "p", nodes=3, base_port=23100)
    assert load_node_config(plain.node_config_path("n1")).services == {}
    with pytest.raises(ClusterError, match="unknown service 'nope'"):
        init_cluster(tmp_path / "x", nodes=3, base_port=23100, services=("nope",))


def _allowed(path: Path) -> bool:
    rel = path.relative_to(ROOT).as_posix()
    return rel.startswith(("phalanx/services/", "gossip/")) or rel in (
        "phalanx/cli/gossip.py", "phalanx/demo/gossip.py")


def test_no_service_name_is_compared_outside_the_registry_and_the_services() -> None:
    names = frozenset(services.names())
    offenders: list[str] = []
    quoted = tuple(f"{q}{n}{q}" for n in names for q in "'\"")
    for tree in SCANNED:
        for path in sorted((ROOT / tree).rglob("*.py")):
            source = path.read_text()
            # Parse only files that quote a service name at all (the scan stays fast).
            if not _allowed(path) and any(q in source for q in quoted):
                offenders += [f"{path.relative_to(ROOT)}:{line}: compares with {name!r}"
                              for line, name in name_comparisons(source, names)]
    assert not offenders, ("decide by the service's spec (phalanx.services), not by its "
                           "name:\n" + "\n".join(offenders))
