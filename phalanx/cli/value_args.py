"""Command-line arguments that carry bytes: ``-`` for stdin, ``@PATH`` for a file.

Owns: `ValueArgs`, shared by `phalanx kv` (values) and `phalanx call` (commands).
Imports only the standard library.
"""

from __future__ import annotations

import os
import sys


class ValueArgs:
    """Where a value argument comes from: ``-`` reads stdin (once per command), ``@PATH``
    reads a file, ``@@TEXT`` is the literal ``@TEXT``; anything else is the argument's bytes."""

    def __init__(self) -> None:
        self._stdin_used = False

    def __call__(self, text: str) -> bytes:
        if text == "-":
            if self._stdin_used:
                raise ValueError("only one value can come from stdin (-)")
            self._stdin_used = True
            return sys.stdin.buffer.read()
        if text.startswith("@@"):
            return os.fsencode(text[1:])
        if text.startswith("@"):
            path = text[1:]
            try:
                with open(path, "rb") as f:
                    return f.read()
            except OSError as e:
                raise ValueError(f"cannot read the value from {path}: "
                                 f"{e.strerror or e} (a literal value starting with @ "
                                 "is written @@...)") from None
        return os.fsencode(text)
