"""Packages whose ``__init__`` runs only when something asks for a name it defines.

Several libraries under the daemon have an ``__init__`` that imports their whole surface while
Chital's running path needs one submodule of it (figures: docs/performance.md, "Memory"):

- ``langgraph_sdk``: ``langgraph.runtime`` needs ``langgraph_sdk.auth.types``; the package's
  ``__init__`` imports the remote-server client (httpx, websockets, ~45 modules). Chital never
  talks to a LangGraph server.
- ``openai.types``, ``langsmith.types``: generated packages whose ``__init__`` imports every API
  type (hundreds of pydantic models: the evals, graders, vector stores...); the chat model needs
  the chat-completion types only.
- ``aiohttp``: ``from aiohttp import web`` (our /healthz, /readyz, /metrics and status socket)
  runs ``aiohttp/__init__``, which imports the HTTP *client* too; Slack and Discord use the
  client, Telegram does not.
- ``prometheus_client``: its ``__init__`` imports the exposition servers (wsgiref, http.server)
  and the global registry's process collectors; Chital's metrics use their own registry.
- ``httpx._main``: ``httpx/__init__`` imports its command-line tool (click, pygments) to expose
  ``httpx.main``.

:func:`install` puts a finder first on ``sys.meta_path`` that gives these modules a loader which
creates the module (``__path__``, ``__spec__``...) but does not run its body. Submodule imports
(``from openai.types.chat import ChatCompletion``, ``from aiohttp import web``) work as usual,
because the package's ``__path__`` is set. The first access to any other attribute runs the real
``__init__`` in the same module object (a module ``__getattr__``, PEP 562), so code that does use
the whole package (Slack's ``aiohttp.ClientSession``, ``from openai.types import ChatModel``,
LangSmith tracing's API types) gets exactly what it would have got, only later. A generated
``__init__`` made of nothing but ``from .x import Name`` lines is resolved name by name instead
of all at once. ``importlib.util.LazyLoader`` does not fit: the import statement itself touches
the module and would load it, and it cannot keep submodule imports from loading the parent.

Installed by the entry points (``gateway/cli.py``, ``gateway/app.py``) before anything imports
these packages; installing it later does nothing for a package already imported.
"""

from __future__ import annotations

import ast
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
import types
from collections.abc import Callable, Sequence
from typing import Any

# module -> names bound up front to proxies that load the module when called.
DEFERRED: dict[str, tuple[str, ...]] = {
    "langgraph_sdk": ("get_client", "get_sync_client"),
    "openai.types": (),
    "openai.types.responses": (),
    "openai.types.chat": (),
    "langsmith.types": (),
    "httpx._main": ("main",),
    "prometheus_client": (),
}

_lock = threading.RLock()


def _read_init(origin: str | None, package: str) -> tuple[dict[str, tuple[str, str]] | None, dict[str, Any]]:
    """What can be known of an ``__init__`` without running it: ``{name: (submodule, attribute)}``
    when it is only a docstring, ``from __future__`` and ``from .sub import Name [as Name]`` lines
    (None otherwise: then any such name runs the whole ``__init__``), and its top-level
    ``NAME = <literal>`` constants (``__version__``: ``aiohttp.http`` imports it from the package)."""
    if not origin or not origin.endswith(".py"):
        return None, {}
    try:
        with open(origin, encoding="utf-8") as f:
            tree = ast.parse(f.read(), origin)
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None, {}
    names: dict[str, tuple[str, str]] | None = {}
    constants: dict[str, Any] = {}
    for i, node in enumerate(tree.body):
        if i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                constants[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
        if names is None:
            continue
        if not isinstance(node, ast.ImportFrom) or any(a.name == "*" for a in node.names):
            names = None
        elif node.module == "__future__" and node.level == 0:
            continue
        elif node.level != 1 or not node.module:
            names = None
        else:
            for alias in node.names:
                names[alias.asname or alias.name] = (f"{package}.{node.module}", alias.name)
    return names, constants


class _DeferredLoader(importlib.abc.Loader):
    """Creates the module as its real loader would, runs its body on first use."""

    def __init__(self, real: Any, proxies: Sequence[str]) -> None:
        self.real = real
        self.proxies = tuple(proxies)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        module: types.ModuleType | None = self.real.create_module(spec)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        name = module.__name__
        spec = module.__spec__
        names, constants = _read_init(spec.origin if spec else None, name)
        if not module.__dict__.get("__path__"):
            names = None
        ran = False

        def run_body() -> None:
            nonlocal ran
            with _lock:
                if ran:
                    return
                ran = True
                module.__dict__.pop("__getattr__", None)
                for proxy in self.proxies:
                    module.__dict__.pop(proxy, None)
                self.real.exec_module(module)

        def __getattr__(attr: str) -> Any:
            if attr == "__path__":  # the import system asks every module whether it is a package
                raise AttributeError(attr)
            if not ran:
                if names is not None and attr in names:
                    sub, real_name = names[attr]
                    value = getattr(importlib.import_module(sub), real_name)
                    setattr(module, attr, value)
                    return value
                if module.__dict__.get("__path__") and not attr.startswith("__"):
                    full = f"{name}.{attr}"
                    if full in sys.modules or _submodule_spec(module, attr) is not None:
                        return importlib.import_module(full)
                run_body()
            try:
                return module.__dict__[attr]
            except KeyError:
                raise AttributeError(f"module {name!r} has no attribute {attr!r}") from None

        module.__dict__.update(constants)
        module.__getattr__ = __getattr__  # type: ignore[method-assign]
        for proxy in self.proxies:
            setattr(module, proxy, _proxy(module, proxy, run_body))

    def __getattr__(self, attr: str) -> Any:
        # get_resource_reader, get_data, is_package...: the real loader's.
        return getattr(self.real, attr)


def _submodule_spec(module: types.ModuleType, attr: str) -> importlib.machinery.ModuleSpec | None:
    return importlib.machinery.PathFinder.find_spec(f"{module.__name__}.{attr}", list(module.__path__))


def _proxy(module: types.ModuleType, attr: str, run_body: Callable[[], None]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        run_body()
        return getattr(module, attr)(*args, **kwargs)

    call.__name__ = call.__qualname__ = attr
    return call


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, deferred: dict[str, tuple[str, ...]]) -> None:
        self.deferred = deferred
        self._searching = threading.local()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.deferred or fullname in self._searching.__dict__:
            return None
        # Ask the finders after this one (another wrapping finder may ask us back: not twice).
        self._searching.__dict__[fullname] = True
        spec: importlib.machinery.ModuleSpec | None = None
        try:
            for finder in sys.meta_path:
                if finder is not self and hasattr(finder, "find_spec"):
                    spec = finder.find_spec(fullname, path, target)
                    if spec is not None:
                        break
        finally:
            del self._searching.__dict__[fullname]
        if spec is not None and hasattr(spec.loader, "exec_module") and str(spec.origin).endswith(".py"):
            spec.loader = _DeferredLoader(spec.loader, self.deferred[fullname])
        return spec


def install(deferred: dict[str, tuple[str, ...]] | None = None) -> None:
    """Put the finder first on ``sys.meta_path`` (once). Modules already imported stay as they are."""
    with _lock:
        if any(isinstance(f, _Finder) for f in sys.meta_path):
            return
        sys.meta_path.insert(0, _Finder(dict(DEFERRED if deferred is None else deferred)))


def installed() -> bool:
    return any(isinstance(f, _Finder) for f in sys.meta_path)


# Importing this module is what installs it, so an entry point needs one import line above the rest.
install()
