"""Library modules whose body runs only when something uses them, not when they are imported.

Several libraries under the daemon import, at import time, parts that Chital's running path never
uses (figures: docs/performance.md, "Memory"; ``python bench/import_rss.py``):

- ``langgraph_sdk``, ``langgraph_sdk.client``: ``langgraph.runtime`` needs
  ``langgraph_sdk.auth.types`` and deepagents binds the remote client's names; the package's
  ``__init__`` imports that client (websockets, ~45 modules). Chital never talks to a LangGraph
  server.
- ``openai.types`` (and its ``responses``, ``chat``), ``langsmith.types``: generated packages whose
  ``__init__`` imports every API type (hundreds of pydantic models: evals, graders, the Responses
  API...); the chat model needs a few chat-completion types.
- ``cryptography.hazmat...``: python-telegram-bot imports them for Telegram Passport decryption,
  which Chital never asks for (the Rust bindings under them are ~6 MB).
- ``charset_normalizer``: requests binds it to guess the charset of a response that names none;
  its import loads some 90 codec modules. LangSmith's uploads (tracing on) are requests' only use.
- ``prometheus_client``: its ``__init__`` imports the exposition servers (wsgiref, http.server)
  and the global registry's collectors; Chital's metrics use their own registry.
- ``httpx._main``: ``httpx/__init__`` imports its command-line tool (click, pygments) for
  ``httpx.main``.

:func:`install` puts a finder first on ``sys.meta_path`` that gives these modules a loader which
creates the module (``__path__``, ``__spec__``...) but does not run its body. Submodule imports
(``from openai.types.chat import ChatCompletion``) work as usual, because ``__path__`` is set. The
first access to any other attribute runs the real body in the same module object (a module
``__getattr__``, PEP 562), so code that does use the module (LangSmith tracing's API types, ``from
openai.types import ChatModel``) gets what it would have got, only later. A generated ``__init__``
(nothing but ``from .sub import Name`` lines) is resolved name by name. Names a library takes with
``from m import Name`` at import time but uses only on a path Chital does not take are bound up
front to :class:`_Proxy` stand-ins that act as the real object when used, and are replaced by it
in every module once their module has run.

What must not change is how things fail and what other code can observe
(tests/test_lean_imports_attack.py runs the daemon's library paths with and without this module
and compares): a module whose top-level imports are not all installed is not deferred (its import
fails where it always did); a body that fails later fails again on every use, never leaving a
half-run module; the body runs under the import system's own module lock (threads wait for it, a
concurrent circular first use gets a partial module instead of a hang); a name the body never
binds is answered without running it; ``dir()``, ``importlib.reload``, ``find_spec``, resources
and source work as before.
``importlib.util.LazyLoader`` does not fit: the import statement itself touches the module and
loads it, and it cannot keep submodule imports from loading the parent.

Importing this module changes nothing: the entry point calls :func:`install` (``gateway.cli.main.main``,
before it imports any library; the benches do the same), so a program that imports Chital's packages
as a library gets its libraries exactly as they are. For a library already imported it changes
nothing either. This is the one deferral mechanism in Chital (``sqlite_vec`` below was a second,
hand-rolled one in agent/tuning.py).
"""

from __future__ import annotations

import collections
import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

# module -> names bound up front to proxies that load the module when called.
DEFERRED: dict[str, tuple[str, ...]] = {
    "langgraph_sdk": ("get_client", "get_sync_client"),
    "openai.types": (),
    "openai.types.responses": (),
    "openai.types.chat": (),
    "langsmith.types": (),
    "langgraph_sdk.client": ("get_client", "get_sync_client", "LangGraphClient", "SyncLangGraphClient"),
    "httpx._main": ("main",),
    # langgraph.store.sqlite imports it (and through it numpy, ~10 MB resident) at import time, but
    # calls it only for a store with a vector index, which Chital's memory does not configure.
    "sqlite_vec": (),
    # python-telegram-bot imports these for Telegram Passport decryption, which Chital never asks
    # for; the Rust bindings under them are ~6 MB resident.
    "cryptography.hazmat.backends": ("default_backend",),
    "cryptography.hazmat.primitives.asymmetric.padding": ("MGF1", "OAEP"),
    "cryptography.hazmat.primitives.ciphers": ("Cipher",),
    "cryptography.hazmat.primitives.ciphers.algorithms": ("AES",),
    "cryptography.hazmat.primitives.ciphers.modes": ("CBC",),
    "cryptography.hazmat.primitives.hashes": ("SHA1", "SHA256", "SHA512", "Hash"),
    "cryptography.hazmat.primitives.serialization": (),
    "prometheus_client": (),
    # requests (imported by langchain-core and langsmith) binds it as its charset detector, for a
    # response without a charset; its import loads ~90 codec modules.
    "charset_normalizer": (),
    # httpcore and httpcore2 (under PTB's and the openai SDK's clients) import trio to pick their
    # locks when running under trio, and touch it only then; Chital runs asyncio. With trio come
    # outcome, sortedcontainers and ~50 modules (~1.5 MB).
    "trio": (),
    # langchain-openai imports it for get_num_tokens_from_messages, which nothing in Chital calls
    # (summarization counts approximately); its Rust extension alone is ~1.2 MB resident.
    "tiktoken": (),
    # langsmith.client binds it at import for an OTel mode Chital never uses (docs/tracing.md).
    "opentelemetry.sdk.trace": ("TracerProvider",),
}

# Names that may be resolved on their own although the __init__ does more than import them (its
# other effects wait until something else is asked): requests reads charset_normalizer's version.
ONE_BY_ONE: dict[str, tuple[str, ...]] = {"charset_normalizer": ("__version__",)}

# What a deferred module imports first; when one is missing, its import fails at once, as the
# real one would (httpx then binds its own "install httpx[cli]" main).
REQUIRES: dict[str, tuple[str, ...]] = {"httpx._main": ("click", "pygments", "rich")}

_lock = threading.RLock()


@dataclass(frozen=True)
class _Init:
    """What can be known of a package's ``__init__`` without running it."""

    # {name: (submodule, attribute)} for each name the file binds once, by a top-level
    # ``from .sub import name``.
    names: dict[str, tuple[str, str]]
    # The file is nothing but those lines (a generated ``__init__``): running it has no other
    # effect, so each name can be resolved on its own.
    pure: bool
    # Every name the file binds anywhere (None: it does ``import *``, so any name may be).
    bound: frozenset[str] | None


def _read_init(origin: str | None, package: str) -> _Init:
    import ast  # only for a module asked for a name it does not have yet, not at start-up

    if not origin or not origin.endswith(".py"):
        return _Init({}, False, None)
    try:
        with open(origin, encoding="utf-8") as f:
            tree = ast.parse(f.read(), origin)
    except (OSError, SyntaxError, UnicodeDecodeError):
        return _Init({}, False, None)
    counts: collections.Counter[str] = collections.Counter()
    dynamic = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                if alias.name == "*":
                    return _Init({}, False, None)
                counts[alias.asname or alias.name.partition(".")[0]] += 1
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            counts[node.name] += 1
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
            counts[node.id] += 1
            if node.id in _DYNAMIC:
                dynamic = True
        elif isinstance(node, ast.Name) and node.id in _DYNAMIC:
            dynamic = True
        elif isinstance(node, ast.Attribute) and node.attr in ("__dict__", "modules"):
            dynamic = True  # module.__dict__[...] = ..., sys.modules[__name__]...
    names: dict[str, tuple[str, str]] = {}
    pure = True
    for i, stmt in enumerate(tree.body):
        if isinstance(stmt, ast.ImportFrom) and stmt.level == 1 and stmt.module:
            for alias in stmt.names:
                name = alias.asname or alias.name
                if counts[name] == 1:
                    names[name] = (f"{package}.{stmt.module}", alias.name)
        elif isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__":
            pass
        elif not (i == 0 and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):
            pure = False
    return _Init(names, pure, None if dynamic or "__getattr__" in counts else frozenset(counts))


def _missing_import(origin: str | None) -> str | None:
    """The first top-level package the module's body imports unconditionally (an ``import`` or
    ``from ... import`` at module level, outside ``try``/``if``) that is not installed. Such a module
    is not deferred: its import must fail where and how it would have failed without us."""
    import ast

    if not origin or not origin.endswith(".py"):
        return None
    try:
        with open(origin, encoding="utf-8") as f:
            tree = ast.parse(f.read(), origin)
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    for stmt in tree.body:
        if isinstance(stmt, ast.Import):
            tops = [alias.name.partition(".")[0] for alias in stmt.names]
        elif isinstance(stmt, ast.ImportFrom) and stmt.level == 0 and stmt.module:
            tops = [stmt.module.partition(".")[0]]
        else:
            continue
        for top in tops:
            if top != "__future__" and top not in sys.modules and importlib.util.find_spec(top) is None:
                return top
    return None


# Names whose use in a module body means it may bind names no statement shows.
_DYNAMIC = frozenset({"globals", "vars", "setattr", "exec", "eval", "locals", "__import__"})
# Asked of a module whose body has not run, these need the body (the import system adds them).
_ALWAYS_RUN = frozenset({"__builtins__", "__annotations__", "__getattr__", "__dir__", "__all__"})


class _DeferredLoader(importlib.abc.Loader):
    """Creates the module as its real loader would, runs its body on first use."""

    def __init__(self, real: Any, proxies: Sequence[str], one_by_one: Sequence[str] = ()) -> None:
        self.real = real
        self.proxies = tuple(proxies)
        self.one_by_one = frozenset(one_by_one)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        module: types.ModuleType | None = self.real.create_module(spec)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        name = module.__name__
        spec = module.__spec__
        pending = module.__dict__.get("__getattr__")
        if "__builtins__" in module.__dict__:  # importlib.reload of a module whose body has run
            self.real.exec_module(module)
            return
        if getattr(pending, "_lean_run", None) is not None:  # reload of one not run yet: run it now
            pending._lean_run()  # type: ignore[union-attr]
            return
        for required in REQUIRES.get(name, ()):
            # Fail as the body would at its first import, without loading the ones before it.
            if importlib.util.find_spec(required) is None:
                raise ModuleNotFoundError(f"No module named {required!r}", name=required)
        if _missing_import(spec.origin if spec else None) is not None:
            # Not installed as it should be: the ImportError comes now, from the real body.
            self.real.exec_module(module)
            return
        package = bool(module.__dict__.get("__path__"))
        ran = False
        proxies = {attr: _Proxy(module, attr) for attr in self.proxies}

        @functools.cache
        def init() -> _Init:  # read on the first name asked of the package, not at import
            return _read_init(spec.origin if spec else None, name)

        def run_body() -> None:
            # As the import system runs a body: under the module's import lock, with the spec
            # "initializing", so another thread's first use (or ``import``) waits for it instead
            # of seeing a half-run module, and two threads each running a body that needs the
            # other's get a partial module (AttributeError), as in a real import, not a hang.
            nonlocal ran
            with _ModuleLock(name) as acquired:
                if ran or not acquired:
                    return
                ran = True
                before = dict(module.__dict__)
                for attr in proxies:
                    module.__dict__.pop(attr, None)
                if spec is not None:
                    spec._initializing = True  # type: ignore[attr-defined]
                try:
                    self.real.exec_module(module)
                except BaseException:
                    # As a failed import: nothing of the half-run body stays, and the next use
                    # runs it again (and fails again, with the same error).
                    module.__dict__.clear()
                    module.__dict__.update(before)
                    ran = False
                    raise
                finally:
                    if spec is not None:
                        spec._initializing = False  # type: ignore[attr-defined]
                for hook, ours in (("__getattr__", __getattr__), ("__dir__", __dir__)):
                    if module.__dict__.get(hook) is ours:
                        del module.__dict__[hook]
                _resolve({proxy: module.__dict__.get(attr, proxy) for attr, proxy in proxies.items()})

        def __getattr__(attr: str) -> Any:
            if attr == "__path__":  # the import system asks every module whether it is a package
                raise AttributeError(attr)
            if not ran and attr not in _ALWAYS_RUN:
                known = init()
                if package and attr in known.names and (known.pure or attr in self.one_by_one):
                    sub, real_name = known.names[attr]
                    value = getattr(importlib.import_module(sub), real_name)
                    setattr(module, attr, value)
                    return value
                if known.bound is not None and attr not in known.bound:
                    # A submodule the body does not rebind is what the body would give too.
                    full = f"{name}.{attr}"
                    if package and (full in sys.modules or _submodule_spec(module, attr) is not None):
                        return importlib.import_module(full)
                    # A name the body never binds: it would not be there after the body either
                    # (scans of every module such as pickle.whichmodule ask for such names).
                    raise AttributeError(f"module {name!r} has no attribute {attr!r}")
            run_body()
            try:
                return module.__dict__[attr]
            except KeyError:
                if spec is not None and getattr(spec, "_initializing", False):  # CPython's words
                    raise AttributeError(
                        f"partially initialized module {name!r} has no attribute {attr!r}"
                        " (most likely due to a circular import)"
                    ) from None
                raise AttributeError(f"module {name!r} has no attribute {attr!r}") from None

        def __dir__() -> list[str]:  # dir(), inspect.getmembers: every name the body binds
            run_body()
            return sorted(module.__dict__)

        __getattr__._lean_run = run_body  # type: ignore[attr-defined]
        module.__getattr__ = __getattr__  # type: ignore[method-assign]
        module.__dir__ = __dir__  # type: ignore[method-assign]
        for attr, proxy in proxies.items():
            object.__setattr__(proxy, "_lean_load", run_body)
            setattr(module, attr, proxy)

    def __getattr__(self, attr: str) -> Any:
        # get_resource_reader, get_data, is_package...: the real loader's.
        return getattr(self.real, attr)


class _ModuleLock:
    """The import system's own lock for a module (``importlib._bootstrap``; CPython 3.11 to
    3.13), re-entrant, with its deadlock detection: ``__enter__`` gives False where a real import
    would go on with a partially initialized module. A plain lock where that is missing."""

    _fallback: ClassVar[dict[str, threading.RLock]] = {}

    def __init__(self, name: str) -> None:
        bootstrap = sys.modules.get("importlib._bootstrap")
        get_lock = getattr(bootstrap, "_get_module_lock", None)
        self._deadlock: type[BaseException] = getattr(bootstrap, "_DeadlockError", RuntimeError)
        if get_lock is not None:
            self._lock: Any = get_lock(name)
        else:
            with _lock:
                self._lock = self._fallback.setdefault(name, threading.RLock())
        self._held = False

    def __enter__(self) -> bool:
        try:
            self._held = bool(self._lock.acquire())
        except self._deadlock:
            self._held = False
        return self._held

    def __exit__(self, *exc: object) -> None:
        if self._held:
            self._lock.release()


def _submodule_spec(module: types.ModuleType, attr: str) -> importlib.machinery.ModuleSpec | None:
    return importlib.machinery.PathFinder.find_spec(f"{module.__name__}.{attr}", list(module.__path__))


def _module_of(obj: Any) -> Any:
    return obj.__module__


def _signature_of(obj: Any) -> Any:
    import inspect  # loaded by then in any process that asks (inspect.signature is asking)

    return inspect.signature(obj)


def _load_name(module: str, attr: str) -> Any:
    """What a pickled stand-in becomes: the real object."""
    return getattr(importlib.import_module(module), attr)


_UNSET: Any = object()


def _resolve(real: dict[_Proxy, Any]) -> None:
    """A module has run: each stand-in of it gets its real object (and what was set on the
    stand-in), and module globals still holding a stand-in (``from m import Name`` copies) are
    rebound to the real object, in one pass over ``sys.modules``."""
    for proxy, value in real.items():
        object.__setattr__(proxy, "_lean_value", value)
        for attr, set_value in proxy._lean_sets.items():
            try:
                setattr(value, attr, set_value)
            except (AttributeError, TypeError):
                pass
    by_id = {id(proxy): value for proxy, value in real.items() if value is not proxy}
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if type(namespace) is not dict:
            continue
        for key, held in list(namespace.items()):
            if type(held) is _Proxy and id(held) in by_id:
                namespace[key] = by_id[id(held)]


class _Proxy:
    # A name a deferred module binds up front (``from m import Name`` takes it without loading
    # ``m``). Using it in any way that needs the real object loads the module and acts on it:
    # calling, attributes (``__module__``, ``__doc__``, ``__name__``... included), setting them
    # (kept, and set on the real object when it exists), ``isinstance``/``issubclass`` with it on
    # either side (``__class__`` is the real one's), subclassing (``__mro_entries__``), ``X | Y``,
    # ``X[...]``, pickling and copying. Once the module has run, every module global still holding
    # the stand-in is rebound to the real object, so identity checks (``is``, dict keys) hold from
    # then on. Not before: not for exception classes (``except`` needs the real class) nor for
    # names used as keys or compared by identity before their module runs; ``type(stand_in)`` is
    # this class, and ``type(name, (stand_in,), ns)``/``types.new_class`` cannot take one as a
    # base (a class statement can). tests/test_lean_imports_attack.py checks that the libraries
    # holding stand-ins do none of these with them.

    _lean_module: types.ModuleType
    _lean_attr: str
    _lean_load: Callable[[], None]
    _lean_value: Any
    _lean_sets: dict[str, Any]

    def __init__(self, module: types.ModuleType, attr: str) -> None:
        object.__setattr__(self, "_lean_module", module)
        object.__setattr__(self, "_lean_attr", attr)
        object.__setattr__(self, "_lean_value", _UNSET)
        object.__setattr__(self, "_lean_sets", {})

    def _real(self) -> Any:
        if self._lean_value is _UNSET:
            self._lean_load()
        return self._lean_value

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._real()(*args, **kwargs)

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("_lean_"):
            raise AttributeError(attr)
        sets = self._lean_sets
        if attr in sets and self._lean_value is _UNSET:
            return sets[attr]
        return getattr(self._real(), attr)

    def __setattr__(self, attr: str, value: Any) -> None:
        # httpx sets ``__module__`` on what it imports: the real object gets it when it exists.
        self._lean_sets[attr] = value
        if self._lean_value is not _UNSET:
            setattr(self._lean_value, attr, value)

    def _lean_or(self, read: Callable[[Any], Any], otherwise: Any) -> Any:
        # What introspection reads (isinstance's __class__, getattr(x, "__doc__", None)) must
        # not raise where it never did: a module that fails to load gives the stand-in's own.
        try:
            return read(self._real())
        except Exception:
            return otherwise

    # Read from the real object, not from this class.
    __module__ = property(lambda self: self._lean_sets.get("__module__") or self._lean_or(_module_of, None))
    __doc__ = property(lambda self: self._lean_or(lambda real: real.__doc__, None))
    __class__ = property(lambda self: self._lean_or(type, _Proxy))
    __signature__ = property(lambda self: self._lean_or(_signature_of, None))

    def __instancecheck__(self, obj: object) -> bool:
        return isinstance(obj, self._real())

    def __subclasscheck__(self, cls: type) -> bool:
        return issubclass(cls, self._real())

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[Any, ...]:
        return (self._real(),)

    def __or__(self, other: Any) -> Any:
        return self._real() | other

    def __ror__(self, other: Any) -> Any:
        return other | self._real()

    def __getitem__(self, item: Any) -> Any:
        return self._real()[item]

    def __copy__(self) -> Any:
        return self._real()

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        return self._real()

    def __reduce__(self) -> tuple[Any, ...]:
        return (_load_name, (self._lean_module.__name__, self._lean_attr))

    def __repr__(self) -> str:
        if self._lean_value is not _UNSET:
            return repr(self._lean_value)
        return f"<not yet imported: {self._lean_module.__name__}.{self._lean_attr}>"


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
            spec.loader = _DeferredLoader(spec.loader, self.deferred[fullname], ONE_BY_ONE.get(fullname, ()))
        return spec


def install(deferred: dict[str, tuple[str, ...]] | None = None) -> None:
    """Put the finder first on ``sys.meta_path`` (once). Modules already imported stay as they are."""
    with _lock:
        if any(isinstance(f, _Finder) for f in sys.meta_path):
            return
        sys.meta_path.insert(0, _Finder(dict(DEFERRED if deferred is None else deferred)))


def installed() -> bool:
    return any(isinstance(f, _Finder) for f in sys.meta_path)
