"""Interleaved A/B of the wire codec (or another set of modules): any bench command with the
codec of a git revision (A) and with the working tree's (B), in alternating runs.

Usage (from bench/)::

    ../.venv/bin/python codec_ab.py --base 40caaaf --pairs 3 -- inproc_cpu.py --writes 500
    ../.venv/bin/python codec_ab.py --base 40caaaf --pairs 2 -- \\
        cpu_per_write.py --protocol pbft --clients 1,64 --duration 5

A's runs get the revision's codec modules (`MODULES`, read with ``git show REV:path``)
in place of the tree's: a ``sitecustomize.py`` in a temporary directory on ``PYTHONPATH``
executes them into `sys.modules` before anything imports the codec, in the bench process
and in every node process it starts (they inherit the environment). Everything else is
the tree's, so the difference between A and B is the codec alone. Runs alternate
A B B A A B ..., so a drift of the machine's speed or load hits both arms alike; each
run's output is printed with its arm, then the lines that contain ``--grep`` (default
``per write``) for each arm, together.

``--modules ticks`` swaps the runtime's tick modules instead (`phalanx.runtime.ticker`,
`driver`, `node`: the idle stride of `phalanx.runtime.driver_ticks`, which the revision's
driver does not import), so A is the revision's tick handling and B the tree's.
``--modules client`` swaps the client library's call path (`phalanx.client.connection`,
`leader_calls`, `bft_calls`, `async_client`), ``--modules clientport`` the node's client
port (`phalanx.net.client_protocol`, `phalanx.runtime.waiters`, `client_port`): the A/Bs of
issue 23's Round 6 (`pipelined.py`, `client_path_cpu.py`).
``--modules gossip`` swaps the gossip layer (`phalanx.gossip`'s permutation, rumors,
spreading, machine and dissemination modules, and the simulator's gossip fabric
`phalanx.jepsen.sim.dissemination`: issue 19's pbftwave A/B of the gossip
cells, e.g. ``-- scale.py --sizes 60 --only gossip --protocols pbft --no-plot``
with ``--grep "| gossip"``).
``--modules gcpacer`` swaps the replica (`phalanx.apps.replica`): with a revision before
issue 23's raftelect fix, A's GC pacer counts one apply per log entry, B's one per command.
``--modules tree`` gives arm A the revision's whole package (every folder of the import
package, `PACKAGE_DIRS`, exported with ``git archive`` and laid out as one `phalanx` package
of symlinks, first on ``PYTHONPATH``): A is the revision, B the working tree, for a change
that spans many modules (docs/LEADERLESS.md "Round 7").
``--modules msgpath`` swaps the peer receive path (`phalanx.net.transport`, `driver`,
`node`): A steps every peer message through the driver's input channel, B in the reading
task while the core loop is idle (`phalanx.runtime.driver_inline`).

Must not be imported by the package. Requires git and the revision in this repository.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

MODULES: tuple[tuple[str, str], ...] = (
    ("phalanx.net.codec_fast", "net/codec_fast.py"),
    ("phalanx.net.codec_fields", "net/codec_fields.py"),
    ("phalanx.net.codec_optional", "net/codec_optional.py"),
    ("phalanx.net.codec", "net/codec.py"),
)
"""The codec's modules, in import order (each imports only the ones before it)."""

MODULE_SETS: dict[str, tuple[tuple[str, str], ...]] = {
    "codec": MODULES,
    "ticks": (
        ("phalanx.runtime.ticker", "phalanx/runtime/ticker.py"),
        ("phalanx.runtime.driver", "phalanx/runtime/driver.py"),
        ("phalanx.runtime.node", "phalanx/runtime/node.py"),
    ),
    "client": (
        ("phalanx.client.connection", "phalanx/client/connection.py"),
        ("phalanx.client.leader_calls", "phalanx/client/leader_calls.py"),
        ("phalanx.client.bft_calls", "phalanx/client/bft_calls.py"),
        ("phalanx.client.async_client", "phalanx/client/async_client.py"),
    ),
    "clientport": (
        ("phalanx.net.client_protocol", "net/client_protocol.py"),
        ("phalanx.runtime.waiters", "phalanx/runtime/waiters.py"),
        ("phalanx.runtime.client_port", "phalanx/runtime/client_port.py"),
    ),
    "msgpath": (
        ("phalanx.net.transport", "net/transport.py"),
        ("phalanx.runtime.driver", "phalanx/runtime/driver.py"),
        ("phalanx.runtime.node", "phalanx/runtime/node.py"),
    ),
    "gcpacer": (
        ("phalanx.apps.replica", "apps/replica.py"),
    ),
    "gossip": (
        ("phalanx.gossip.permutation", "gossip/permutation.py"),
        ("phalanx.gossip.rumors", "gossip/rumors.py"),
        ("phalanx.gossip.spreading", "gossip/spreading.py"),
        ("phalanx.gossip.machine", "gossip/machine.py"),
        ("phalanx.gossip.dissemination", "gossip/dissemination.py"),
        ("phalanx.jepsen.sim.dissemination", "jepsen/sim/dissemination.py"),
    ),
}
"""``--modules``: the sets of modules arm A takes from the revision, in import order."""

PACKAGE_DIRS: dict[str, str] = {
    "phalanx": "phalanx", "consensus": "consensus", "storage": "storage", "apps": "apps",
    "net": "net", "jepsen": "jepsen", "gossip": "gossip", "clustersend": "clustersend"}
"""``--modules tree``: subpackage name -> the repository folder it installs from
(pyproject.toml's ``package-dir``; ``phalanx`` itself is the package's root)."""


def _stage_tree(base: str, root: Path, into: Path) -> None:
    """The revision's package under `into`/phalanx (its folders exported, then linked)."""
    src = into / "src"
    src.mkdir()
    archive = subprocess.run(["git", "archive", base, *PACKAGE_DIRS.values()], cwd=root,
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    package = into / "phalanx"
    package.mkdir()
    for entry in (src / "phalanx").iterdir():
        (package / entry.name).symlink_to(entry)
    for name, folder in PACKAGE_DIRS.items():
        if name != "phalanx":
            (package / name).symlink_to(src / folder)


PREIMPORT: dict[str, tuple[str, ...]] = {"gossip": ("phalanx.gossip",)}
"""Packages imported (the tree's) before a set's modules are swapped in: `phalanx.gossip`'s
``__init__`` imports the machine, which must not meet a half-executed swapped module."""

SITECUSTOMIZE = '''\
import importlib, importlib.util, os, sys
import phalanx.net
for _package in {preimport!r}:
    importlib.import_module(_package)
_dir = os.path.dirname(os.path.abspath(__file__))
for _name, _file in {modules!r}:
    _spec = importlib.util.spec_from_file_location(_name, os.path.join(_dir, _file))
    _module = importlib.util.module_from_spec(_spec)
    sys.modules[_name] = _module
    _spec.loader.exec_module(_module)
'''


def _stage(base: str, root: Path, into: Path, which: str = "codec") -> None:
    if which == "tree":
        _stage_tree(base, root, into)
        return
    modules = []
    for name, path in MODULE_SETS[which]:
        source = subprocess.run(["git", "show", f"{base}:{path}"], cwd=root, check=True,
                                capture_output=True, text=True).stdout
        file = name.replace(".", "_") + ".py"  # (two sets' modules share a last name)
        (into / file).write_text(source)
        modules.append((name, file))
    (into / "sitecustomize.py").write_text(SITECUSTOMIZE.format(
        modules=tuple(modules), preimport=PREIMPORT.get(which, ())))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--base", required=True, help="the git revision of arm A's codec")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--modules", choices=sorted([*MODULE_SETS, "tree"]), default="codec",
                   help="the modules arm A takes from the revision (default: the codec)")
    p.add_argument("--grep", default="per write", help="summary: the output lines with this")
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="-- SCRIPT ARGS...: a bench script (run with this interpreter) and "
                        "its arguments")
    args = p.parse_args()
    command = [c for c in args.command if c != "--"]
    if not command:
        p.error("give the command after --, e.g. -- inproc_cpu.py --writes 500")
    here = Path(__file__).resolve().parent
    root = here.parent
    summary: dict[str, list[str]] = {"A": [], "B": []}
    what = f"{args.modules} of {args.base}"
    with tempfile.TemporaryDirectory(prefix="codec-ab-") as tmp:
        _stage(args.base, root, Path(tmp), args.modules)
        order = [("A", "B"), ("B", "A")]
        for i in range(args.pairs):
            for arm in order[i % 2]:
                env = dict(os.environ)
                if arm == "A":
                    env["PYTHONPATH"] = os.pathsep.join(
                        [tmp, *filter(None, [env.get("PYTHONPATH")])])
                run = subprocess.run([sys.executable, *command], cwd=here, env=env,
                                     capture_output=True, text=True, check=False)
                label = f"{arm} ({what if arm == 'A' else 'tree'})"
                print(f"--- run {i + 1} {label}, exit {run.returncode}", flush=True)
                print(run.stdout.rstrip(), flush=True)
                if run.returncode != 0:
                    print(run.stderr[-2000:], flush=True)
                summary[arm] += [ln.strip() for ln in run.stdout.splitlines() if args.grep in ln]
    for arm, lines in summary.items():
        print(f"=== {arm} ({what if arm == 'A' else 'tree'}):")
        for line in lines:
            print(f"    {line}")


if __name__ == "__main__":
    main()
