"""`raw_init`: the cheaper ``__init__`` of a frozen, slotted, keyword-only dataclass (private).

Owns one function and nothing else, so `phalanx.consensus.types` and `phalanx.consensus.core`
can give their own hot records the cheaper ``__init__`` where they declare them, without
importing each other (a client that reads `ClientRequest` loads no core);
`phalanx.consensus._fastpath` re-exports it beside the other builders. Pure: no I/O, clocks
or randomness.
"""

from __future__ import annotations

import dataclasses
import types
from typing import TypeVar

_C = TypeVar("_C", bound=type)


def raw_init(cls: _C) -> _C:
    """Give a frozen, slotted, keyword-only dataclass an ``__init__`` that fills its slots
    through their raw setters, then calls ``__post_init__`` if it has one.

    The generated frozen ``__init__`` goes through `object.__setattr__` for every field,
    which costs about twice as much; records built once or more per message use this. The
    signature (keyword-only, the same defaults), the validation, equality, hashing, repr and
    `dataclasses.fields/replace` are unchanged, and so is the resulting object. The new
    function carries ``__raw_init__ = True`` (the codec's fast decoder builds such classes
    the same way). Misuse (not such a dataclass, an `InitVar`, a default factory) raises
    `TypeError` at import time.
    """
    fields = dataclasses.fields(cls)
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"raw_init needs a frozen slotted dataclass, got {cls.__name__}")
    if len(cls.__dict__["__dataclass_fields__"]) != len(fields):
        raise TypeError(f"raw_init: {cls.__name__} has InitVar or ClassVar pseudo-fields")
    env: dict[str, object] = {}
    args: list[str] = []
    body: list[str] = []
    for i, f in enumerate(fields):
        slot = cls.__dict__.get(f.name)
        if not f.init or not f.kw_only or not isinstance(slot, types.MemberDescriptorType):
            raise TypeError(f"raw_init: {cls.__name__}.{f.name} is not a keyword-only slot")
        if f.default_factory is not dataclasses.MISSING:
            raise TypeError(f"raw_init: {cls.__name__}.{f.name} has a default factory")
        if f.default is dataclasses.MISSING:
            args.append(f.name)
        else:
            env[f"D{i}"] = f.default
            args.append(f"{f.name}=D{i}")
        env[f"S{i}"] = slot.__set__
        body.append(f"S{i}(self, {f.name})")
    post_init = getattr(cls, "__post_init__", None)
    if post_init is not None:
        env["POST"] = post_init
        body.append("POST(self)")
    source = f"def __init__(self, *, {', '.join(args)}):\n    " + "\n    ".join(body or ["pass"])
    namespace: dict[str, object] = {}
    exec(compile(source, f"<raw_init {cls.__qualname__}>", "exec"), env, namespace)
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"  # type: ignore[attr-defined]
    init.__raw_init__ = True  # type: ignore[attr-defined]
    cls.__init__ = init  # type: ignore[misc]
    return cls
