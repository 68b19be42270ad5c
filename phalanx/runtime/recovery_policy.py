"""The node's `[checkpoint] recovery_target`: whether it applies to the node's checkpoint
policy, and the start-up log line with the interval it chose (docs/KV_STORAGE.md,
"Recovery-time objective"). Owns no state: the measuring is `phalanx.apps.recovery_target`.
"""

from __future__ import annotations

import logging
import time

from phalanx.apps.recovery_target import RecoveryTarget
from phalanx.apps.replica import CheckpointPolicy
from phalanx.ops.node_config import NodeConfig

logger = logging.getLogger("phalanx.runtime.node")


def recovery_target(config: NodeConfig, policy: CheckpointPolicy) -> RecoveryTarget | None:
    """`[checkpoint] recovery_target` as the replica's interval, where checkpoints are a local
    decision. An aligned policy's (PBFT) fall on sequence numbers every replica certifies
    alike, which a locally measured rate cannot choose (docs/KV_STORAGE.md)."""
    target = config.checkpoint.recovery_target
    if target is None:
        return None
    if policy.aligned:
        logger.info("%s: [checkpoint] recovery_target: %s checkpoints every %d sequence "
                    "numbers on every replica alike; the target does not change that",
                    config.id, config.protocol, policy.every_entries)
        return None
    return RecoveryTarget(target, clock=time.perf_counter)


def log_recovery_estimate(node_id: str, recovery: RecoveryTarget | None) -> None:
    """Log what the target chose at start-up (nothing without a target)."""
    if recovery is None:
        return
    est = recovery.estimate()
    logger.info("%s: recovery_target %.3g s: checkpoint %d bytes loads in %.2f s; "
                "interval %d bytes of commands%s", node_id, est.target_seconds,
                est.checkpoint_bytes, est.load_seconds, est.interval_bytes,
                "" if est.feasible else " (the target cannot be held at these "
                "rates: docs/KV_STORAGE.md, Recovery-time objective)")
