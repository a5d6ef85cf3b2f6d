"""One deepagents backend for the whole daemon that acts on the *current thread's* sandbox.

deepagents 0.7 removed backend factories: ``FilesystemMiddleware`` takes one backend instance, but the
compiled graph serves every chat thread. The harness acquires the thread's sandbox at the start of a
turn and binds it with :func:`bind_sandbox`; this backend forwards every call to the bound one.
The binding is a ContextVar, so it follows the turn into LangGraph's tasks, tool calls, sub-agents
(they share the lead's sandbox) and the worker threads langchain runs sync tools in (it copies the
context), and never leaks into another thread's turn running concurrently.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from deepagents.backends.protocol import SandboxBackendProtocol

_current: contextvars.ContextVar[SandboxBackendProtocol | None] = contextvars.ContextVar(
    "chital_sandbox_backend", default=None
)

_FORWARDED = (
    "adelete", "adownload_files", "aedit", "aexecute", "aglob", "agrep", "als", "aread", "aupload_files",
    "awrite", "delete", "download_files", "edit", "execute", "glob", "grep", "ls", "read", "upload_files",
    "write",
)  # fmt: skip


class NoSandboxBound(RuntimeError):
    """A file or shell tool ran outside a turn that has a sandbox (a harness bug, never user input)."""


@contextmanager
def bind_sandbox(backend: SandboxBackendProtocol) -> Iterator[None]:
    token = _current.set(backend)
    try:
        yield
    finally:
        _current.reset(token)


def bind(backend: SandboxBackendProtocol | None) -> contextvars.Token[SandboxBackendProtocol | None]:
    """Bind without a ``with`` block (async generators cannot hold one across yields safely)."""
    return _current.set(backend)


def unbind(token: contextvars.Token[SandboxBackendProtocol | None]) -> None:
    _current.reset(token)


def current() -> SandboxBackendProtocol:
    backend = _current.get()
    if backend is None:
        raise NoSandboxBound("no sandbox is bound to this turn")
    return backend


def _forwarder(name: str) -> Any:
    def forward(self: ThreadRoutedBackend, *args: Any, **kwargs: Any) -> Any:
        return getattr(current(), name)(*args, **kwargs)

    forward.__name__ = name
    forward.__doc__ = f"Forward ``{name}`` to the sandbox bound to the current turn."
    return forward


class ThreadRoutedBackend(SandboxBackendProtocol):
    """Forwards every backend call to the sandbox bound to the running turn."""

    @property
    def id(self) -> str:
        bound = _current.get()
        return bound.id if bound is not None else "chital-unbound"


for _name in _FORWARDED:
    setattr(ThreadRoutedBackend, _name, _forwarder(_name))
