"""A plain Python class as a replicated state machine: `@replicated`, `@query`, `Replicated`.

(The module is `replicated_class`, not `replicated`: a submodule named like the exported
decorator would shadow it as `phalanx.replicated` once imported.)

Owns: the decorators, `ReplicatedMachine` (the `StateMachine` adapter), the proxy
`Replicated(cls, client)`, the command/result encoding and `ReplicatedCallError`.

    class Counter:
        def __init__(self) -> None:
            self.value = 0

        @replicated
        def incr(self, by: int = 1) -> int:     # a command: ordered, applied on every replica
            self.value += by
            return self.value

        @query
        def get(self) -> int:                    # a read: never changes the state
            return self.value

    phalanx cluster init ./c --app counter.py:Counter     (the class itself is the factory)
    proxy = Replicated(Counter, client); await proxy.incr(5)  # -> 5, exactly once

Commands are typed and deterministic, never pickled: msgpack of ``[method, [args...],
{kwargs...}]`` (map keys sorted); a method is found by name among the class's marked methods
only, its arguments bound to its signature and checked against its simple annotations
(`int`, `float`, `str`, `bytes`, `bool`, `None`, `list`, `dict`, unions of them; other
annotations are not checked), on the client before anything is sent (`InvalidArgument`) and
again on every replica (an error result: a peer's bytes are input). Results are msgpack of
``[0, value]``, or ``[1, "Type: message"]`` when the method raised: the caller gets
`ReplicatedCallError`; what the method changed before raising stays changed on every
replica alike (it is deterministic).

State (checkpoints, state transfer): the class's ``to_state(self)`` and ``from_state(cls,
state)`` (a classmethod returning a new instance) when it defines them, else the instance's
``__dict__``, which must then hold only msgpack-able values (dict, list, str, int, float,
bytes, bool, None; a tuple comes back as a list, a set is refused at start-up). It is
serialised when a snapshot is taken (O(state), fine for the small states this helper is
for; the KV app shows the O(1) way). Testing (`phalanx sim --app`, `phalanx jepsen run
--app`): a static ``random_call(rng) -> (method, args)`` on the class.

Rules: the methods must be deterministic (docs/STATE_MACHINES.md); apply never raises.
"""

from __future__ import annotations

import inspect
import random
import types
import typing
from collections.abc import Callable, Iterator
from typing import Any, Final, Generic, TypeVar

import msgpack  # type: ignore[import-untyped]  # no stubs shipped

from phalanx.apps.command_source import GeneratedCommand
from phalanx.apps.interface import SnapshotFormatError
from phalanx.client.errors import ClientError, InvalidArgument

__all__ = ["Replicated", "ReplicatedCallError", "ReplicatedMachine", "query", "replicated"]

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")
_KIND: Final = "__phalanx_replicated__"
COMMAND: Final = "command"
QUERY: Final = "query"
_OK: Final = 0
_ERROR: Final = 1
_SIMPLE: Final = (int, float, str, bytes, bool, type(None), list, dict)


class ReplicatedCallError(ClientError):
    """The replicated method raised (on every replica alike): the call WAS applied; the
    message is the exception's type and text."""


def replicated(method: F) -> F:
    """Mark `method` a command: ordered by consensus and applied on every replica."""
    setattr(method, _KIND, COMMAND)
    return method


def query(method: F) -> F:
    """Mark `method` a read: answered without going through the log; must not mutate."""
    setattr(method, _KIND, QUERY)
    return method


class _Method:
    __slots__ = ("hints", "kind", "name", "signature")

    def __init__(self, name: str, function: Callable[..., Any], kind: str) -> None:
        self.name = name
        self.kind = kind
        self.signature = inspect.signature(function)
        try:
            hints = typing.get_type_hints(function)
        except Exception:  # an annotation that does not resolve: checked by nobody
            hints = {}
        self.hints = {k: v for k, v in hints.items() if k != "return"}

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        """Why (`args`, `kwargs`) do not fit this method, or None."""
        try:
            bound = self.signature.bind(None, *args, **kwargs)  # None: self
        except TypeError as e:
            return f"{self.name}: {e}"
        for name, value in list(bound.arguments.items())[1:]:
            hint = self.hints.get(name)
            if hint is not None and not _fits(value, hint):
                return (f"{self.name}: argument {name!r} must be {_show(hint)}, got "
                        f"{type(value).__name__}")
        return None


def _fits(value: object, hint: object) -> bool:
    if hint is Any:
        return True
    if hint is None or hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(hint, type) and hint in _SIMPLE:
        return isinstance(value, hint)
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, h) for h in typing.get_args(hint))
    if origin in (list, dict):
        return isinstance(value, origin)
    return True  # not a simple annotation: not checked


def _show(hint: object) -> str:
    return getattr(hint, "__name__", None) or str(hint)


def methods_of(cls: type) -> dict[str, _Method]:
    """The marked methods of `cls` by name (public names only; computed once per class)."""
    known = _METHODS.get(cls)
    if known is not None:
        return known
    out: dict[str, _Method] = {}
    for name in sorted(dir(cls)):
        function = getattr(cls, name, None)
        kind = getattr(function, _KIND, None)
        if kind is not None and callable(function):
            if name.startswith("_"):
                raise TypeError(f"{cls.__name__}.{name}: a replicated method needs a public name")
            out[name] = _Method(name, function, kind)
    _METHODS[cls] = out
    return out


_METHODS: dict[type, dict[str, _Method]] = {}


def _canonical(value: object) -> object:
    """`value` with every dict's keys sorted (equal states give equal bytes)."""
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda kv: (type(kv[0]).__name__, kv[0]))
        return {k: _canonical(v) for k, v in items}
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    return value


def _pack(value: object) -> bytes:
    return msgpack.packb(_canonical(value), use_bin_type=True)  # type: ignore[no-any-return]


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False, use_list=True)


def encode_call(name: str, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
                ) -> bytes:
    """The command bytes of ``name(*args, **kwargs)``. Raises `InvalidArgument` for a value
    msgpack cannot carry."""
    try:
        return _pack([name, list(args), dict(kwargs or {})])
    except (TypeError, ValueError, OverflowError) as e:
        raise InvalidArgument(f"{name}: arguments must be msgpack values (int, float, str, "
                              f"bytes, bool, None, list, dict): {e}") from None


def _decode_call(data: bytes) -> tuple[str, tuple[Any, ...], dict[str, Any]] | str:
    try:
        call = _unpack(data)
    except Exception as e:  # a peer's or client's bytes are input
        return f"not a replicated call: {type(e).__name__}"
    if (not isinstance(call, list) or len(call) != 3 or not isinstance(call[0], str)
            or not isinstance(call[1], list) or not isinstance(call[2], dict)
            or not all(isinstance(k, str) for k in call[2])):
        return "not a replicated call: expected [method, [args], {kwargs}]"
    return call[0], tuple(call[1]), call[2]


def _error(text: str) -> bytes:
    return _pack([_ERROR, text])


class _Snapshot:
    __slots__ = ("_data",)

    def __init__(self, data: bytes) -> None:
        self._data = data

    def chunks(self) -> Iterator[bytes]:
        yield self._data


class ReplicatedMachine(Generic[T]):
    """The `StateMachine` of an instance of a class with `@replicated` / `@query` methods
    (see the module docstring). `cluster init --app FILE.py:CLASS` wraps such a class."""

    random_command: Callable[[random.Random], GeneratedCommand]
    """Set only when the class has ``random_call`` (so `CommandSource` holds only then)."""

    def __init__(self, target: T) -> None:
        self.target = target
        self.cls: type[T] = type(target)
        self.methods = methods_of(self.cls)
        if not self.methods:
            raise TypeError(f"{self.cls.__name__} has no @replicated or @query method")
        if hasattr(self.cls, "random_call"):  # the testing hook (`CommandSource`)
            self.random_command = self._random_command
        self._state_bytes()  # a state msgpack cannot carry: refused now, not at a checkpoint

    def apply(self, command: bytes) -> bytes:
        return self._run(command, (COMMAND, QUERY))

    def query(self, request: bytes) -> bytes:
        return self._run(request, (QUERY,))

    def _run(self, data: bytes, kinds: tuple[str, ...]) -> bytes:
        call = _decode_call(data)
        if isinstance(call, str):
            return _error(call)
        name, args, kwargs = call
        method = self.methods.get(name)
        if method is None or method.kind not in kinds:
            what = "read" if kinds == (QUERY,) else "method"
            return _error(f"{self.cls.__name__} has no replicated {what} {name!r}")
        problem = method.bind(args, kwargs)
        if problem is not None:
            return _error(problem)
        try:
            value = getattr(self.target, name)(*args, **kwargs)
        except Exception as e:  # the app's own exception: the caller's error, not ours
            return _error(f"{type(e).__name__}: {e}")
        try:
            return _pack([_OK, value])
        except (TypeError, ValueError, OverflowError) as e:
            return _error(f"{name} returned a value msgpack cannot carry: {e}")

    def _state_bytes(self) -> bytes:
        to_state = getattr(self.target, "to_state", None)
        if callable(to_state):
            state = to_state()
        elif hasattr(self.target, "__dict__"):
            state = vars(self.target)
        else:
            raise TypeError(f"{self.cls.__name__} has no __dict__: define to_state and "
                            "from_state")
        try:
            return _pack(state)
        except (TypeError, ValueError, OverflowError) as e:
            raise TypeError(f"{self.cls.__name__}'s state is not msgpack-able ({e}): keep "
                            "dict, list, str, int, float, bytes, bool, None in it, or define "
                            "to_state and from_state") from None

    def snapshot(self) -> _Snapshot:
        return _Snapshot(self._state_bytes())

    def restore(self, data: bytes) -> None:
        try:
            state = _unpack(data)
        except Exception as e:
            raise SnapshotFormatError(f"not a {self.cls.__name__} state: {e}") from None
        from_state = getattr(self.cls, "from_state", None)
        if callable(from_state):
            try:
                target = from_state(state)
            except Exception as e:
                raise SnapshotFormatError(f"{self.cls.__name__}.from_state refused the "
                                          f"state: {type(e).__name__}: {e}") from None
        else:
            if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
                raise SnapshotFormatError(f"not a {self.cls.__name__} state: expected a map "
                                          "of attribute names")
            target = self.cls.__new__(self.cls)
            vars(target).update(state)
        self.target = target

    def _random_command(self, rng: random.Random) -> GeneratedCommand:
        name, args = self.cls.random_call(rng)  # type: ignore[attr-defined]
        method = self.methods[name]
        return GeneratedCommand(command=encode_call(name, tuple(args)),
                                read_only=method.kind == QUERY)

    @classmethod
    def of(cls, factory: Callable[[], T]) -> Callable[[], ReplicatedMachine[T]]:
        """A machine factory (``--app``'s FACTORY) building `factory()` instances."""
        return lambda: cls(factory())


def as_machine(obj: object) -> object:
    """`obj` itself, or wrapped in `ReplicatedMachine` when it is an instance of a class
    with replicated methods (and no `apply` of its own)."""
    if callable(getattr(obj, "apply", None)) or not methods_of(type(obj)):
        return obj
    return ReplicatedMachine(obj)


def decode_result(name: str, data: bytes) -> Any:
    """The value of a replicated call's result. Raises `ReplicatedCallError`."""
    try:
        status, value = _unpack(data)
    except Exception:
        raise ReplicatedCallError(f"{name}: not a replicated result: {data[:60]!r}") from None
    if status == _OK:
        return value
    raise ReplicatedCallError(str(value))


class Replicated(Generic[T]):
    """A proxy calling `cls`'s replicated methods through `client` (a `phalanx.Client`, or
    a `phalanx.SyncClient`: then the methods return values instead of awaitables)::

        counter = Replicated(Counter, client)
        await counter.incr(5)     # a command; await counter.get(): a linearizable read

    A wrong method or argument raises `InvalidArgument` before anything is sent.
    """

    def __init__(self, cls: type[T], client: Any) -> None:
        self._cls = cls
        self._client = client
        self._methods = methods_of(cls)
        self._sync = not inspect.iscoroutinefunction(client.call)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = self._methods.get(name)
        if method is None:
            raise AttributeError(f"{self._cls.__name__} has no @replicated or @query "
                                 f"method {name!r}")
        read_only = method.kind == QUERY

        def prepare(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
            problem = method.bind(args, kwargs)
            if problem is not None:
                raise InvalidArgument(problem)
            return encode_call(name, args, kwargs)

        if self._sync:
            def call_sync(*args: Any, **kwargs: Any) -> Any:
                data = self._client.call(prepare(args, kwargs), read_only=read_only)
                return decode_result(name, data)

            return call_sync

        async def call(*args: Any, **kwargs: Any) -> Any:
            data = await self._client.call(prepare(args, kwargs), read_only=read_only)
            return decode_result(name, data)

        return call
