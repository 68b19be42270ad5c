"""The Jepsen harness on real local clusters: fault-injection proxies on every peer link,
nemeses on real node processes, and the runner behind ``phalanx jepsen run``.

Not deterministic (real processes, sockets and clocks); never imported by the simulator.
"""
