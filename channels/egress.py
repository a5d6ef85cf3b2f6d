"""Everything a channel sends passes one mask: the daemon's secrets never reach a chat.

Why here, in the adapters' base, rather than in each caller: the gateway reaches a platform through
a dozen paths (answers, streamed edits and drafts, queued and status signs, error notes, command
output, approval prompts and their buttons, delivered files, button-press answers), and a new path
must not be able to forget the mask. So every adapter's outbound methods are wrapped when its class
is defined (:func:`guard_outbound`, called by ``Channel.__init_subclass__``): ``render`` and
``render_stream`` mask the Markdown before it is formatted and split (a secret cut in two by the
split would be missed later), and ``send``, ``edit``, ``preview``, ``send_buttons``,
``close_buttons``, ``send_file`` and ``register_commands`` mask what reaches them again (text,
payload strings, button labels and values, a file's name, caption and bytes, a menu's
descriptions) for the parts the gateway builds without ``render``. Masking twice changes
nothing: ``***`` holds no secret.

The mask itself is the gateway's (``Channel.egress``, set when the channel is attached:
gateway/config/secrets.py), since only the gateway knows the daemon's secrets; adapters import nothing of
``agent/``. Unattached (a test driving an adapter alone), it is :data:`NO_EGRESS`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, Protocol


class Egress(Protocol):
    """What a channel masks with (``agent.redact.Redactor`` satisfies it)."""

    def __call__(self, text: str) -> str: ...

    def stream(self, text: str) -> str: ...

    def deep(self, value: Any) -> Any: ...

    def data(self, data: bytes) -> bytes: ...


class _NoEgress:
    """Masks nothing: a channel no gateway attached knows no secret."""

    def __call__(self, text: str) -> str:
        return text

    def stream(self, text: str) -> str:
        return text

    def deep(self, value: Any) -> Any:
        return value

    def data(self, data: bytes) -> bytes:
        return data


NO_EGRESS: Egress = _NoEgress()


def _part(egress: Egress, part: Any) -> Any:
    """A :class:`~channels.base.Rendered` with its text and payload masked (itself if clean)."""
    text = egress(part.text)
    payload = egress.deep(part.payload) if part.payload else part.payload
    if text is part.text and payload is part.payload:
        return part
    return dataclasses.replace(part, text=text, payload=payload)


def _buttons(egress: Egress, buttons: Any) -> list[Any]:
    return [dataclasses.replace(b, label=egress(b.label), value=egress(b.value)) for b in buttons]


def _file(egress: Egress, file: Any) -> Any:
    name, data = egress(file.name), egress.data(file.data)
    if name is file.name and data is file.data:
        return file
    return dataclasses.replace(file, name=name, data=data)


def _render(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def render(self: Any, markdown: str) -> Any:
        return fn(self, self.egress(markdown))

    return render


def _render_stream(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def render_stream(self: Any, markdown: str) -> Any:
        return fn(self, self.egress.stream(markdown))

    return render_stream


def _send(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def send(self: Any, target: Any, part: Any, *, idempotency_key: str) -> Any:
        return await fn(self, target, _part(self.egress, part), idempotency_key=idempotency_key)

    return send


def _edit(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``edit``, ``close_buttons`` and ``preview``: (target, message id or key, part)."""

    @functools.wraps(fn)
    async def edit(self: Any, target: Any, ref: str, part: Any) -> Any:
        return await fn(self, target, ref, _part(self.egress, part))

    return edit


def _send_buttons(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def send_buttons(self: Any, target: Any, part: Any, buttons: Any, *, idempotency_key: str) -> Any:
        egress = self.egress
        return await fn(
            self, target, _part(egress, part), _buttons(egress, buttons), idempotency_key=idempotency_key
        )

    return send_buttons


def _send_file(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def send_file(self: Any, target: Any, file: Any, caption: str = "", *, idempotency_key: str) -> Any:
        egress = self.egress
        return await fn(self, target, _file(egress, file), egress(caption), idempotency_key=idempotency_key)

    return send_file


def _register_commands(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def register_commands(self: Any, menu: Any) -> Any:
        egress = self.egress
        commands = tuple(
            dataclasses.replace(c, description=egress(c.description), usage=egress(c.usage))
            for c in menu.commands
        )
        return await fn(self, dataclasses.replace(menu, commands=commands))

    return register_commands


_WRAPPERS: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    "render": _render,
    "render_stream": _render_stream,
    "send": _send,
    "edit": _edit,
    "preview": _edit,
    "close_buttons": _edit,
    "send_buttons": _send_buttons,
    "send_file": _send_file,
    "register_commands": _register_commands,
}


def guard_outbound(cls: type) -> None:
    """Wrap the outbound methods ``cls`` itself defines (inherited ones are wrapped already)."""
    for name, wrap in _WRAPPERS.items():
        fn = cls.__dict__.get(name)
        if callable(fn) and not getattr(fn, "__egress__", False):
            wrapped = wrap(fn)
            wrapped.__egress__ = True  # type: ignore[attr-defined]
            setattr(cls, name, wrapped)
