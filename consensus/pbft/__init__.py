"""PBFT (Castro and Liskov, OSDI'99 / TOCS'02) as a sans-IO core.

Public API: `PbftCore`, `PbftConfig`, `PbftRestoredState`, `PbftStatus`, the messages and
`PBFT_MESSAGES` (codec ids), `SafetyRules`, `ReplyCollector`. Modules: `messages`, `config`,
`log`, `checkpoint`, `view_change`, `safety`, `core` (with its base classes `view_flow` and
`checkpoint_flow`), `requests` (client requests, adaptive batching), `transfer` (catch-up),
`durable` (incremental persistence of the durable record), `client`.
"""

from phalanx.consensus.pbft.client import ReplyCollector
from phalanx.consensus.pbft.config import KNOWN_BUGS, PbftConfig
from phalanx.consensus.pbft.core import PbftCore, PbftRestoredState, PbftStatus
from phalanx.consensus.pbft.messages import PBFT_MESSAGES, PbftDurableState, PbftMessage
from phalanx.consensus.pbft.safety import SafetyRules, SafetyViolation

__all__ = [
    "KNOWN_BUGS",
    "PBFT_MESSAGES",
    "PbftConfig",
    "PbftCore",
    "PbftDurableState",
    "PbftMessage",
    "PbftRestoredState",
    "PbftStatus",
    "ReplyCollector",
    "SafetyRules",
    "SafetyViolation",
]
