"""Your own state machine in the simulator (`phalanx sim --app`, `phalanx.jepsen.sim.app_clients`):
the tickets example passes on Raft and PBFT under faults, a machine that is not deterministic
and a model that disagrees with the app are caught (the controls), and bad apps are one line.

A failing seed prints its replay command (`RunResult.report`), which names the app."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from phalanx.jepsen.sim.protocols import protocol_setup
from phalanx.jepsen.sim.run import RunConfig, run

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "tickets.py"
TICKETS = f"{EXAMPLE}:TicketMachine"
_MS = 1_000_000
SHORT = {"time_ns": 800 * _MS, "liveness_ns": 1_200 * _MS}
TINY = {"time_ns": 300 * _MS, "liveness_ns": 600 * _MS}

DRIFTING = '''
import itertools, json, random
from phalanx import GeneratedCommand

_instances = itertools.count()

class _Snap:
    def __init__(self, n): self.data = json.dumps(n).encode()
    def chunks(self): yield self.data

class Drifting:
    """Not deterministic: each instance (replica) counts by its own step."""
    def __init__(self):
        self.step = 1 + next(_instances) % 2
        self.n = 0
    def apply(self, command):
        self.n += self.step
        return str(self.n).encode()
    def query(self, request): return str(self.n).encode()
    def snapshot(self): return _Snap(self.n)
    def restore(self, data): self.n = json.loads(data)
    @staticmethod
    def random_command(rng): return GeneratedCommand(command=b"incr")

class Counter(Drifting):
    def __init__(self):
        self.step, self.n = 1, 0

class Doubling(Counter):
    """Its reference model counts by two: the spec disagrees with every observed result."""
    @staticmethod
    def reference_model():
        machine = Counter()
        machine.step = 2
        return machine

class BadHook(Counter):
    @staticmethod
    def random_command(rng): return b"incr"

class NoHook:
    def apply(self, c): return c
    def query(self, r): return r
    def snapshot(self): return _Snap(0)
    def restore(self, data): pass
'''


@pytest.fixture
def apps(tmp_path: Path) -> Path:
    path = tmp_path / "apps.py"
    path.write_text(DRIFTING)
    return path


@pytest.mark.parametrize(("protocol", "nodes", "seed"), [("raft", 3, 1), ("pbft", 4, 3)])
def test_the_tickets_example_passes_under_faults(protocol: str, nodes: int, seed: int) -> None:
    result = run(RunConfig(seed=seed, protocol=protocol, nodes=nodes, app=TICKETS, **SHORT))
    assert result.ok, result.report()
    assert result.ops_ok > 100, "a fault-laden run must still do real work"


def test_same_seed_same_trace() -> None:
    cfg = RunConfig(seed=5, nodes=3, app=TICKETS, **TINY)
    assert run(cfg).trace_hash == run(cfg).trace_hash


def test_a_machine_that_is_not_deterministic_diverges(apps: Path) -> None:
    result = run(RunConfig(seed=0, nodes=3, app=f"{apps}:Drifting", faults=(), **TINY))
    assert not result.ok
    assert any(v.startswith("divergence:") for v in result.violations), result.violations
    assert f"--app {apps}:Drifting" in result.report()  # the replay names the app
    ok = run(RunConfig(seed=0, nodes=3, app=f"{apps}:Counter", faults=(), **TINY))
    assert ok.ok, ok.report()


def test_a_model_that_disagrees_with_the_app_is_caught(apps: Path) -> None:
    result = run(RunConfig(seed=0, nodes=3, app=f"{apps}:Doubling", faults=(), **TINY))
    assert any(v.startswith("linearizability:") for v in result.violations), result.violations


def test_apps_the_simulator_cannot_drive_are_a_value_error(apps: Path) -> None:
    with pytest.raises(ValueError, match="random_command"):
        protocol_setup("raft", bugs=frozenset(), nodes=3, app=f"{apps}:NoHook")
    with pytest.raises(ValueError, match="must return a GeneratedCommand, got bytes"):
        protocol_setup("raft", bugs=frozenset(), nodes=3, app=f"{apps}:BadHook")
    with pytest.raises(ValueError, match="no 'Missing'"):
        protocol_setup("raft", bugs=frozenset(), nodes=3, app=f"{apps}:Missing")
    with pytest.raises(ValueError, match="raft or pbft"):
        protocol_setup("leaderless", bugs=frozenset(), nodes=4, app=TICKETS)


def test_the_cli_says_why_in_one_line(apps: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "phalanx", "sim", "--seeds", "1", "--app",
                           f"{apps}:NoHook"], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1
    assert "random_command" in done.stderr


def test_the_apps_own_checks_catch_a_raft_bug() -> None:
    # The control for the replication side: Raft committing on a minority loses and forks
    # tickets; the app's history and the replicas' states show it, not only the log checks.
    result = run(RunConfig(seed=0, nodes=3, app=TICKETS, faults=("isolate-leader",),
                           bugs=frozenset({"commit_on_minority"}), swarm=False,
                           time_ns=1_500 * _MS, liveness_ns=1_000 * _MS))
    kinds = {v.split(":")[0] for v in result.violations}
    assert {"linearizability", "divergence"} <= kinds, result.violations
    assert "--bug commit_on_minority" in result.report()
