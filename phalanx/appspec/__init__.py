"""Applications as plug-ins: the app registry (`get`, `names`, `register`) and `AppSpec`.

An app is a `StateMachine` (phalanx/apps) plus one `AppSpec` registered here; the runtime,
`cluster init`, the CLI, the harness and the demo look everything app-specific up in the
spec. Built-in: ``kv`` (default) and ``chain`` (`phalanx.appspec.builtin`).
"""

from phalanx.appspec.registry import DEFAULT_APP, UnknownApp, get, names, register, specs
from phalanx.appspec.spec import AppConfigError, AppFiles, AppSpec

__all__ = ["DEFAULT_APP", "AppConfigError", "AppFiles", "AppSpec", "UnknownApp", "get",
           "names", "register", "specs"]
