"""The built-in node services' registry entries: gossip, the block certifier, clustersend,
announce.

Owns: `GOSSIP`, `BLOCK_CERTIFIER`, `CLUSTERSEND`, `ANNOUNCE` and `SPECS`. Declarations
only, each loaded only when used: the gossip machine is `phalanx.gossip`, its runtime driver
`phalanx.services.gossip_node`, its client operations `phalanx.services.gossip_api`, its
demo `phalanx.demo.gossip`; the block certifier's driver is
`phalanx.services.block_certifier`, its client operations `phalanx.services.block_cert_api`;
cluster-sending's driver is `phalanx.services.clustersend_node`, its demo
`phalanx.demo.cross_shard`; announce's driver is `phalanx.services.announce_node`.
"""

from __future__ import annotations

from phalanx.protocols.spec import Lazy
from phalanx.services.spec import ServiceOption, ServiceSpec

ENABLED = ServiceOption(name="enabled", default=True,
                        help="run the service (false keeps the table but turns it off)")
"""Every built-in service's first option (read by `phalanx.services.config.enabled_services`)."""

GOSSIP = ServiceSpec(
    name="gossip",
    summary="signed rumors to every live node (GP spreading, anti-entropy, SWIM membership)",
    options=(
        ENABLED,
        ServiceOption(name="tick_ms", default=25, minimum=1,
                      help="one gossip tick (~ a one-way latency plus processing)"),
        ServiceOption(name="call_timeout", default=2, minimum=1,
                      help="ticks a GP call waits for its ack"),
        ServiceOption(name="anti_entropy_interval", default=10,
                      help="ticks between push-pull digest exchanges (0: never)"),
        ServiceOption(name="rumor_ttl", default=2400, minimum=1,
                      help="ticks a rumor is kept for anti-entropy (a node down longer "
                           "than this misses it; 2400 x 25 ms = 1 minute)"),
        ServiceOption(name="instances", default=1, minimum=1,
                      help="independent waves per batch (f+1 against silent forwarders)"),
        ServiceOption(name="parallel_calls", default=1, minimum=1,
                      help="GP calls a node keeps in flight at once (1: one at a time; "
                           "more over a WAN, where each ack takes a round trip)"),
        ServiceOption(name="balance", default=False,
                      help="hand callees whole intervals (faster with many nodes down)"),
        ServiceOption(name="probe_interval", default=8, minimum=2,
                      help="SWIM: ticks between probes"),
        ServiceOption(name="probe_timeout", default=3, minimum=1,
                      help="SWIM: ticks a direct probe waits before indirect probes"),
        ServiceOption(name="max_payload", default=65536, minimum=1,
                      help="largest rumor payload a client may publish, in bytes"),
        ServiceOption(name="keep_delivered", default=1000, minimum=1,
                      help="deliveries `phalanx gossip status` can show"),
    ),
    messages=Lazy("phalanx.gossip.messages:GOSSIP_MESSAGES"),
    client_messages=Lazy("phalanx.services.gossip_api:GOSSIP_API_MESSAGES"),
    build=Lazy("phalanx.services.gossip_node:build"),
    signing_keys=True,
    demo=Lazy("phalanx.demo.gossip:run"),
)

BLOCK_CERTIFIER = ServiceSpec(
    name="block-certifier",
    summary="signed block certificates: every node signs each block, a quorum certifies it",
    options=(
        ENABLED,
        ServiceOption(name="tick_ms", default=100, minimum=1,
                      help="how often stored certificates are fsynced"),
        ServiceOption(name="keep", default=10_000, minimum=1,
                      help="certificates kept on disk and in memory (the newest)"),
        ServiceOption(name="window", default=256, minimum=1,
                      help="heights around the node's newest block it collects for"),
    ),
    messages=Lazy("phalanx.services.block_cert_api:PEER_MESSAGES"),
    client_messages=Lazy("phalanx.services.block_cert_api:BLOCK_CERT_API_MESSAGES"),
    build=Lazy("phalanx.services.block_certifier:build"),
    signing_keys=True,
)


CLUSTERSEND = ServiceSpec(
    name="clustersend",
    summary="certified values to linked clusters, exactly once (`phalanx cluster link`)",
    options=(
        ENABLED,
        ServiceOption(name="tick_ms", default=20, minimum=1,
                      help="one cluster-sending tick"),
        ServiceOption(name="mode", default="pcs",
                      help="sender/receiver pairs: pcs, permutation or bijective"),
        ServiceOption(name="attempt_timeout", default=25, minimum=1,
                      help="ticks without a proof before the next pair is tried"),
        ServiceOption(name="resubmit", default=25, minimum=1,
                      help="ticks before a received value not yet applied is resubmitted"),
        ServiceOption(name="gc", default=False,
                      help="delete confirmed outbox slots and prune delivered inbox entries "
                      "(off: keep them, e.g. for audits; the cross-shard checkers read them)"),
        ServiceOption(name="gc_batch", default=32, minimum=1,
                      help="with gc: prune a linked cluster's inbox once this many entries "
                      "are delivered"),
    ),
    messages=Lazy("phalanx.services.clustersend_node:CLUSTERSEND_SERVICE_MESSAGES"),
    build=Lazy("phalanx.services.clustersend_node:build"),
    signing_keys=True,
    demo=Lazy("phalanx.demo.cross_shard:run"),
    scenario="cross-shard",
)

ANNOUNCE = ServiceSpec(
    name="announce",
    summary="certified stable checkpoints to linked clusters' nodes (`phalanx cluster link`)",
    options=(
        ENABLED,
        ServiceOption(name="tick_ms", default=100, minimum=1,
                      help="one announce tick (how often the newest checkpoint is read)"),
        ServiceOption(name="interval", default=10, minimum=1,
                      help="ticks between announcements of our newest certified checkpoint"),
        ServiceOption(name="fanout", default=2, minimum=1,
                      help="nodes of each linked cluster every member announces to per round"),
    ),
    messages=Lazy("phalanx.services.announce_node:ANNOUNCE_MESSAGES"),
    client_messages=Lazy("phalanx.services.announce_api:ANNOUNCE_API_MESSAGES"),
    build=Lazy("phalanx.services.announce_node:build"),
    signing_keys=True,
)

SPECS: tuple[ServiceSpec, ...] = (GOSSIP, BLOCK_CERTIFIER, CLUSTERSEND, ANNOUNCE)
