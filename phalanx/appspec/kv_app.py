"""The KV app's factories for the app registry (`phalanx.appspec.builtin.KV`).

Owns: `build_machine` (a fresh `KvStateMachine`; the KV app reads no files) and the KV
harness workloads' factories (`phalanx.jepsen.workloads`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from phalanx.appspec.spec import AppFiles

if TYPE_CHECKING:
    from phalanx.apps.kv import KvStateMachine
    from phalanx.jepsen.workloads import Workload, WorkloadConfig
    from phalanx.ops.node_config import ClusterConfig


def build_machine(files: AppFiles) -> KvStateMachine:
    from phalanx.apps.kv import KvStateMachine

    return KvStateMachine()


def _workload(name: str, config: WorkloadConfig) -> Workload:
    from phalanx.jepsen.workloads import make_workload

    return make_workload(name, config)


def bank_workload(config: WorkloadConfig, cluster: ClusterConfig) -> Workload:
    return _workload("bank", config)


def register_workload(config: WorkloadConfig, cluster: ClusterConfig) -> Workload:
    return _workload("register", config)


def set_workload(config: WorkloadConfig, cluster: ClusterConfig) -> Workload:
    return _workload("set", config)
