"""Cluster-sending: a certified value one fault-tolerant cluster agreed on reaches another
cluster exactly once, with proof (issue 18; protocols.md §2; docs/CLUSTER_SENDING.md).

Modules: `messages` (wire types, codec ids 600-629), `certificates` (what a cluster signs, how
another cluster verifies it with public material only), `pairs` (PCS, permutation and
bijective sender/receiver schedules from an agreed seed), `machine` (`ClusterSendMachine`:
the one entry point `step`), `sim` and `byzantine` (the multi-cluster simulator, its
Byzantine behaviours and its checker). Everything is sans-IO (the simulator too: virtual
time, seeded faults). `Receive`, `Tick` and `Send` are the cores' own
(`phalanx.consensus.core`), re-exported for drivers.
"""

from phalanx.clustersend.certificates import (
    ClusterInfo,
    certify,
    check_certificate,
    check_proof,
)
from phalanx.clustersend.machine import (
    BUGS,
    ClusterSendConfig,
    ClusterSendInput,
    ClusterSendMachine,
    ClusterSendReady,
    Confirmed,
    Outbound,
    SendCrypto,
)
from phalanx.clustersend.messages import (
    CLUSTERSEND_MESSAGES,
    AckProof,
    AckStatement,
    Certificate,
    CertKind,
    CommitNotice,
    CsAck,
    CsConfirm,
    CsEcho,
    CsQuery,
    CsSend,
    Inbound,
    MemberSignature,
    SendStatement,
    value_digest,
)
from phalanx.clustersend.pairs import Mode, link_seed, schedule
from phalanx.consensus.core import Receive, Send, Tick

__all__ = [
    "BUGS",
    "CLUSTERSEND_MESSAGES",
    "AckProof",
    "AckStatement",
    "CertKind",
    "Certificate",
    "ClusterInfo",
    "ClusterSendConfig",
    "ClusterSendInput",
    "ClusterSendMachine",
    "ClusterSendReady",
    "CommitNotice",
    "Confirmed",
    "CsAck",
    "CsConfirm",
    "CsEcho",
    "CsQuery",
    "CsSend",
    "Inbound",
    "MemberSignature",
    "Mode",
    "Outbound",
    "Receive",
    "Send",
    "SendCrypto",
    "SendStatement",
    "Tick",
    "certify",
    "check_certificate",
    "check_proof",
    "link_seed",
    "schedule",
    "value_digest",
]
