"""Our side of an ACP session: the ``Client`` the agent calls back (docs/coding-agents.md).

Everything the agent sends is untrusted: its streamed updates become bounded, rate-limited progress
lines (never the raw text), its permission requests go to a person (no answer: rejected), and its
``fs`` requests are served only inside the conversation's workspace, through the same symlink-safe
:class:`~agent.sandbox.files.HostFiles` as the agent's own file tools. A path outside the workspace
(absolute elsewhere, ``..``, a symlink it planted pointing at a host file) is refused and ends the
session: an agent that tries it once gets no second try. Floods end it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from acp import RequestError
from acp.schema import (
    AgentMessageChunk,
    AgentPlanUpdate,
    AllowedOutcome,
    DeniedOutcome,
    PermissionOption,
    ReadTextFileResponse,
    RequestPermissionResponse,
    TextContentBlock,
    ToolCallProgress,
    ToolCallStart,
    ToolCallUpdate,
    WriteTextFileResponse,
)

from agent.acp.settings import AcpAgent
from agent.sandbox.files import HostFiles
from agent.sandbox.paths import WORKSPACE, PathRefused, SandboxError
from agent.untrusted import code_span, one_line

Asker = Callable[[str, str], Awaitable[bool]]
"""``ask(title, detail)``: a person's yes (True) or no/timeout (False) to one permission request."""
Progress = Callable[[str], None]
"""Shows one progress line in the chat (plain text; the caller renders it safely)."""

PROGRESS_CHARS = 160
"""Characters of one progress line taken from the agent's words."""


class SessionFault(Exception):
    """The agent broke the session's rules; the text is safe to show the model."""


SLACK = 1024
"""Characters kept past a limit before masking: a secret cut in half by the limit would not be
recognised, and its first half would show. Masked first, cut after."""


@dataclass
class _Answer:
    """The agent's own words for its final answer, bounded as they stream in."""

    limit: int
    mask: Callable[[str], str]
    parts: list[str] = field(default_factory=list)
    size: int = 0
    dropped: int = 0

    def add(self, text: str) -> None:
        room = self.limit + SLACK - self.size
        if room <= 0:
            self.dropped += len(text)
            return
        self.parts.append(text[:room])
        self.size += min(len(text), room)
        self.dropped += max(0, len(text) - room)

    def raw(self) -> str:
        return self.mask("".join(self.parts))

    def text(self) -> str:
        out = self.raw()
        dropped = self.dropped + max(0, len(out) - self.limit)
        return out[: self.limit] + (f"\n[... {dropped} more characters cut ...]" if dropped else "")


class ChitalClient:
    """The ACP ``Client`` of one delegation (one session)."""

    def __init__(
        self,
        name: str,
        settings: AcpAgent,
        files: HostFiles,
        ask: Asker,
        progress: Progress,
        mask: Callable[[str], str] = lambda text: text,
    ) -> None:
        """``mask`` hides the daemon's secrets (and the agent's own key) by value: applied to
        whatever the agent wrote before it is cut and shown or asked about."""
        self.name = name
        self.settings = settings
        self.files = files
        self.ask = ask
        self.progress = progress
        self.session_id = ""
        self.updates = 0
        self.mask = mask
        self.answer = _Answer(settings.max_result_chars, mask)
        self.written: list[str] = []
        self.fault: SessionFault | None = None
        self.faulted = asyncio.Event()
        self.permissions: list[tuple[str, bool]] = []
        self._last_shown = 0.0
        self._pending: str | Callable[[], str] = ""
        self._tools: dict[str, str] = {}
        self._asks = 0
        self._asking = asyncio.Lock()
        self._reading = asyncio.Lock()
        self.backpressure: Callable[[], Awaitable[None]] | None = None
        """Waits while our writes to the agent are not yet taken (its stdin's ``drain``): a file
        read is served only then, see :meth:`read_text_file`."""

    # -- faults and progress ----------------------------------------------------------------------
    def fail(self, why: str) -> SessionFault:
        """Record the first fault (the one the model is told) and wake the session to end."""
        if self.fault is None:
            self.fault = SessionFault(why)
            self.faulted.set()
        return self.fault

    def _show(self, line: str | Callable[[], str], *, force: bool = False) -> None:
        """One progress line, at most one per ``progress_interval``; the latest in between waits
        (made only when shown)."""
        now = time.monotonic()
        self._pending = line
        if force or now - self._last_shown >= self.settings.progress_interval:
            self._last_shown = now
            pending, self._pending = self._pending, ""
            self.progress(pending() if callable(pending) else pending)

    def flush(self) -> None:
        if self._pending:
            self._show(self._pending, force=True)

    def _span(self, text: str, limit: int) -> str:
        """The agent's ``text`` for the chat: masked, then cut, as an inline code span."""
        return code_span(self.mask(text[: limit + SLACK]), limit)

    def _check_session(self, session_id: str) -> None:
        if self.session_id and session_id != self.session_id:
            raise RequestError.invalid_params({"sessionId": "unknown session"})

    # -- the Client protocol ----------------------------------------------------------------------
    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates += 1
        if self.updates > self.settings.max_updates:
            self.fail(
                f"the coding agent {self.name} flooded the session with more than "
                f"{self.settings.max_updates} updates; it was stopped"
            )
            return
        if session_id != self.session_id:
            return  # another session's (or a forged one's) update: not ours to show
        who = f"🤖 {self.name}"
        if isinstance(update, AgentMessageChunk):
            content = update.content
            if isinstance(content, TextContentBlock):
                self.answer.add(content.text)
                self._show(lambda: f"{who}: {code_span(self.answer.raw()[-PROGRESS_CHARS:], PROGRESS_CHARS)}")
        elif isinstance(update, ToolCallStart):
            title = self._span(update.title, 80)
            self._tools[update.tool_call_id[:100]] = title
            if len(self._tools) > 500:
                self._tools.pop(next(iter(self._tools)))
            self._show(f"{who} 🔧 {title}")
        elif isinstance(update, ToolCallProgress) and update.status in ("completed", "failed"):
            title = self._tools.get(update.tool_call_id[:100], "a step")
            self._show(f"{who} {'✔' if update.status == 'completed' else '✖'} {title}")
        elif isinstance(update, AgentPlanUpdate):
            done = sum(1 for e in update.entries if e.status == "completed")
            self._show(f"{who} 📋 plan: {done}/{len(update.entries)} steps done")

    async def request_permission(
        self, session_id: str, tool_call: ToolCallUpdate, options: list[PermissionOption], **kwargs: Any
    ) -> RequestPermissionResponse:
        self._check_session(session_id)
        self._asks += 1  # counted on arrival: requests queued behind the lock count too
        if self._asks > self.settings.max_permission_requests:
            self.fail(
                f"the coding agent {self.name} made more than {self.settings.max_permission_requests} "
                "permission requests; it was stopped"
            )
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        async with self._asking:  # the SDK runs requests concurrently: one prompt in the chat at a time
            if self.fault is not None:
                return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
            return await self._ask_one(tool_call, options)

    async def _ask_one(
        self, tool_call: ToolCallUpdate, options: list[PermissionOption]
    ) -> RequestPermissionResponse:
        raw_title = tool_call.title or tool_call.kind or "an action"
        title = one_line(self.mask(raw_title[: 200 + SLACK]), 200)
        detail = self.mask(_describe(tool_call))[:1500]
        allow = next((o for o in options if o.kind == "allow_once"), None) or next(
            (o for o in options if o.kind == "allow_always"), None
        )
        reject = next((o for o in options if o.kind in ("reject_once", "reject_always")), None)
        self._show(f"🤖 {self.name} asks: {code_span(title, 120)}", force=True)
        approved = allow is not None and await self.ask(title, detail)
        self.permissions.append((title, approved))
        if approved and allow is not None:
            return RequestPermissionResponse(
                outcome=AllowedOutcome(option_id=allow.option_id, outcome="selected")
            )
        if reject is not None:
            return RequestPermissionResponse(
                outcome=AllowedOutcome(option_id=reject.option_id, outcome="selected")
            )
        return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))

    def _confined(self, path: str, verb: str) -> str:
        """The virtual path of ``path`` if it names a file in the workspace; else the session ends."""
        if not isinstance(path, str) or not path.startswith("/") or "\x00" in path:
            raise self._refuse(f"{verb} {one_line(str(path), 200)!r}: ACP paths must be absolute")
        norm = "/" + posixpath.normpath(path).lstrip("/")
        if not norm.startswith(WORKSPACE + "/"):
            raise self._refuse(f"{verb} {one_line(path, 200)!r}: outside the workspace {WORKSPACE}")
        return norm

    def _refuse(self, why: str) -> RequestError:
        self.fail(f"the coding agent {self.name} tried to {why}; the session was ended")
        return RequestError.invalid_params({"path": "refused: outside the workspace"})

    async def write_text_file(
        self, session_id: str, path: str, content: str, **kwargs: Any
    ) -> WriteTextFileResponse | None:
        self._check_session(session_id)
        virtual = self._confined(path, "write")
        data = content.encode()
        if len(data) > self.settings.max_file_bytes:
            raise RequestError.invalid_params(
                {"content": f"larger than {self.settings.max_file_bytes} bytes; refused"}
            )
        try:
            await asyncio.to_thread(self.files.write, virtual, data)
        except SandboxError as exc:
            if isinstance(exc, PathRefused):
                raise self._refuse(
                    f"write {one_line(path, 200)!r} through a link out of the workspace"
                ) from None
            raise RequestError.invalid_params({"path": str(exc)}) from None
        if virtual not in self.written and len(self.written) < 200:
            self.written.append(virtual)
        self._show(f"🤖 {self.name} ✏️ wrote {self._span(virtual[len(WORKSPACE) + 1 :], 100)}")
        return WriteTextFileResponse()

    async def read_text_file(
        self, session_id: str, path: str, line: int | None = None, limit: int | None = None, **kwargs: Any
    ) -> ReadTextFileResponse:
        self._check_session(session_id)
        virtual = self._confined(path, "read")
        # The SDK serves requests concurrently and queues their answers without limit: an agent
        # that asks for a 2 MB file thousands of times and never reads its stdin would have us
        # hold every copy. One read at a time, each only once the previous answers were taken.
        async with self._reading:
            if self.backpressure is not None:
                with contextlib.suppress(ConnectionError):
                    await self.backpressure()
            return await self._read(path, virtual, line, limit)

    async def _read(
        self, path: str, virtual: str, line: int | None, limit: int | None
    ) -> ReadTextFileResponse:
        try:
            data = await asyncio.to_thread(self.files.read_bytes, virtual, self.settings.max_file_bytes)
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise RequestError.invalid_params({"path": "not a UTF-8 text file"}) from None
        except SandboxError as exc:
            if isinstance(exc, PathRefused):
                raise self._refuse(
                    f"read {one_line(path, 200)!r} through a link out of the workspace"
                ) from None
            raise RequestError.invalid_params({"path": str(exc)}) from None
        if line is not None or limit is not None:
            lines = text.splitlines(keepends=True)
            start = max((line or 1) - 1, 0)
            text = "".join(lines[start : start + limit] if limit is not None else lines[start:])
        return ReadTextFileResponse(content=text)

    def on_connect(self, conn: Any) -> None:
        pass


def _describe(tool_call: ToolCallUpdate) -> str:
    """What the agent wants to do, for the approval prompt: kind and raw input, bounded."""
    import json

    parts = []
    if tool_call.kind:
        parts.append(f"kind: {tool_call.kind}")
    if tool_call.raw_input is not None:
        try:
            raw = json.dumps(tool_call.raw_input, ensure_ascii=False, default=str)
        except (TypeError, ValueError):
            raw = str(tool_call.raw_input)
        parts.append(f"input: {raw[: 1500 + SLACK]}")
    return "\n".join(parts)
