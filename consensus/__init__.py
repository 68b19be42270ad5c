"""Sans-IO consensus cores and the contract they share (`core.py`), with pure quorum math
(`quorum.py`). Nothing in this package performs I/O, reads a clock or uses global randomness."""
