"""docs/grafana/phalanx.json: valid dashboard JSON whose every query names series a node
(or a client's `LatencyCollector`) really exports, so a renamed metric breaks this test and
not the dashboard in production."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from phalanx.client.latency import LatencyCollector, LatencyHistogram, LatencySnapshot
from phalanx.runtime.health import HealthState, LinkCollector
from phalanx.runtime.metrics import COUNTER_HELP, NodeMetrics

DASHBOARD = Path(__file__).resolve().parents[1] / "docs" / "grafana" / "phalanx.json"


class _Client:
    def __init__(self) -> None:
        self.h = LatencyHistogram()
        self.h.observe("write", "ok", 0.003)

    def latency(self) -> Mapping[tuple[str, str], LatencySnapshot]:
        return self.h.snapshot()


def _exported() -> set[str]:
    m = NodeMetrics("n1")
    m.add_byte_source(lambda: dict.fromkeys(COUNTER_HELP, 0))
    m.registry.register(LinkCollector("n1", HealthState(peers=("n2",))))
    m.registry.register(LatencyCollector(_Client()))
    names = set()
    for family in text_string_to_metric_families(generate_latest(m.registry).decode()):
        names.update(s.name for s in family.samples)
    return names


def test_every_panel_queries_series_that_exist() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exported = _exported()
    assert dashboard["panels"], "no panels"
    seen = set()
    for panel in dashboard["panels"]:
        assert panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            for name in re.findall(r"phalanx_[a-z_]+", target["expr"]):
                assert name in exported, (panel["title"], name)
                seen.add(name)
    for main in ("phalanx_commits_total", "phalanx_apply_lag", "phalanx_is_leader",
                 "phalanx_fsync_seconds_bucket", "phalanx_peer_link_up",
                 "phalanx_process_resident_memory_bytes", "phalanx_client_call_seconds_bucket"):
        assert main in seen, main
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_a_registry_of_the_apps_own_takes_the_latency_collector() -> None:
    registry = CollectorRegistry()
    registry.register(LatencyCollector(_Client()))
    assert b'phalanx_client_call_seconds_count{kind="write",outcome="ok"} 1.0' in \
        generate_latest(registry)
