"""The chain's light client over a real cluster: an account's state verified against a
block header the client trusts, with the proof from ONE possibly Byzantine replica.

Owns: `verify_from_replica` (the `phalanx chain verify` flow), `agreed_header` (the header
f+1 replicas report identically), `one_node` / `on_node` (calls to a single replica) and
`certificate_check`, THE plug-in point of block certificates.

Trust, until block certificates exist: a header is trusted when f+1 distinct replicas
(f = the protocol's tolerated faults for the cluster size; at least one of them correct)
report byte-identical headers at that height. `certificate_check(header, genesis)` is
called first; when it returns True/False that decides alone. It returns None today (no
certificate in `BlockHeader.consensus_proof`): the i17-cert branch builds
`phalanx.apps.chain.certificate`; wiring it is replacing this one function's body.

Must not import: the runtime, consensus cores.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TypeVar

import trio

from phalanx.apps.chain.block import BlockHeader, encode_header
from phalanx.apps.chain.light import verify_account
from phalanx.apps.chain.types import AccountProof, Genesis
from phalanx.client.async_client import open_client
from phalanx.client.chain import ChainClient
from phalanx.client.errors import ClientError
from phalanx.ops import pki
from phalanx.ops.node_config import ClusterConfig
from phalanx.protocols import get as protocol_spec

T = TypeVar("T")


def certificate_check(header: BlockHeader, genesis: Genesis) -> bool | None:
    """THE CERTIFICATE PLUG-IN POINT: whether `header.consensus_proof` proves the header
    (a PBFT commit certificate of 2f+1 signatures, Raft's signed term/index), or None when
    the header carries no certificate to check (then `agreed_header`'s f+1 rule decides).
    Block certificates are built in `phalanx.apps.chain.certificate` (branch i17-cert)."""
    return None


@asynccontextmanager
async def one_node(cluster: ClusterConfig, node: str, *, call_timeout: float = 2.0
                   ) -> AsyncIterator[ChainClient]:
    """A chain client whose calls go to replica `node` only (stale reads: its own state)."""
    addr = next((n.client_addr for n in cluster.nodes if n.id == node), None)
    if addr is None:
        known = ", ".join(n.id for n in cluster.nodes)
        raise ValueError(f"no node {node!r} in the cluster (its nodes: {known})")
    context = pki.client_context(cluster.ca, certificate=cluster.client_cert,
                                 private_key=cluster.client_key, check_hostname=False)
    async with open_client([(node, addr.host, addr.port)], ssl_context=context,
                           protocol=cluster.protocol, timeout=call_timeout,
                           attempt_timeout=min(1.0, call_timeout),
                           client_id=pki.new_client_id(cluster.client_cert)) as client:
        yield ChainClient(client)


async def on_node(cluster: ClusterConfig, node: str,
                  call: Callable[[ChainClient], Awaitable[T]], *, call_timeout: float = 2.0) -> T:
    """`call` on a chain client of replica `node` alone; a `ClientError` it raises comes out
    as itself (not wrapped in the client's nursery's ExceptionGroup)."""
    failure: ClientError | None = None
    async with one_node(cluster, node, call_timeout=call_timeout) as chain:
        try:
            return await call(chain)
        except ClientError as e:
            failure = e
    raise failure


def faults(cluster: ClusterConfig) -> int:
    return protocol_spec(cluster.protocol).max_faults(len(cluster.nodes))


async def _ask_header(cluster: ClusterConfig, node: str, height: int,
                      seen: dict[str, BlockHeader]) -> None:
    try:
        block = await on_node(cluster, node, lambda c: c.block(height, stale=True),
                              call_timeout=1.0)
    except ClientError:
        return
    seen[node] = block[0]


async def agreed_header(cluster: ClusterConfig, height: int, *, within: float = 5.0
                        ) -> BlockHeader | None:
    """The header at `height` that f+1 replicas report byte-identically (each asked
    alone), or None when no header reaches f+1 within `within` seconds (replicas behind,
    or lying)."""
    need = faults(cluster) + 1
    deadline = trio.current_time() + within
    while True:
        seen: dict[str, BlockHeader] = {}
        async with trio.open_nursery() as nursery:
            for n in cluster.nodes:
                nursery.start_soon(_ask_header, cluster, n.id, height, seen)
        votes = Counter(encode_header(h) for h in seen.values())
        best = votes.most_common(1)
        if best and best[0][1] >= need:
            return next(h for h in seen.values() if encode_header(h) == best[0][0])
        if trio.current_time() >= deadline:
            return None
        await trio.sleep(0.2)


@dataclass(frozen=True, slots=True, kw_only=True)
class Verified:
    """A light-client verdict: `ok` when the replica's proof binds the account to
    (`balance`, `nonce`) under `header`, a header trusted by `trusted_by`."""

    ok: bool
    account: bytes
    replica: str
    balance: int = 0
    nonce: int = 0
    header: BlockHeader | None = None
    trusted_by: str = ""
    reason: str = ""


async def verify_from_replica(cluster: ClusterConfig, genesis: Genesis, account: bytes,
                              replica: str, *, within: float = 5.0) -> Verified:
    """Ask `replica` alone for the account's proof, trust the header of its height by
    `certificate_check` or else f+1 identical reports, and verify the proof against it."""
    try:
        reply: AccountProof = await on_node(
            cluster, replica, lambda c: c.proof(account, stale=True), call_timeout=within)
    except ClientError as e:
        return Verified(ok=False, account=account, replica=replica,
                        reason=f"{replica} gave no proof: {e}")
    if reply.height == 0:
        return Verified(ok=False, account=account, replica=replica,
                        reason="no block yet: nothing to verify against")
    header = await agreed_header(cluster, reply.height, within=within)
    if header is None:
        return Verified(ok=False, account=account, replica=replica,
                        reason=f"no header at height {reply.height} reported by "
                               f"{faults(cluster) + 1} replicas alike")
    certified = certificate_check(header, genesis)
    if certified is False:
        return Verified(ok=False, account=account, replica=replica, header=header,
                        trusted_by="certificate",
                        reason=f"block {header.height}'s certificate does not verify")
    trusted_by = ("certificate" if certified is not None
                  else f"{faults(cluster) + 1} matching replicas")
    agreed = encode_header(header)
    state = verify_account(
        header=header, account=account, value=reply.value, proof=reply.proof,
        trust_header=lambda h: (certified if certified is not None
                                else encode_header(h) == agreed))
    if state is None or reply.state_root != header.state_root:
        return Verified(ok=False, account=account, replica=replica, header=header,
                        trusted_by=trusted_by,
                        reason=f"{replica}'s proof does not verify against block "
                               f"{header.height}")
    return Verified(ok=True, account=account, replica=replica, balance=state[0],
                    nonce=state[1], header=header, trusted_by=trusted_by)
