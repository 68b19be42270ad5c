"""The built-in protocols' registry entries: Raft, PBFT and the leaderless core.

Owns: `RAFT`, `PBFT`, `LEADERLESS` and `SPECS` (what `phalanx.protocols.registry` registers
first). A spec is declarations only; the runtime halves live in `phalanx.protocols.raft_node`,
`phalanx.protocols.pbft_node` and `phalanx.protocols.leaderless_node`, the simulator setups
in `phalanx.jepsen.sim.raft`, `phalanx.jepsen.sim.pbft` and `phalanx.jepsen.sim.leaderless`,
the Byzantine behaviours in `phalanx.jepsen.byzantine` and `phalanx.jepsen.leaderless_byzantine`,
all loaded only when used.
"""

from __future__ import annotations

from phalanx.protocols.spec import CallStrategy, FaultModel, Lazy, ProtocolSpec

RAFT = ProtocolSpec(
    name="raft",
    summary="Raft: a leader replicates a log; tolerates f crashed nodes of 2f+1",
    fault_model=FaultModel.CRASH,
    call_strategy=CallStrategy.LEADER,
    leader_role="leader",
    roles=("follower", "pre_candidate", "candidate", "leader"),
    messages=Lazy("phalanx.consensus.raft.messages:RAFT_MESSAGES"),
    node=Lazy("phalanx.protocols.raft_node:RAFT_NODE"),
    sim=Lazy("phalanx.jepsen.sim.raft:raft_setup"),
    sim_knobs=(
        ("pre_vote", (True, False)),
        ("check_quorum", (True, False)),
        ("election_ticks", (3, 5, 10, 20)),
        ("max_inflight", (1, 4, 64)),
        ("max_batch_entries", (1, 8, 64)),
        ("log_tail_after_compaction", (0, 10, 100)),
        ("checkpoint_every", (25, 100, 400)),
    ),
    sim_bugs=Lazy("phalanx.consensus.raft.bugs:BUG_NAMES"),
    sim_fault_kinds=("membership",),
    demo=Lazy("phalanx.demo.cluster_demo:run_raft_demo"),
    piece_transfer=True,
)

PBFT = ProtocolSpec(
    name="pbft",
    summary="PBFT: a primary orders, 2f+1 replicas agree; tolerates f Byzantine of 3f+1",
    fault_model=FaultModel.BYZANTINE,
    call_strategy=CallStrategy.MATCHING_REPLIES,
    leader_role="primary",
    roles=("primary", "backup", "view_change"),
    messages=Lazy("phalanx.consensus.pbft.messages:PBFT_MESSAGES"),
    node=Lazy("phalanx.protocols.pbft_node:PBFT_NODE"),
    sim=Lazy("phalanx.jepsen.sim.pbft:sim_setup"),
    sim_bugs=Lazy("phalanx.consensus.pbft.bugs:KNOWN_BUGS"),
    signing_keys=True,
    byzantine=Lazy("phalanx.jepsen.byzantine:PBFT_BYZANTINE"),
    byzantine_modes=("silent", "omit", "equivocate", "replay", "mutate", "forge",
                     "bad_checkpoint", "corrupt_reply"),
    demo=Lazy("phalanx.demo.pbft:run"),
    piece_carrier=Lazy("phalanx.protocols.pbft_node:PIECE_CARRIER"),
)

LEADERLESS = ProtocolSpec(
    name="leaderless",
    summary="Leaderless (PnyxDB): clients' signed transactions commit on conditional "
            "endorsements of a quorum; tolerates f Byzantine of 3f+1",
    fault_model=FaultModel.BYZANTINE,
    call_strategy=CallStrategy.ENDORSEMENT,
    leader_role="endorser",  # no leader: every node endorses (what the harness waits for)
    roles=("endorser",),
    messages=Lazy("phalanx.consensus.leaderless.messages:LEADERLESS_MESSAGES"),
    node=Lazy("phalanx.protocols.leaderless_node:LEADERLESS_NODE"),
    sim=Lazy("phalanx.jepsen.sim.leaderless:sim_setup"),
    sim_bugs=Lazy("phalanx.consensus.leaderless.bugs:BUG_NAMES"),
    # (`phalanx.jepsen.sim.leaderless.SIM_KNOBS`, spelled out: a spec loads nothing.)
    sim_knobs=(
        ("delta_old_ms", (200, 1_000)),
        ("checkpoint_ticks", (5, 30)),
        ("rebroadcast_ticks", (5, 20)),
        ("conflict_pct", (0, 10, 30, 60)),
        ("short_pct", (0, 10, 30)),
        ("deadline_max_ms", (400, 1_500)),
        ("short_max_ms", (20, 80)),
        ("hot_jitter_ms", (0, 30)),
        ("mixed_pct", (0, 20, 40)),
    ),
    signing_keys=True,
    byzantine=Lazy("phalanx.jepsen.leaderless_byzantine:LEADERLESS_BYZANTINE"),
    byzantine_modes=("silent", "equivocate", "lie_versions", "forge_conditions",
                     "withhold_veto", "forge_veto", "replay"),
    demo=Lazy("phalanx.demo.leaderless:run"),
    deadline_clock=True,
)

SPECS: tuple[ProtocolSpec, ...] = (RAFT, PBFT, LEADERLESS)
