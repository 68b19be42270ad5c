"""How `phalanx kv` prints a result: text for people, JSON for scripts.

Owns: `print_result` (a decoded KV result to stdout in the chosen format, returning the
command's exit status), `escape_field` (the text format's escaping) and `json_bytes`.

Text format: a value is written as its bytes followed by a newline (``--raw``: the bytes
alone, nothing added); `scan` lines are ``KEY<TAB>VALUE`` with backslash, tab, newline and
carriage return escaped as ``\\\\``, ``\\t``, ``\\n``, ``\\r`` in both fields, so every line is one
pair whatever the bytes (``--keys-only``: keys alone, escaped alike).
JSON format (``-o json``): one object per line; a byte string is ``{"value": TEXT,
"encoding": "utf-8"}`` when it is UTF-8, else ``{"value": BASE64, "encoding": "base64"}``.
`scan` prints one object per key (JSON Lines). Errors stay one line on stderr in both formats.

Imports nothing heavy: only the KV result types and the exit codes.
"""

from __future__ import annotations

import base64
import os
import sys
from typing import Final

from phalanx.apps.kv_types import (
    CasResult,
    Deleted,
    Done,
    KvCommand,
    KvError,
    KvResult,
    ScanResult,
    TxnResult,
    Value,
    VersionResult,
)
from phalanx.cli.errors import EXIT_REFUSED

EXIT_OK: Final = 0
EXIT_NEGATIVE: Final = 1
FORMATS: Final = ("text", "json")
_ESCAPES: Final = {ord("\\"): b"\\\\", ord("\t"): b"\\t", ord("\n"): b"\\n", ord("\r"): b"\\r"}


def escape_field(data: bytes) -> bytes:
    """`data` with backslash, tab, newline and CR escaped (the text format of `scan`)."""
    if not any(b in data for b in (b"\\", b"\t", b"\n", b"\r")):
        return data
    return b"".join(_ESCAPES.get(c, bytes((c,))) for c in data)


def json_bytes(data: bytes | None) -> dict[str, object] | None:
    """A byte string as JSON: UTF-8 text when it is UTF-8, else base64 (None stays None)."""
    if data is None:
        return None
    try:
        return {"value": data.decode("utf-8"), "encoding": "utf-8"}
    except UnicodeDecodeError:
        return {"value": base64.b64encode(data).decode("ascii"), "encoding": "base64"}


def _emit(doc: dict[str, object]) -> None:
    import json  # (-o json only: the text output imports no more than it needs)

    sys.stdout.write(json.dumps(doc, sort_keys=True) + "\n")
    sys.stdout.flush()


def _key(command: KvCommand) -> str:
    return str(getattr(command, "key", ""))


def _not_found(command: KvCommand) -> int:
    print(f"phalanx kv: not found: {_key(command)}", file=sys.stderr)
    return EXIT_NEGATIVE


def print_result(
    command: KvCommand,
    result: KvResult,
    *,
    fmt: str = "text",
    as_set: bool = False,
    raw: bool = False,
    keys_only: bool = False,
) -> int:
    """Print `result` of `command` and return the exit status (`as_set`: the `Value` of a
    get is a set, printed one member a line; `raw`: a get's value without the newline;
    `keys_only`: a scan's keys without values)."""
    as_json = fmt == "json"
    out = sys.stdout.buffer
    if as_set and isinstance(result, Value):  # absent: the empty set
        from phalanx.apps.kv_ops import decode_set

        members = decode_set(result.value)
        if members is None:
            print(f"phalanx kv: refused: the value of {_key(command)!r} is not a set",
                  file=sys.stderr)
            return EXIT_REFUSED
        if as_json:
            _emit({"key": _key(command), "members": [json_bytes(m) for m in members]})
        else:
            out.write(b"".join(m + b"\n" for m in members))
            out.flush()
        return EXIT_OK
    match result:
        case KvError():
            print(f"phalanx kv: refused: {result.message}", file=sys.stderr)
            return EXIT_REFUSED
        case Done():
            if as_json:
                _emit({"ok": True})
            return EXIT_OK
        case Value(value=None):
            if as_json:
                _emit({"key": _key(command), "value": None})
            return _not_found(command)
        case Value(value=bytes() as value):
            if as_json:
                _emit({"key": _key(command), **(json_bytes(value) or {})})
            else:
                out.write(value if raw else value + b"\n")
                out.flush()
            return EXIT_OK
        case Deleted(existed=existed):
            if as_json:
                _emit({"key": _key(command), "deleted": existed})
            return EXIT_OK if existed else _not_found(command)
        case CasResult(succeeded=succeeded, current=current):
            if as_json:
                _emit({"key": _key(command), "succeeded": succeeded,
                       "current": json_bytes(current)})
            if not succeeded:
                shown = "(absent)" if current is None else os.fsdecode(current)
                print(f"phalanx kv: cas failed: current value is {shown}", file=sys.stderr)
            return EXIT_OK if succeeded else EXIT_NEGATIVE
        case ScanResult(items=items, more=more):
            if as_json:
                for key, value in items:
                    _emit({"key": key} if keys_only else {"key": key, **(json_bytes(value) or {})})
            else:
                for key, value in items:
                    line = escape_field(os.fsencode(key))
                    if not keys_only:
                        line += b"\t" + escape_field(value)
                    out.write(line + b"\n")
                out.flush()
            if more:
                print("phalanx kv: more keys match; raise --limit to see them", file=sys.stderr)
            return EXIT_OK
        case TxnResult(succeeded=succeeded, observed=observed):
            if as_json:
                _emit({"succeeded": succeeded, "observed": [json_bytes(v) for v in observed]})
            else:
                print("succeeded" if succeeded else "failed: the else branch ran")
            return EXIT_OK if succeeded else EXIT_NEGATIVE
        case VersionResult(version=b""):
            if as_json:
                _emit({"key": _key(command), "version": None})
            return _not_found(command)
        case VersionResult(version=version):
            if as_json:
                _emit({"key": _key(command), "version": version.hex()})
            else:
                print(version.hex())
            return EXIT_OK
    raise TypeError(f"unexpected result {result!r}")
