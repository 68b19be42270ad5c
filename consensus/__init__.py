"""Sans-IO consensus cores and the contract they share (`core.py`), with pure quorum math
(`quorum.py`). Nothing in this package performs I/O, reads a clock or uses global randomness.

Importing the package installs the contract's cheaper constructors (`_fastpath`, private) before
any record is built, whichever submodule a caller imports first."""

from phalanx.consensus import _fastpath as _fastpath
