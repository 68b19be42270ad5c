"""`phalanx demo --app chain`: a chain on a Byzantine-tolerant cluster with a lying replica
and a crashed one, then an exported chain validated and a light-client proof verified.

Owns: `run` (the `AppSpec.demo` entry point), `run_chain_demo` and `ChainDemoResult`.

What it does, in order:
    1. `init_cluster --app chain` with the protocol (default: the first registered one that
       has Byzantine modes and suits the app: PBFT), n = 3f+1 = 4, fsync on; replica n1 (the
       primary of view 0) runs ``--byzantine MODE`` (default ``equivocate``).
    2. Runs signed transfers between the genesis accounts a1..a5 from several workers.
    3. After the warm-up, SIGKILLs an honest replica that is not the primary, keeps
       transferring, restarts it (it recovers from its checkpoint and log, then catches up
       from its peers), keeps transferring, stops.
    4. Waits until the restarted replica reports the head block of when the transfers
       stopped (one transfer at a time meanwhile: a PBFT replica that missed the last
       sequence numbers learns of them from newer traffic and checkpoints); exports the
       chain (blocks read with f+1 matching replies), validates it (links, tx roots,
       re-execution, every state root), checks the supply is conserved, and verifies a1's
       balance with the light client against the restarted replica alone: the header is
       trusted by the block certificate that replica serves (2f+1 = 3 Ed25519 signatures
       of the nodes' keys, collected by the block-certifier service `cluster init --app
       chain` enabled; `phalanx.client.chain_light`), and must be the exported chain's
       block at that height. It also shows the head block's certificate (signers, quorum).

Exit 0 (PASS) only if the chain validates, the balances sum to the genesis supply, the
light-client proof verifies to the balance the cluster reports with its header trusted by
a valid certificate (not the f+1 fallback), the restarted replica caught up, and a
transfer was acknowledged after it restarted. Must not import the runtime
or consensus cores (nodes are processes). Not deterministic.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import trio

from phalanx.apps.chain.block import chain_id
from phalanx.apps.chain.tx import public_key
from phalanx.appspec import get as get_app
from phalanx.appspec.chain_app import account_key, key_path, read_genesis
from phalanx.client.async_client import Client, ClientError, open_client
from phalanx.client.chain import ChainClient, ChainCommandError
from phalanx.demo.cluster_demo import DemoFailed, _cause, _statuses, _wait_for
from phalanx.ops.local_cluster import NodeProcesses, find_free_base_port, init_cluster, node_command
from phalanx.ops.node_config import ClusterConfig
from phalanx.protocols import byzantine_mode_problem
from phalanx.protocols import get as protocol_spec
from phalanx.protocols import specs as protocol_specs

APP: Final = "chain"
BYZANTINE_NODE: Final = "n1"
ACCOUNTS: Final = ("a1", "a2", "a3", "a4", "a5")


@dataclass(slots=True, kw_only=True)
class ChainDemoResult:
    protocol: str = ""
    mode: str = ""
    killed: str = ""
    transfers_ok: int = 0
    transfers_refused: int = 0
    transfers_unknown: int = 0
    ok_after_restart: int = 0
    caught_up: bool = False
    catch_up_s: float = 0.0
    height: int = 0
    valid: str = ""
    supply: int = 0
    balances_total: int = -1
    verified: str = ""
    certificate: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return (self.valid.startswith("valid") and self.balances_total == self.supply
                and self.verified.startswith("verified") and "(certificate (" in self.verified
                and self.caught_up
                and self.ok_after_restart > 0)


class _Transfers:
    """Workers sending signed transfers; nonces from a shared per-account counter."""

    def __init__(self, cluster: ClusterConfig, rng: random.Random) -> None:
        self.keys = {a: account_key(key_path(cluster.directory, a)) for a in ACCOUNTS}
        self.chain_id = chain_id(read_genesis(cluster.app_files["genesis"]))
        self.nonces = dict.fromkeys(ACCOUNTS, 0)
        self.rng = rng
        self.ok = self.refused = self.unknown = 0
        self.stopped = False
        self.restarted_at = float("inf")
        self.ok_after_restart = 0

    async def worker(self, client: Client, pause: float = 0.0) -> None:
        chain = ChainClient(client, self.chain_id)
        while not self.stopped:
            await trio.sleep(pause)
            src, dst = self.rng.sample(ACCOUNTS, 2)
            self.nonces[src] += 1
            try:
                await chain.transfer(self.keys[src], public_key(self.keys[dst]),
                                     self.rng.randint(1, 1000), nonce=self.nonces[src])
                self.ok += 1
                if trio.current_time() > self.restarted_at:
                    self.ok_after_restart += 1
            except ChainCommandError:
                self.refused += 1
            except ClientError:
                self.unknown += 1


_T0 = time.monotonic()


def _say(text: str) -> None:
    print(f"[chain demo {time.monotonic() - _T0:5.1f}s] {text}", flush=True)


async def run_chain_demo(args: argparse.Namespace, directory: Path, protocol: str
                         ) -> ChainDemoResult:
    spec = protocol_spec(protocol)
    nodes_n = spec.default_nodes
    cluster = init_cluster(directory / "cluster", protocol=protocol, nodes=nodes_n, app=APP,
                           base_port=find_free_base_port(nodes_n))
    result = ChainDemoResult(protocol=protocol, mode=args.byzantine)

    def command(config_path: Path) -> list[str]:
        argv = node_command(config_path)
        return argv + (["--byzantine", args.byzantine]
                       if config_path.stem == BYZANTINE_NODE else [])

    procs = NodeProcesses(cluster, command=command)
    try:
        await _scenario(args, cluster, procs, result)
    finally:
        _say("stopping the nodes")
        procs.stop(grace=5.0)
    return result


async def _scenario(args: argparse.Namespace, cluster: ClusterConfig, procs: NodeProcesses,
                    result: ChainDemoResult) -> None:
    from phalanx.apps.chain.block import decode_header
    from phalanx.apps.chain.validate import ChainInvalid, decode_blocks, validate_chain
    from phalanx.client.chain_export import fetch_chain, read_export, write_export
    from phalanx.client.chain_light import find_certificate, on_node, verify_from_replica

    nodes = [n.id for n in cluster.nodes]
    genesis = read_genesis(cluster.app_files["genesis"])
    result.supply = sum(b for _, b in genesis.balances)
    _say(f"{result.protocol} chain of {len(nodes)} replicas in {cluster.directory}; "
         f"{BYZANTINE_NODE} runs --byzantine {args.byzantine}")
    procs.start()
    transfers = _Transfers(cluster, random.Random(args.seed))
    async with open_client(cluster, timeout=3.0, attempt_timeout=0.5) as admin:
        await _wait_for("the cluster", trio.current_time() + 30,
                        lambda: _answers(ChainClient(admin)))
        async with trio.open_nursery() as nursery:
            for _ in range(args.workers):
                nursery.start_soon(transfers.worker, admin)
            await trio.sleep(args.warmup)
            statuses = await _statuses(admin, nodes)
            primary = next((s.node for s in statuses.values()
                            if s.role == protocol_spec(result.protocol).leader_role), "")
            victim = next(n for n in reversed(nodes) if n not in (BYZANTINE_NODE, primary))
            result.killed = victim
            _say(f"{transfers.ok} transfers so far; SIGKILL {victim} (primary: {primary})")
            procs.kill(victim)
            await trio.sleep(2.0)
            _say(f"restarting {victim}")
            procs.start([victim])
            transfers.restarted_at = trio.current_time()
            await trio.sleep(3.0)
            transfers.stopped = True
        chain = ChainClient(admin)
        head = (await chain.head()).height
        _say(f"{transfers.ok} transfers acknowledged; head block {head}; waiting for "
             f"{victim} to catch up (one transfer at a time keeps the chain moving)")

        async def caught_up() -> bool:
            try:
                there = await on_node(cluster, victim, lambda c: c.head(stale=True),
                                      call_timeout=1.0)
            except ClientError:
                return False
            return there.height >= head

        transfers.stopped = False
        async with trio.open_nursery() as nursery:
            nursery.start_soon(transfers.worker, admin)
            waiting = trio.current_time()
            try:
                result.caught_up = await _wait_for(f"{victim} to catch up",
                                                   waiting + 30, caught_up)
                result.catch_up_s = trio.current_time() - waiting
            except DemoFailed as e:
                result.notes.append(str(e))
            transfers.stopped = True
        export = cluster.directory / "chain-export.bin"
        write_export(export, genesis, await fetch_chain(chain))
        g, data = read_export(export)
        _say(f"exported {export} ({len(data)} blocks); validating it")
        blocks = decode_blocks(data)
        checked = blocks if isinstance(blocks, ChainInvalid) else validate_chain(g, blocks)
        result.height = checked.height
        result.valid = (f"INVALID: {checked}" if isinstance(checked, ChainInvalid)
                        else f"valid, {checked.height} blocks")
        _say(f"{result.valid}; checking the supply and a light-client proof from {victim}")
        balances = {a: await chain.balance(public_key(transfers.keys[a])) for a in ACCOUNTS}
        result.balances_total = sum(balances.values())
        account = public_key(transfers.keys["a1"])
        v = await verify_from_replica(cluster, genesis, account, victim)
        result.verified = (f"verified on {victim}: a1 = {v.balance} at block "
                           f"{v.header.height if v.header else 0} ({v.trusted_by})" if v.ok
                           else f"NOT verified: {v.reason}")
        if v.ok and v.header is not None and (
                v.header.height > len(data) or decode_header(data[v.header.height - 1].header)
                != dataclasses.replace(v.header, consensus_proof=b"")):
            result.verified = (f"NOT verified: {victim}'s block {v.header.height} is not the "
                               "exported chain's")
        if data:
            last = decode_header(data[-1].header)
            view, source = await find_certificate(cluster, genesis, last)
            result.certificate = (
                f"block {last.height}: {','.join(view.signers)} ({len(view.signers)} of "
                f"{view.nodes}, quorum {view.quorum}) "
                f"{'valid' if view.valid else 'INVALID'}, served by {source}"
                if view is not None else f"block {last.height}: none ({source})")
    result.transfers_ok, result.transfers_refused = transfers.ok, transfers.refused
    result.transfers_unknown = transfers.unknown
    result.ok_after_restart = transfers.ok_after_restart


async def _answers(chain: ChainClient) -> bool:
    try:
        await chain.head()
    except ClientError:
        return False
    return True


def _summary(r: ChainDemoResult) -> str:
    rows = [
        ("protocol", f"{r.protocol}, {BYZANTINE_NODE} Byzantine ({r.mode})"),
        ("transfers ok / refused / unknown",
         f"{r.transfers_ok} / {r.transfers_refused} / {r.transfers_unknown}"),
        ("killed and restarted", r.killed),
        ("transfers ok after the restart", str(r.ok_after_restart)),
        ("restarted replica caught up",
         f"yes, {r.catch_up_s:.1f} s after the transfers stopped" if r.caught_up else "NO"),
        ("exported chain", r.valid),
        ("supply conserved", f"{r.balances_total:,} of {r.supply:,}"),
        ("light client", r.verified),
        ("block certificate", r.certificate),
        ("verdict", "PASS" if r.passed else "FAIL"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k.ljust(width)}  {v}" for k, v in rows + [
        ("note", n) for n in r.notes])


def _protocol(args: argparse.Namespace) -> str:
    """--protocol if given, else the first protocol with Byzantine modes the app suits."""
    if args.protocol is not None:
        return str(args.protocol)
    app = get_app(APP)
    return next(s.name for s in protocol_specs()
                if s.byzantine_modes and app.protocol_problem(s) is None)


def run(args: argparse.Namespace, directory: Path, *, delete: bool) -> int:
    """`phalanx demo --app chain` (`phalanx.appspec.builtin.CHAIN.demo`)."""
    protocol = _protocol(args)
    problem = (get_app(APP).protocol_problem(protocol_spec(protocol))
               or byzantine_mode_problem(protocol_spec(protocol), args.byzantine))
    if problem is not None:
        print(f"phalanx demo: --app chain: {problem}", file=sys.stderr)
        return 2
    start = time.monotonic()
    try:
        result = trio.run(run_chain_demo, args, directory, protocol)
    except (DemoFailed, ClientError, BaseExceptionGroup) as e:
        cause = _cause(e)
        if cause is None:
            raise
        print(f"phalanx demo: FAILED: {cause}", file=sys.stderr)
        return 1
    finally:
        if delete:
            shutil.rmtree(directory, ignore_errors=True)
    print(_summary(result))
    print(f"finished in {time.monotonic() - start:.1f} s")
    return 0 if result.passed else 1
