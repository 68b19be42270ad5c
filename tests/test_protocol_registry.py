"""The protocol registry (`phalanx.protocols`): lookups, errors, clashes, lazy references, the
status vocabulary each spec declares; and the rule that makes protocols plug-ins: outside the
registry and the protocols' own packages, no code compares a protocol's name.

The test-only `toy` protocol (tests/toy_protocol) is registered here too, by importing it."""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import toy_protocol

from phalanx import protocols
from phalanx.consensus.core import Core
from phalanx.jepsen.sim import run as sim_run
from phalanx.jepsen.sim.protocols import ProtocolSetup, protocol_setup
from phalanx.protocols import Lazy, ProtocolSpec, UnknownProtocol
from phalanx.protocols.builtin import SPECS as BUILTIN

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("phalanx", "consensus", "jepsen", "bench", "apps", "net", "storage")
"""Source trees that must not decide anything by a protocol's name."""


def test_the_toy_protocol_is_registered_by_importing_it() -> None:
    assert protocols.get("toy") is toy_protocol.TOY
    assert {"raft", "pbft", "toy"} <= set(protocols.names())


def test_names_are_sorted_and_specs_follow_them() -> None:
    names = protocols.names()
    assert list(names) == sorted(names)
    assert tuple(s.name for s in protocols.specs()) == names


def test_an_unknown_name_is_an_error_naming_the_registered_ones() -> None:
    with pytest.raises(UnknownProtocol) as err:
        protocols.get("paxos")
    assert isinstance(err.value, ValueError)
    assert err.value.name == "paxos"
    message = str(err.value)
    assert "'paxos'" in message
    assert all(name in message for name in protocols.names())


def test_registering_a_different_spec_under_a_taken_name_raises() -> None:
    assert protocols.register(toy_protocol.TOY) is toy_protocol.TOY  # idempotent
    clash = dataclasses.replace(toy_protocol.TOY, summary="another toy")
    with pytest.raises(ValueError, match="already registered"):
        protocols.register(clash)
    with pytest.raises(ValueError, match="protocol name"):
        protocols.register(dataclasses.replace(toy_protocol.TOY, name="no spaces"))
    assert protocols.get("toy") is toy_protocol.TOY


def test_lazy_loads_its_target_on_first_use() -> None:
    # (Plain `Lazy(...)`: a subscripted ``Lazy[T](...)`` cannot set ``__orig_class__`` on a
    # frozen slotted instance.)
    names: Lazy[Any] = Lazy("phalanx.protocols.registry:names")
    assert names.load() is protocols.names
    with pytest.raises(ModuleNotFoundError):
        Lazy("phalanx.no_such_module:x").load()
    with pytest.raises(AttributeError):
        Lazy("phalanx.protocols.registry:no_such_name").load()


def _lazies(spec: ProtocolSpec) -> Iterator[tuple[str, Lazy[Any]]]:
    for field in dataclasses.fields(spec):
        value = getattr(spec, field.name)
        if isinstance(value, Lazy):
            yield field.name, value


@pytest.mark.parametrize("spec", [*BUILTIN, toy_protocol.TOY], ids=lambda s: s.name)
def test_every_lazy_reference_of_a_spec_resolves(spec: ProtocolSpec) -> None:
    fields = dict(_lazies(spec))
    assert {"messages", "node", "sim"} <= set(fields)
    for name, lazy in fields.items():
        target = lazy.load()
        assert target is not None, name
    node = spec.node.load()
    for method in ("build_core", "checkpoint_policy", "open_core_state_store"):
        assert callable(getattr(node, method)), method
    assert callable(spec.sim.load())
    messages = spec.messages.load()
    assert messages
    assert all(isinstance(k, int) and dataclasses.is_dataclass(v) for k, v in messages.items())
    if spec.sim_bugs is not None:
        assert all(isinstance(b, str) for b in spec.sim_bugs.load())
    if spec.byzantine is not None:
        assert tuple(spec.byzantine.load().modes) == spec.byzantine_modes
    assert spec.leader_role in spec.roles


@pytest.mark.parametrize("name", ["raft", "pbft", "toy"])
def test_roles_cover_what_the_core_reports_in_a_short_run(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every role a core's `status()` reports (a short simulation with kills and an isolated
    leader) is one its spec declares; the leader role among them."""
    seen: set[str] = set()

    def recording_setup(*args: Any, **kwargs: Any) -> ProtocolSetup:
        setup = protocol_setup(*args, **kwargs)
        observe = setup.observe

        def watch(core: Core) -> tuple[str, int, int]:
            seen.add(core.status().role)
            return observe(core)

        return dataclasses.replace(setup, observe=watch)

    monkeypatch.setattr(sim_run, "protocol_setup", recording_setup)
    spec = protocols.get(name)
    result = sim_run.run(sim_run.RunConfig(
        seed=3, protocol=name, nodes=spec.default_nodes, faults=("kill", "isolate-leader"),
        swarm=False, time_ns=1_000_000_000))
    assert result.ok, result.report()
    assert spec.leader_role in seen
    assert seen <= set(spec.roles), f"{name} reported {sorted(seen - set(spec.roles))}"


# --------------------------------------------------------------------------------------------
# No protocol-name comparisons outside the registry and the protocols' own packages


def _allowed(path: Path, names: tuple[str, ...]) -> bool:
    rel = path.relative_to(ROOT).as_posix()
    return rel.startswith("phalanx/protocols/") or any(
        rel.startswith(f"consensus/{name}/") for name in names)


def _name_constants(node: ast.AST, names: frozenset[str]) -> list[str]:
    """The protocol names `node` holds as a string constant, or in a tuple/list/set of them."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value] if node.value in names else []
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [n for element in node.elts for n in _name_constants(element, names)]
    return []


def name_comparisons(source: str, names: frozenset[str]) -> list[tuple[int, str]]:
    """(line, name) of every comparison of a value with a protocol name in `source`: ``==``,
    ``!=``, ``is``, ``in``/``not in`` a literal collection holding one, and ``match`` cases."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            for operand in (node.left, *node.comparators):
                found += [(node.lineno, n) for n in _name_constants(operand, names)]
        elif isinstance(node, ast.MatchValue):
            found += [(node.lineno, n) for n in _name_constants(node.value, names)]
    return found


def test_the_scanner_finds_every_form_of_comparison() -> None:
    names = frozenset({"raft", "pbft"})
    source = (
        'if p == "raft": pass\n'
        'if "pbft" != p: pass\n'
        'if p in ("x", "raft"): pass\n'
        'if p not in {"pbft"}: pass\n'
        'match p:\n    case "raft": pass\n    case _: pass\n'
        'ok = p == "leader" or p in ("a", "b")\n'
        'table = {"raft": 1}\n'
    )
    assert name_comparisons(source, names) == [
        (1, "raft"), (2, "pbft"), (3, "raft"), (4, "pbft"), (6, "raft")]


def test_no_protocol_name_is_compared_outside_the_registry_and_protocol_packages() -> None:
    names = protocols.names()
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: compares with {name!r}"
        for tree in SCANNED
        for path in sorted((ROOT / tree).rglob("*.py"))
        if not _allowed(path, names)
        for line, name in name_comparisons(path.read_text(), frozenset(names))
    ]
    assert not offenders, (
        "decide by the protocol's spec (phalanx.protocols), not by its name:\n"
        + "\n".join(offenders))


def test_the_node_runtime_and_the_client_load_no_core_and_no_jepsen_until_used() -> None:
    """A production node imports the fault-injection package only for a Byzantine mode
    (`ProtocolSpec.byzantine` is loaded by `open_node` only then), and neither the runtime
    nor the client imports a core before a spec's `node` is loaded."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import phalanx.runtime.node, phalanx.client.async_client, phalanx.protocols\n"
        "from phalanx.protocols import specs\n"
        "assert [s.name for s in specs()]\n"
        "bad = sorted(m for m in sys.modules if m.startswith(('phalanx.jepsen',\n"
        "             'phalanx.consensus.raft', 'phalanx.consensus.pbft')))\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
