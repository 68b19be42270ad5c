"""Raft (Ongaro, "Consensus: Bridging Theory and Practice", 2014), sans-IO."""
