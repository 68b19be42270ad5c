"""Process and Python runtime families on a node's /metrics (`RuntimeCollector`): present,
with a HELP line that says what each counts, and moving with what they measure."""

from __future__ import annotations

import gc
import os
import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families

from phalanx.runtime.metrics import COUNTER_HELP, NodeMetrics


def families(metrics: NodeMetrics) -> dict[str, tuple[str, dict[tuple[str, ...], float]]]:
    """{family name: (its HELP, {(sample name, *label values but node): value})}."""
    out: dict[str, tuple[str, dict[tuple[str, ...], float]]] = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        samples = {}
        for s in family.samples:
            assert s.labels.pop("node") == "n1"
            samples[(s.name, *(v for _, v in sorted(s.labels.items())))] = s.value
        out[family.name] = (family.documentation, samples)
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux)")
def test_process_and_gc_families_measure_this_process() -> None:
    m = NodeMetrics("n1")
    # Earlier tests' unreachable sockets are closed now, not by the collection below (which
    # would take them off the count), and no automatic collection runs in between.
    gc.collect()
    gc.disable()
    try:
        before = families(m)
        for name in ("phalanx_process_resident_memory_bytes", "phalanx_process_cpu_seconds",
                     "phalanx_process_open_fds", "phalanx_process_max_fds",
                     "phalanx_process_start_time_seconds", "phalanx_python_gc_collections",
                     "phalanx_python_gc_objects_collected", "phalanx_python_gc_uncollectable",
                     "phalanx_python_gc_generation_count", "phalanx_python_threads",
                     "phalanx_python_info"):
            assert name in before, name
        assert before["phalanx_process_resident_memory_bytes"][1][
            ("phalanx_process_resident_memory_bytes",)] > 1 << 20
        fds = before["phalanx_process_open_fds"][1][("phalanx_process_open_fds",)]
        held = [os.open(os.devnull, os.O_RDONLY) for _ in range(5)]
        try:
            gc.collect()
            sum(i * i for i in range(300_000))  # some CPU
            after = families(m)
        finally:
            for fd in held:
                os.close(fd)
    finally:
        gc.enable()
    assert after["phalanx_process_open_fds"][1][("phalanx_process_open_fds",)] == fds + 5
    assert (after["phalanx_process_cpu_seconds"][1][("phalanx_process_cpu_seconds_total",)]
            >= before["phalanx_process_cpu_seconds"][1][("phalanx_process_cpu_seconds_total",)])
    key = ("phalanx_python_gc_collections_total", "2")
    assert (after["phalanx_python_gc_collections"][1][key]
            == before["phalanx_python_gc_collections"][1][key] + 1)


def test_every_family_has_a_help_line_that_says_what_it_counts() -> None:
    m = NodeMetrics("n1")
    m.add_byte_source(lambda: dict.fromkeys(COUNTER_HELP, 0))
    for name, (doc, _) in families(m).items():
        assert name.startswith("phalanx_"), name
        assert len(doc.split()) >= 4, (name, doc)
        assert "(a counter)" not in doc, name  # the generic fallback
