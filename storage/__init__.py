"""Crash-safe storage: write-ahead log, hard state and checkpoints, on files or in memory
(with fault injection for the simulator). See `interface.py` for the contracts."""
