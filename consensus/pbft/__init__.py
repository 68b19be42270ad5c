"""PBFT (Castro and Liskov, OSDI'99 / TOCS'02) as a sans-IO core.

Public API: `PbftCore`, `PbftConfig`, `PbftBugs` (deliberate bugs, `KNOWN_BUGS` their
names), `PbftRestoredState`, `PbftStatus`, the messages and `PBFT_MESSAGES` (codec ids),
`SafetyRules`, `ReplyCollector`. Modules: `core` (composes the sub-machines `vote_flow`,
`request_flow`, `view_flow`, `checkpoint_flow` over the state they share, `shared`),
`messages`, `config`, `bugs`, `log`, `checkpoint`, `view_change`, `safety`, `requests`
(client requests, adaptive batching), `transfer` (catch-up), `durable` (incremental
persistence of the durable record), `client`.
"""

from phalanx.consensus.pbft.bugs import KNOWN_BUGS, NO_BUGS, PbftBugs
from phalanx.consensus.pbft.client import ReplyCollector
from phalanx.consensus.pbft.config import PbftConfig
from phalanx.consensus.pbft.core import PbftCore, PbftRestoredState, PbftStatus
from phalanx.consensus.pbft.messages import PBFT_MESSAGES, PbftDurableState, PbftMessage
from phalanx.consensus.pbft.safety import SafetyRules, SafetyViolation

__all__ = [
    "KNOWN_BUGS",
    "NO_BUGS",
    "PBFT_MESSAGES",
    "PbftBugs",
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
