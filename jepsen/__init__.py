"""The fault-injection vocabulary (histories, workloads, nemeses, checkers) and its backends:
the deterministic simulator (`jepsen.sim`) and, later, real local clusters."""
