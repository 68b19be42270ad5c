"""`phalanx demo`: the single-process crash demo (`local`), a real Raft cluster with a leader
crash (`cluster_demo`), a real PBFT cluster with a Byzantine replica (`pbft`), and their
recorded KV workload (`workload`)."""
