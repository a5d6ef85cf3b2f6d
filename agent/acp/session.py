"""One delegation: start the agent's adapter in the sandbox, speak ACP to it, end it for sure.

The session is the official SDK's (``acp.connect_to_agent`` over the process's pipes); what this
module adds is the boundary around it. The adapter is started by the sandbox provider
(:meth:`~agent.sandbox.base.Sandbox.spawn`: bubblewrap, the workspace as its working directory,
an environment holding only what its config entry names), and every way the session can end
(answer, ``/stop``, timeout, a silent or flooding or crashing agent, an escape attempt, the disk
quota) ends the same way: ``session/cancel`` when a session is open, then the whole process group
killed, and a specific :class:`DelegationError` for the model. Nothing is left running.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar, cast

from acp import PROTOCOL_VERSION, Client, RequestError, connect_to_agent, text_block
from acp.schema import ClientCapabilities, FileSystemCapabilities, Implementation

from agent.acp.client import Asker, ChitalClient, Progress
from agent.acp.settings import AcpAgent
from agent.sandbox import quota as disk
from agent.sandbox.base import Sandbox, kill_group
from agent.sandbox.paths import WORKSPACE

log = logging.getLogger(__name__)
T = TypeVar("T")

CANCEL_GRACE = 2.0
"""Seconds the agent gets to wind down after ``session/cancel`` before it is killed."""


class DelegationError(Exception):
    """The delegation failed; the text says how, in words the model can act on (no secrets)."""


@dataclass(frozen=True)
class Delegation:
    """What came back: the agent's answer (untrusted text), why it stopped, what it wrote."""

    answer: str
    stop_reason: str
    written: tuple[str, ...]
    permissions: tuple[tuple[str, bool], ...]
    updates: int


async def delegate(
    sandbox: Sandbox,
    name: str,
    settings: AcpAgent,
    task: str,
    *,
    ask: Asker,
    progress: Progress,
    mask: Callable[[str], str] = lambda text: text,
) -> Delegation:
    """Run ``task`` with agent ``name`` in ``sandbox``'s workspace; see the module docstring.
    ``mask`` hides secrets by value in what the agent says before it is cut and shown."""
    env = {k: v.get_secret_value() for k, v in settings.env.items()}
    try:
        proc = await sandbox.spawn(
            [settings.command, *settings.args],
            env,
            network=settings.network,
            memory_mb=settings.memory_mb,
            max_line=settings.max_message_bytes,
        )
    except OSError as exc:
        raise DelegationError(
            f"the coding agent {name} could not be started: {exc.strerror or exc}"
        ) from None
    assert proc.stdin is not None and proc.stdout is not None
    client = ChitalClient(name, settings, sandbox.files, ask, progress, mask)
    client.backpressure = proc.stdin.drain
    limit, most = settings.max_message_bytes, 2 * settings.max_updates + 1000

    def too_much(big: bool) -> None:
        if big:
            client.fail(f"the coding agent {name} sent a message larger than {limit} bytes; it was stopped")
        else:
            client.fail(
                f"the coding agent {name} flooded the session with more than {most} messages; it was stopped"
            )

    stdout, pump = _bounded(proc.stdout, limit, most, too_much)
    conn = connect_to_agent(cast(Client, client), proc.stdin, stdout)
    phase = "start"
    session_open = False
    try:
        async with asyncio.timeout(settings.timeout):
            phase = "initialize"
            await _step(
                client,
                proc,
                conn.initialize(
                    protocol_version=PROTOCOL_VERSION,
                    client_capabilities=ClientCapabilities(
                        fs=FileSystemCapabilities(read_text_file=True, write_text_file=True), terminal=False
                    ),
                    client_info=Implementation(name="chital", version="1"),
                ),
                settings.init_timeout,
                name,
                phase,
            )
            phase = "session/new"
            session = await _step(
                client,
                proc,
                conn.new_session(cwd=WORKSPACE, mcp_servers=[]),
                settings.init_timeout,
                name,
                phase,
            )
            client.session_id = session.session_id
            session_open = True
            phase = "session/prompt"
            asked = conn.prompt(session_id=session.session_id, prompt=[text_block(task)])
            response = await _step(client, proc, asked, None, name, phase, quota=sandbox)
    except TimeoutError:
        raise DelegationError(
            f"the coding agent {name} did not finish within {settings.timeout:g} s (during {phase}); "
            "its session was cancelled and its processes killed"
        ) from None
    finally:
        client.flush()
        await _end(conn, proc, client.session_id if session_open else "", pump)
    return Delegation(
        answer=client.answer.text(),
        stop_reason=str(response.stop_reason),
        written=tuple(client.written),
        permissions=tuple(client.permissions),
        updates=client.updates,
    )


async def _step(
    client: ChitalClient,
    proc: asyncio.subprocess.Process,
    call: Awaitable[T],
    limit: float | None,
    name: str,
    phase: str,
    *,
    quota: Sandbox | None = None,
) -> T:
    """Await one request while watching for a fault, the process's exit and the disk quota."""
    request = asyncio.ensure_future(call)
    fault = asyncio.ensure_future(client.faulted.wait())
    exited = asyncio.ensure_future(proc.wait())
    dog = asyncio.ensure_future(disk.watch(quota.dirs, quota.quota)) if quota is not None else None
    waiters = {request, fault, exited, *([dog] if dog else [])}
    try:
        done, _ = await asyncio.wait(waiters, timeout=limit, return_when=asyncio.FIRST_COMPLETED)
        if client.fault is not None:
            raise DelegationError(str(client.fault))
        if request in done:
            try:
                return request.result()
            except RequestError as exc:
                raise DelegationError(
                    f"the coding agent {name} answered {phase} with an error: {str(exc)[:300]}"
                ) from None
            except ConnectionError:
                raise await _exited(name, phase, proc) from None
            except Exception:  # a result that is not what the protocol says (ValidationError...)
                raise DelegationError(
                    f"the coding agent {name} answered {phase} with something that is not ACP"
                ) from None
        if dog is not None and dog in done:
            raise DelegationError(f"the coding agent {name} was stopped: {dog.result()}")
        if exited in done:
            raise await _exited(name, phase, proc)
        raise DelegationError(
            f"the coding agent {name} did not answer {phase} within {limit:g} s; it was stopped"
        )
    finally:
        for waiter in waiters:
            waiter.cancel()


def _bounded(
    source: asyncio.StreamReader, limit: int, most: int, over: Callable[[bool], None]
) -> tuple[asyncio.StreamReader, asyncio.Task[None]]:
    """The agent's stdout with every line bounded: the SDK's reader joins the pieces of an
    over-long line without limit, so a line that never ends would grow our memory. A line past
    ``limit`` calls ``over(True)``; more than ``most`` lines in all (garbage lines included, which
    the SDK skips with a log line each, so they never count as updates) ``over(False)``; the
    session ends and nothing more is passed on."""
    out = asyncio.StreamReader(limit=limit + 1)

    async def pump() -> None:
        pending = lines = 0
        try:
            while chunk := await source.read(65536):
                newline = chunk.rfind(b"\n")
                pending = len(chunk) - newline - 1 if newline >= 0 else pending + len(chunk)
                lines += chunk.count(b"\n")
                if pending > limit or lines > most:
                    over(pending > limit)
                    return
                out.feed_data(chunk)
        finally:
            out.feed_eof()

    return out, asyncio.ensure_future(pump())


async def _exited(name: str, phase: str, proc: asyncio.subprocess.Process) -> DelegationError:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(2):  # the pipe closes a moment before the exit is seen
            await proc.wait()
    code = proc.returncode
    how = f" (exit status {code})" if code is not None else ""
    return DelegationError(f"the coding agent {name} exited during {phase}{how} before answering")


async def _drain(stream: asyncio.StreamReader | None) -> None:
    while stream is not None and await stream.read(65536):
        pass


async def _end(
    conn: object, proc: asyncio.subprocess.Process, session_id: str, pump: asyncio.Task[None]
) -> None:
    """``session/cancel`` (when a session is open and the agent still runs), a short grace, then
    the process group killed and reaped; shielded, so a ``/stop`` cannot leave it half done."""

    async def finish() -> None:
        if session_id and proc.returncode is None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1):
                    await conn.cancel(session_id=session_id)  # type: ignore[attr-defined]
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CANCEL_GRACE):
                    await proc.wait()
        kill_group(proc)
        pump.cancel()  # only now: its end of file would close the connection before the cancel
        with contextlib.suppress(Exception):
            async with asyncio.timeout(2):
                await conn.close()  # type: ignore[attr-defined]
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(10):
                await proc.wait()
        with contextlib.suppress(Exception):  # read its pipe to the end, so the transport closes
            async with asyncio.timeout(5):
                await _drain(proc.stdout)

    ending = asyncio.ensure_future(finish())
    try:
        await asyncio.shield(ending)
    except asyncio.CancelledError:
        await ending  # /stop: still nothing left running when the turn's task ends
        raise
