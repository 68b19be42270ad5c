"""One phalanx node under trio: storage + replica + core + driver + peer transport + client
port + metrics, built from a `NodeConfig`. The public embedding API of the runtime.

Owns: `open_node` (an async context manager yielding a running `Node`), `serve_node` (the
same, following trio's `task_status` convention) and the assembly of the parts (`Node`, the
handle with its status, statistics and bound addresses, is `phalanx.runtime.node_handle`'s,
re-exported here): it opens the node's storage and loads its durable
state (`phalanx.runtime.persistence`), restores the replica from its newest checkpoint (the core
re-emits the committed entries after it), builds the Raft core, the mTLS peer transport
(`phalanx.net.transport`), the TLS client port (`phalanx.runtime.client_port`), the Prometheus
endpoint (`phalanx.runtime.metrics`) and the node services (`phalanx.runtime.services`), and
runs `phalanx.runtime.driver.Driver` over them.

Embedding example (see `examples/counter_service.py` for a complete one)::

    async with open_node(load_node_config(path), state_machine=MyMachine()) as node:
        print(node.status())
        await trio.sleep_forever()

Rules: the node never pickles; everything on the wire and on disk goes through the codec.
Leaving the `async with` shuts down cleanly (a deferred commit-only hard state is written,
the checkpoint writer finishes, storage is closed). A crash (SIGKILL) at any instant loses
nothing acknowledged: a client is answered only after the entry is applied, and applied
entries were durable on a quorum before they committed.

Must not import: the CLI (`phalanx.cli.main`), the client library.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio

from phalanx.apps import kv_wire  # noqa: F401  (registers the KV types with the codec)
from phalanx.apps.gc_pacer import GcPacer
from phalanx.apps.interface import StateMachine
from phalanx.apps.replica import Replica
from phalanx.apps.writer import ThreadedCheckpointWriter
from phalanx.appspec import AppConfigError, UnknownApp
from phalanx.appspec import get as get_app
from phalanx.consensus.core import CoreStatus
from phalanx.consensus.types import Configuration, HardState, NodeId
from phalanx.net import client_protocol, wire
from phalanx.net.client_protocol import StatusReply
from phalanx.net.codec import DecodeError
from phalanx.net.conn_gate import LISTEN_BACKLOG, max_peer_sockets
from phalanx.net.transport import Backoff, PeerAddress, Transport, run_peer_transport
from phalanx.ops import admin_messages, ops_messages
from phalanx.ops.link import LinkError, intercluster_for, load_links
from phalanx.ops.node_config import NodeConfig, check_files
from phalanx.ops.pki import (
    CredentialPaths,
    client_server_context,
    peer_client_context,
    peer_server_context,
)
from phalanx.protocols import ProtocolError, UnknownProtocol
from phalanx.protocols import get as get_protocol
from phalanx.protocols.registry import byzantine_mode_problem
from phalanx.protocols.spec import TransactionalNode
from phalanx.runtime import piece_messages, piece_transfer
from phalanx.runtime.admin_ops import AdminOps
from phalanx.runtime.client_port import (
    DEFAULT_MAX_CONNECTIONS,
    ClientPort,
    client_frame_limit,
)
from phalanx.runtime.descriptors import (
    DescriptorError,
    client_connection_cap,
    open_descriptors,
    raise_nofile_limit,
)
from phalanx.runtime.driver import Driver
from phalanx.runtime.fault_hooks import control_file, watch_clock_rate
from phalanx.runtime.group_commit import GroupCommitter
from phalanx.runtime.health import HealthState, LinkCollector, serve_http, watch_health
from phalanx.runtime.identity import IdentityError, adopt_rotated_identity, amnesia
from phalanx.runtime.local_submit import LocalSubmitter
from phalanx.runtime.metrics import NodeMetrics
from phalanx.runtime.node_checks import NodeError as NodeError  # re-exported: public API
from phalanx.runtime.node_checks import (
    check_identity,
    check_node_certificate,
    check_piece_memory,
    check_tls_credentials,
    record_membership,
    record_verdict,
)
from phalanx.runtime.node_handle import Node as Node  # re-exported: public API
from phalanx.runtime.node_handle import NodeStatistics as NodeStatistics  # re-exported
from phalanx.runtime.node_handle import bound_address
from phalanx.runtime.operator_ops import OperatorOps, reload_contexts, reload_on_sighup
from phalanx.runtime.peer_links import PeerLinks
from phalanx.runtime.persistence import LostStateError, ReadyPersister
from phalanx.runtime.phase_trace import phase_trace_from_env
from phalanx.runtime.piece_carrier import CarrierLink
from phalanx.runtime.piece_manifest import ManifestViews, PieceStore
from phalanx.runtime.piece_transfer import PieceTransfer
from phalanx.runtime.recovery_policy import log_recovery_estimate, recovery_target
from phalanx.runtime.services import ServiceHost
from phalanx.runtime.stable_checkpoints import StableCheckpoints
from phalanx.services import ServiceError
from phalanx.storage.interface import SyncPolicy
from phalanx.storage.lock import DirectoryLocked, lock_data_dir
from phalanx.storage.volatile import open_node_storage

logger = logging.getLogger(__name__)

COMPACT_LAG = 1000
"""WAL entries kept below a durable checkpoint, so lagging followers catch up from the log."""


PIPELINE_DEPTH = 2
"""AppendEntries in flight per follower (Raft's `max_inflight`).

Small on purpose: entries proposed while a follower's window is full wait at the leader and
leave together in the next AppendEntries when an answer frees a slot, so the follower writes
them with one fsync and answers once. With a deep window every write travels alone (one
message, one answer, one follower batch each) and a CPU-bound node serves ~5x fewer writes
(docs/BENCHMARKS.md, design measurements). Two keeps one message in flight while the next
batch fills."""


PEER_BACKOFF = Backoff(base=0.05, cap=0.5)
"""Redial delays to a peer: a cluster is a handful of nodes, so a dead peer is cheap to retry
every half second, and a restarted one is back within that (sooner when it dials us first:
the transport redials on its inbound connection)."""


@asynccontextmanager
async def open_node(
    config: NodeConfig,
    *,
    state_machine: StateMachine | None = None,
    rng: random.Random | None = None,
    byzantine: str | None = None,
    gc_pacer: GcPacer | None = None,
    bootstrap: bool = False,
) -> AsyncIterator[Node]:
    """Run node `config` for the body of the `async with`; yields the running `Node`.

    Args:
        state_machine: the replicated application (default: the config's ``app``, built by
            its `AppSpec` from its ``[app]`` files; the KV store unless told). Every node of
            a cluster must run the same one.
        rng: randomness for election timeouts and reconnect jitter (default: OS-seeded).
        byzantine: a Byzantine mode (the protocol's `ProtocolSpec.byzantine_modes`; only a
            protocol that tolerates Byzantine replicas has them): this node lies on purpose.
            For tests and demos; the behaviours (`phalanx.jepsen`) are imported only then.
        gc_pacer: keep the cyclic GC's full passes off a large state
            (`phalanx.apps.gc_pacer`; process-global, so opt-in: `phalanx node run` uses one).
        bootstrap: an empty data directory without an IDENTITY file is a new node of a new
            cluster (not a lost disk). `phalanx.runtime.identity.prepare_data_dir` (which `phalanx
            cluster init` runs) marks a new node's directory instead.

    Raises:
        NodeError: an unknown protocol, bad signing keys, a Byzantine mode the protocol
            lacks, a
            data directory another process holds (`phalanx.storage.lock`), a lost durable
            state on a node with no peers.
            Storage errors (`StorageError`) propagate.
        ConfigError: a certificate or key file is missing or unreadable (`check_files`).
    """
    check_files(config)  # named before the storage is opened
    try:
        spec = get_protocol(config.protocol)
    except UnknownProtocol as e:
        raise NodeError(f"{config.source or config.id}: {e}") from None
    problem = None if byzantine is None else byzantine_mode_problem(spec, byzantine)
    if problem is not None:
        raise NodeError(f"{config.source or config.id}: --byzantine {byzantine}: {problem}")
    check_node_certificate(config)
    check_tls_credentials(config)
    if config.client_auth == "none":
        logger.warning("%s: INSECURE: [client] auth = \"none\": the client port does not "
                       "authenticate clients; anyone who can reach %s may read and write",
                       config.id, config.client_listen)
    protocol = spec.node.load()
    wire.register_all(spec.messages.load())
    client_protocol.register()
    admin_messages.register()
    ops_messages.register()
    piece_messages.register()
    nofile = raise_nofile_limit()  # connections are capped below it, with a storage reserve
    rng = rng if rng is not None else random.Random()
    try:
        app = get_app(config.app)
        problem = app.protocol_problem(spec)
        if problem is not None:
            raise NodeError(f"{config.source or config.id}: {problem}")
        machine = (state_machine if state_machine is not None
                   else app.build_machine(config.app_files))
    except (UnknownApp, AppConfigError) as e:
        raise NodeError(f"{config.source or config.id}: {e}") from None
    lies = None
    if byzantine is not None and spec.byzantine is not None:
        lies = spec.byzantine.load()
        machine = lies.wrap_machine(machine, byzantine, rng)
    config.data_dir.mkdir(parents=True, exist_ok=True)
    try:  # before anything in the directory is read (`phalanx.storage.lock`)
        dir_lock = lock_data_dir(str(config.data_dir))
    except DirectoryLocked as e:
        raise NodeError(f"{config.id}: {e}") from None
    try:
        identity, cluster_id = check_identity(config)
        storage = open_node_storage(str(config.data_dir), sync=SyncPolicy(config.fsync),
                                    keep_checkpoints=config.checkpoint.keep,
                                    piece_memory=check_piece_memory(config))
    except BaseException:
        dir_lock.release()
        raise
    core_state = None
    replica: Replica | None = None
    operator: OperatorOps | None = None
    metrics_server: Any = None
    try:
        if storage.wal.recovery.torn_path is not None:
            logger.warning("%s: cut a torn WAL tail in %s (%s)", config.id,
                           storage.wal.recovery.torn_path, storage.wal.recovery.torn_reason)
        core_state = protocol.open_core_state_store(config, SyncPolicy(config.fsync))
        # Shard-level state transfer: the core relays piece manifests, not checkpoints.
        piece_store = (storage.checkpoints if piece_transfer.enabled(os.environ)
                       and isinstance(storage.checkpoints, PieceStore) else None)
        carrier = spec.piece_carrier.load() if spec.piece_carrier and piece_store else None
        pieced = spec.piece_transfer and piece_store is not None
        relayed = ManifestViews(storage.checkpoints) if pieced else storage.checkpoints
        persister = ReadyPersister(wal=storage.wal, hard_state=storage.hard_state,
                                   checkpoints=relayed, codec=wire.default_registry(),
                                   core_state=core_state.store if core_state else None)
        try:  # with peers, a log lost to corruption is recovered from them
            durable = persister.load(recover_lost=bool(config.peers))
        except LostStateError as e:
            raise NodeError(f"{config.id}: the durable state in {config.data_dir} is lost "
                            f"({e}) and this node has no peers to recover from; restore a "
                            "backup of the data directory") from None
        for problem in durable.problems:
            logger.warning("%s: skipped a corrupt checkpoint: %s", config.id, problem)
        verdict = amnesia(
            identity=identity,
            has_state=(durable.hard_state is not None or durable.snapshot is not None
                       or bool(durable.entries) or durable.core_state is not None),
            has_hard_state=durable.hard_state is not None or durable.core_state is not None,
            state_lost=durable.lost_reason, bootstrap=bootstrap,
            single_voter=len(config.members()) == 1)
        durable = dataclasses.replace(durable, recovering=verdict.recovering)
        voters = tuple(NodeId(m) for m in config.members())
        transactions = (protocol.transaction_layer(config)
                        if isinstance(protocol, TransactionalNode) else None)
        policy = protocol.checkpoint_policy(config, compact_lag=COMPACT_LAG)
        replica = Replica(
            machine,
            checkpoints=storage.checkpoints,
            wal=storage.wal,
            decode_entry=wire.decode_entry,
            writer=ThreadedCheckpointWriter(relayed),
            policy=policy,
            recovery=recovery_target(config, policy),
            config=Configuration(voters=voters),
            gc_pacer=gc_pacer,
            transactions=transactions,
            proposer_of=spec.proposer_function(config.members()),
        )
        # Only the checkpoint: the core re-emits the committed entries after it. A
        # transactional core's log holds only committed entries and its record forgets
        # applied ones (GC), so its replica replays the whole WAL (as the simulator does).
        replica.restore_latest(replay_upto=None if transactions is not None else 0)
        log_recovery_estimate(config.id, replica.recovery)
        try:
            built = protocol.build_core(config, durable=durable, rng=rng, byzantine=byzantine,
                                        pipeline_depth=PIPELINE_DEPTH, replica=replica)
            core = built.core
            if lies is not None and byzantine is not None:
                core = lies.wrap_core(core, byzantine, config=config, rng=rng)
        except ProtocolError as e:
            raise NodeError(str(e)) from None
        verdict = record_verdict(config, cluster_id, identity, verdict,
                                  recovering=core.status().recovering)
        logger.info("%s: restored term=%d checkpoint=%d log=%d entries", config.id,
                    (durable.hard_state or HardState()).term,
                    durable.snapshot.index if durable.snapshot else 0, len(durable.entries))
        pieces = PieceTransfer(
            store=storage.checkpoints,
            peers=[NodeId(p.id) for p in config.peers],
            send=lambda to, m: transport.send_nowait(to, m), flush=lambda: transport.flush(),
            rng=random.Random(rng.getrandbits(64))) if pieced or carrier else None
        link = (CarrierLink(carrier, pieces, storage.checkpoints)
                if carrier is not None and pieces is not None else None)
        committer = GroupCommitter(persister, install=(
            replica.install if pieces is None else pieces.install_with(replica.install)),
                                   saved=durable.hard_state,
                                   overlap_wal_sync=True)  # the journal has its own directory
        paths = CredentialPaths(certificate=config.tls.cert, private_key=config.tls.key,
                                ca_certificate=config.tls.ca)
        try:  # linked clusters' nodes: the inter-cluster path only (`phalanx.ops.link`)
            intercluster = intercluster_for(config, load_links(config))
        except LinkError as e:
            raise NodeError(f"{config.id}: {e}") from None
        metrics = NodeMetrics(config.id)
        # A small accept backlog: a flood's excess SYNs are dropped by the kernel, not
        # queued for handshakes long after their clients gave up (`conn_gate`).
        peer_listeners = await trio.open_tcp_listeners(
            config.peer_listen.port, host=config.peer_listen.host, backlog=LISTEN_BACKLOG)
        client_listeners = await trio.open_tcp_listeners(
            config.client_listen.port, host=config.client_listen.host, backlog=LISTEN_BACKLOG)
        peers = {NodeId(p.id): PeerAddress(host=p.peer_addr.host, port=p.peer_addr.port)
                 for p in config.peers}
        tls_contexts = (peer_server_context(paths), peer_client_context(paths),
                        client_server_context(paths,
                                              require_client_cert=config.client_auth != "none"))
        transport = Transport(
            node_id=NodeId(config.id),
            peers=peers,
            server_context=tls_contexts[0],
            client_context=tls_contexts[1],
            encode=wire.encode,
            decode=wire.decode,
            decode_error=DecodeError,
            rng=random.Random(rng.getrandbits(64)),
            backoff=PEER_BACKOFF,
            hold_sends=True,
            intercluster=intercluster,
        )

        # A protocol that changes membership at run time: links follow its configuration.
        links = (PeerLinks(NodeId(config.id), transport, peers)
                 if hasattr(protocol, "admin_input") else None)

        def status_reply(nonce: int, status: CoreStatus, replica: Replica) -> StatusReply:
            rs = replica.status()
            own = (links.peers() if links is not None
                   else tuple(sorted(p.id for p in config.peers)))
            return StatusReply(
                nonce=nonce, node=config.id, protocol=config.protocol, role=status.role,
                term=status.term, leader=status.leader, commit_index=status.commit_index,
                applied_index=rs.applied_index, last_checkpoint=rs.checkpoint_index,
                peers=own,
                # The transport's link state, not "heard from recently": followers
                # never message each other, yet each is connected to the other.
                connected_peers=tuple(str(p) for p in transport.connected_peers()
                                      if p in own),  # not linked clusters' nodes
                dropped_messages=sum(status.dropped.values())
                + driver.stats.dropped_peer_messages,
                client_auth=config.client_auth,
            )

        base_send = transport.send_nowait if links is None else links.send
        driver = Driver(core=core, replica=replica, committer=committer,
                        send=(base_send if link is None else link.outgoing(base_send)),
                        tick_seconds=config.timing.tick_ms / 1000,
                        status_reply=status_reply, observer=metrics,
                        persist_inline=config.fsync == "off",
                        idle_inline=True,
                        propose_batch=built.propose_batch,
                        trace=phase_trace_from_env(config.id),
                        output_pending=lambda: (transport.has_backlog()
                                                or client_port.has_backlog()),
                        after_pass=lambda: client_port.flush(), flush_sends=transport.flush,
                        lazy=built.lazy, supersedes=built.supersedes,
                        idle_stride=config.timing.heartbeat_ticks,
                        fresh_clock=spec.deadline_clock)
        try:
            submitter = LocalSubmitter(config.id, random.Random(rng.getrandbits(64)))
            services = ServiceHost(config, transport=transport,
                                   rng=random.Random(rng.getrandbits(64)), machine=machine,
                                   submit=submitter.submit,
                                   checkpoint=StableCheckpoints(storage.checkpoints, replica))
        except ServiceError as e:
            raise NodeError(f"{config.source or config.id}: {e}") from None
        secure = config.client_auth != "none"
        try:
            max_clients = client_connection_cap(
                soft_limit=nofile, in_use=open_descriptors(),
                other_sockets=max_peer_sockets(len(peers)) + len(peers),
                wanted=DEFAULT_MAX_CONNECTIONS)
        except DescriptorError as e:
            raise NodeError(f"{config.id}: {e}") from None
        def reload_tls() -> str:
            expires = reload_contexts(tls_contexts, paths)
            try:  # a CA bundle mid-rotation: record the new CA as the cluster's identity
                adopt_rotated_identity(config.data_dir, config.tls.ca)
            except IdentityError as e:
                raise ValueError(str(e)) from None
            return expires

        operator = OperatorOps(node_id=config.id, replica=replica,
                               data_dir=config.data_dir, reload=reload_tls)
        client_port = ClientPort(
            driver, ssl_context=tls_contexts[2],
            node_id=config.id, batch_replies=True, require_client_auth=secure,
            max_frame_size=client_frame_limit(replica.max_command_bytes),
            max_connections=max_clients, services=services,
            admin=AdminOps(driver, config.id, protocol, config.protocol, operator=operator))
        logger.info("%s: open-file limit %d: up to %d client connections (request frames "
                    "<= %d bytes), %d peer sockets", config.id, nofile, max_clients,
                    client_port.max_frame_size, max_peer_sockets(len(peers)))
        node = Node(config=config, driver=driver, transport=transport,
                    client_port=client_port, metrics=metrics,
                    peer_address=bound_address(peer_listeners, config.peer_listen.host),
                    client_address=bound_address(client_listeners, config.client_listen.host))
        node.services = services.services
        node.pieces = pieces
        metrics.registry.register(services.collector())

        def byte_counters() -> dict[str, int]:
            t, c, d = transport.statistics(), client_port.stats, driver.stats
            return {"peer_bytes_in": t.bytes_in, "peer_bytes_out": t.bytes_out,
                    "client_bytes_in": c.bytes_in, "client_bytes_out": c.bytes_out,
                    "peer_queue_drops": t.queue_full_drops,
                    "driver_steps": d.steps, "driver_io_batches": d.io_batches,
                    "driver_proposal_batches": d.proposal_batches,
                    "driver_client_redirects": d.redirects,
                    "driver_client_retries": d.retries,
                    "driver_duplicate_calls": d.duplicate_calls,
                    "driver_overloaded_calls": d.overloaded_calls,
                    "driver_slow_passes": d.slow_passes,
                    "driver_lazy_messages": d.lazy_messages,
                    "driver_superseded_messages": d.superseded_messages,
                    "driver_refused_calls": d.refused_calls,
                    "client_connections_shed": client_port.gate.stats.shed_full,
                    "client_handshakes_shed": client_port.gate.stats.shed_pending,
                    "client_handshake_rate_waits": client_port.gate.stats.rate_waits,
                    "client_budget_closes": c.budget_closes,
                    "peer_connections_shed": t.connections_shed,
                    "peer_frames_out": t.frames_out,
                    "peer_direct_write_calls": t.direct_write_calls}

        metrics.add_byte_source(byte_counters)
        metrics.add_byte_source(lambda: {  # client authentication and authorization
            "client_handshake_failures": client_port.stats.handshake_failures,
            "client_unauthenticated": client_port.stats.unauthenticated,
            "client_forbidden_calls": client_port.stats.forbidden_calls,
            "client_forbidden_subscriptions": client_port.stats.forbidden_subscriptions})
        health = HealthState(peers=tuple(sorted(p.id for p in config.peers)))
        metrics.registry.register(LinkCollector(config.id, health))
        if config.metrics_listen is not None:  # /metrics, /health, /ready
            metrics_server, node.metrics_port = serve_http(
                metrics.registry, health, config.metrics_listen.host,
                config.metrics_listen.port)

        # Peer messages go from the reading tasks straight to the driver: stepped in the
        # reading task while the core loop is idle (`driver_inline`), else into its channel.
        deliver = services.route(driver.deliver_inline)
        if link is not None:
            deliver = link.incoming(deliver)
        if pieces is not None:
            driver.fetch_pieces_with(pieces)
            deliver = pieces.route(deliver)
            metrics.add_byte_source(pieces.counters)
        transport.set_deliver(deliver, after_read=driver.end_inline_pass)
        async with run_peer_transport(transport, listeners=peer_listeners), \
                trio.open_nursery() as nursery:
            await nursery.start(driver.run)
            await nursery.start(client_port.serve, client_listeners)
            await nursery.start(services.run)
            await nursery.start(submitter.run, driver)
            if pieces is not None:
                await nursery.start(pieces.run)
            if link is not None:
                await nursery.start(link.run, driver.deliver)
            nursery.start_soon(record_membership, config, cluster_id, driver,
                               verdict.next_state, persister)
            if links is not None:
                nursery.start_soon(links.watch, driver.status)
            nursery.start_soon(functools.partial(
                watch_health, health, status=driver.status,
                applied_index=lambda: replica.applied_index if replica else 0,
                linked=lambda: map(str, transport.connected_peers()), spec=spec))
            nursery.start_soon(reload_on_sighup, config.id, reload_tls)
            if (ctl := control_file(config.id)) is not None:
                nursery.start_soon(watch_clock_rate, ctl, driver.set_clock_rate)
            logger.info("%s: serving peers on %s, clients on %s", config.id,
                        node.peer_address, node.client_address)
            try:
                yield node
            finally:
                nursery.cancel_scope.cancel()
        driver.flush_on_shutdown()
        logger.info("%s: stopped", config.id)
    finally:
        if metrics_server is not None:
            metrics_server.shutdown()
            metrics_server.server_close()
        if operator is not None:
            operator.close()
        if replica is not None:
            replica.close()
        if core_state is not None:
            core_state.close()
        storage.close()
        dir_lock.release()


async def serve_node(
    config: NodeConfig,
    *,
    state_machine: StateMachine | None = None,
    byzantine: str | None = None,
    gc_pacer: GcPacer | None = None,
    bootstrap: bool = False,
    task_status: trio.TaskStatus[Node] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run node `config` until cancelled; `task_status.started(node)` once it is serving.

    Example::

        async with trio.open_nursery() as nursery:
            node = await nursery.start(serve_node, config)
    """
    async with open_node(config, state_machine=state_machine, byzantine=byzantine,
                         gc_pacer=gc_pacer, bootstrap=bootstrap) as node:
        task_status.started(node)
        await trio.sleep_forever()
