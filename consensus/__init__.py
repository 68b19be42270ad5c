"""Sans-IO consensus cores and the contract they share (`core.py`), with pure quorum math
(`quorum.py`). Nothing in this package performs I/O, reads a clock or uses global randomness.

Importing the package imports nothing: each module declares its own records, and the
contract's hot records get their cheaper ``__init__`` where they are declared
(`_raw_init`, private), whichever submodule a caller imports first; the other cheaper
builders are the private `_fastpath`'s. So a client that only needs `types` loads no core."""
