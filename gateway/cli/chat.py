"""``chital chat``: talk to the agent in this terminal, on the same database and agent as the daemon.

What makes it a REPL that behaves:

- **No input thread.** Lines are read on the event loop (``loop.add_reader`` on stdin), and Ctrl-C
  arrives as a signal the loop handles (``loop.add_signal_handler``). With ``input()`` in an executor
  thread, as before, Ctrl-C raised wherever the main thread happened to be, and the interpreter then
  waited at exit for the thread still blocked in ``input()``. Here Ctrl-C while an answer is being
  written cancels that turn (the harness closes it cleanly: the next question goes on in the same
  thread); Ctrl-C at the prompt, a second Ctrl-C while a cancel winds down, Ctrl-D or ``/quit``
  leave with status 0. Line editing is the terminal's own (canonical mode), as it was.
- **Quiet.** Log records (redacted, as the daemon's) and Python warnings go to ``<storage>/chat.log``,
  which the banner names; nothing prints over the conversation.
- **The chat commands** are the gateway's texts and logic (gateway/commands/builtin.py) where they apply.
- **Failures say why.** A failed turn prints the user's message and, since whoever sits at this
  terminal is the operator, the cause and the model's URL (``TurnFailed.detail``).
"""

from __future__ import annotations

import argparse
import asyncio
import codecs
import contextlib
import getpass
import logging
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from gateway.cli.common import load_config_arg, sandbox_note
from gateway.config.schema import Config

if TYPE_CHECKING:
    from agent.events import AgentEvent, PlanItem
    from gateway.agent_api import AgentHarness
    from gateway.commands.builtin import Command
    from gateway.store.journal import Store

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""C0 and C1 control characters but tab and newline: with them the model's text (prompt-injected
by a web page or a file) could send the terminal escape sequences (set the clipboard with OSC 52,
rewrite the screen, retitle the window)."""


def printable(text: str) -> str:
    """``text`` without the control characters a terminal would act on."""
    return _CONTROL.sub("", text)


LOG_FILE = "chat.log"
LOG_BYTES = 5 << 20
"""The log file is rotated at this size (one old file kept)."""
CANCEL_WAIT = 5.0
"""Seconds a cancelled turn may take to wind down (the harness waits for its checkpoint write)."""
PROMPT = "you> "
log = logging.getLogger(__name__)


# -- input ------------------------------------------------------------------------------------------
class StdinLines:
    """Lines from stdin, read on the event loop without a thread; ``None`` at the end of input.

    A terminal in canonical mode hands over one edited line per read; a pipe may hand over several
    lines or half of one, so bytes are decoded incrementally and split here. A regular file or
    ``/dev/null`` cannot be polled (epoll refuses them) but never blocks either: read in chunks.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: asyncio.Queue[str | None] = asyncio.Queue()
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._partial = ""
        self._fd: int | None = None
        self._polled = False
        self._file_task: asyncio.Task[None] | None = None
        self._ended = False

    def start(self) -> None:
        try:
            self._fd = sys.stdin.fileno()
        except (AttributeError, OSError, ValueError):  # no stdin at all (closed, or None)
            self._end()
            return
        try:
            self._loop.add_reader(self._fd, self._readable)
            self._polled = True
        except (OSError, ValueError):
            self._file_task = self._loop.create_task(self._read_file())

    def stop(self) -> None:
        if self._polled and self._fd is not None:
            self._loop.remove_reader(self._fd)
            self._polled = False
        if self._file_task is not None:
            self._file_task.cancel()

    async def get(self) -> str | None:
        line = await self._queue.get()
        if line is None:
            self._queue.put_nowait(None)  # every later call sees the end too
        return line

    def wake(self) -> None:
        """Make a waiting :meth:`get` return ``None`` (the user leaves with Ctrl-C at the prompt)."""
        self._queue.put_nowait(None)

    def _readable(self) -> None:
        assert self._fd is not None
        try:
            data = os.read(self._fd, 65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # the terminal went away (EIO after a hang-up)
            data = b""
        self._feed(data)

    async def _read_file(self) -> None:
        assert self._fd is not None
        while not self._ended:
            try:
                data = os.read(self._fd, 65536)
            except OSError:
                data = b""
            self._feed(data)
            await asyncio.sleep(0)

    def _feed(self, data: bytes) -> None:
        if not data:
            self._end()
            return
        self._partial += self._decoder.decode(data)
        *lines, self._partial = self._partial.split("\n")
        for line in lines:
            self._queue.put_nowait(line.rstrip("\r"))

    def _end(self) -> None:
        if self._ended:
            return
        self._ended = True
        self.stop()
        rest = self._partial + self._decoder.decode(b"", final=True)
        if rest.strip():
            self._queue.put_nowait(rest)
        self._queue.put_nowait(None)


# -- what the banner and /status show ---------------------------------------------------------------
def model_endpoint(cfg: Config) -> str:
    """The model's base URL as configured, without user:password or query."""
    from gateway.cli.probes import OPENAI_DEFAULT_BASE, openai_compatible

    spec = cfg.model_spec()
    kwargs = spec.kwargs()
    url = kwargs.get("base_url") or kwargs.get("openai_api_base")
    if not url and openai_compatible(spec.use):
        url = os.environ.get("OPENAI_BASE_URL") or OPENAI_DEFAULT_BASE
    if not isinstance(url, str) or not url:
        return "the provider's default endpoint"
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path}"


def help_text() -> str:
    """The gateway's command list, as it applies in a terminal: the registry's rows marked
    ``terminal`` (/stop is Ctrl-C here; the others need the daemon)."""
    from gateway.commands.builtin import REGISTRY

    lines = REGISTRY.help_lines(rows=[row for row in REGISTRY.rows if row.terminal])
    lines += [
        "/quit, /exit — leave (so does Ctrl-D)",
        "Ctrl-C — cancel the answer being written (at the prompt: leave)",
        "Anything else you write goes to the agent.",
    ]
    return "\n".join(lines)


# -- the REPL ---------------------------------------------------------------------------------------
class Chat:
    """The loop: a line is a command or a question; a question's turn runs as a task Ctrl-C cancels."""

    def __init__(
        self, cfg: Config, store: Store, harness: AgentHarness, log_path: Path | None, secrets: list[str]
    ) -> None:
        self.cfg = cfg
        self.store = store
        self.harness = harness
        self.log_path = log_path
        self.secrets = secrets
        self.user = f"cli:{getpass.getuser()}"
        """Conversation and user key: the terminal is one user's direct chat."""
        self.thread_id = ""
        self.leave = asyncio.Event()
        self.turn: asyncio.Task[None] | None = None
        self.lines = StdinLines(asyncio.get_running_loop())

    def interrupt(self) -> None:
        """Ctrl-C: cancel the answer being written; otherwise (at the prompt, or a second time) leave."""
        turn = self.turn
        if turn is not None and not turn.done() and not turn.cancelling():
            turn.cancel()
            return
        self.leave.set()
        self.lines.wake()

    def sandbox(self) -> tuple[bool, str]:
        """(fine, one line): what the agent's start-up probe found (agent/sandbox/probe.py); with
        no agent running (the model is not configured), whether bubblewrap is there at all."""
        state = getattr(self.harness, "sandbox_state", None)
        if state is None:
            fine, note = sandbox_note(self.cfg)
            return fine, f"{note} (not started: the agent is not set up)"
        found = state()
        label = "" if found.state in ("ready", "off") else f"{found.state.upper()}: "
        return found.ok, label + found.detail

    def banner(self) -> str:
        from gateway.daemon.agent_setup import UnconfiguredHarness

        spec = self.cfg.model_spec()
        if isinstance(self.harness, UnconfiguredHarness):
            model = f"NOT CONFIGURED ({spec.name}): {self.harness.reason}"
        else:
            model = f"{self.harness.model_name} at {model_endpoint(self.cfg)}"
        logs = str(self.log_path) if self.log_path else "stderr (the data directory is not writable)"
        sandbox_fine, sandbox = self.sandbox()
        return "\n".join(
            [
                "chital chat — talking to the agent as the daemon would, on its database.",
                f"  model:   {model}",
                f"  sandbox: {'' if sandbox_fine else '⚠ '}{sandbox}",
                f"  logs:    {logs}",
                "/help lists the commands. Ctrl-C cancels an answer; Ctrl-D or /quit leaves.",
            ]
        )

    async def run(self) -> None:
        self.thread_id = await self.store.thread_for(self.user)
        print(self.banner(), flush=True)
        self.lines.start()
        try:
            while not self.leave.is_set():
                print(PROMPT, end="", flush=True)
                line = await self.lines.get()
                if line is None or self.leave.is_set():
                    print(flush=True)  # leave the shell's prompt on a line of its own
                    return
                text = line.strip()
                if not text:
                    continue
                if not await self.step(text):
                    return
        finally:
            self.lines.stop()
            await self._settle()  # a turn left by a second Ctrl-C gets CANCEL_WAIT s to wind down

    async def step(self, text: str) -> bool:
        """Handle one line; False to leave."""
        from gateway.commands.builtin import parse_command

        cmd = parse_command(text)
        if cmd is not None and (cmd.known or cmd.name in ("quit", "exit")):
            return await self.command(cmd)
        if cmd is not None:
            print(f"Unknown command /{cmd.name}. " + help_text())
            return True
        await self.ask(text)
        return True

    async def command(self, cmd: Command) -> bool:
        from gateway.commands.builtin import REGISTRY, memory_reply, new_text, thread_line
        from gateway.commands.registry import Who

        name, row = cmd.name, REGISTRY.get(cmd.name)
        if name in ("quit", "exit"):
            return False
        if name == "help":
            print(help_text())
        elif name == "new":
            self.thread_id = await self.store.new_thread(self.user)
            print(new_text(self.thread_id))
        elif name == "plan":
            print(printable(await self.plan_reply()))
        elif name == "stop":
            print("Nothing is running: Ctrl-C cancels an answer while it is being written.")
        elif name == "status":
            logs = str(self.log_path) if self.log_path else "stderr"
            lines = [
                await thread_line(self.harness, self.thread_id),
                f"Model: {self.harness.model_name} at {model_endpoint(self.cfg)}",
                f"Sandbox: {self.sandbox()[1]}",
                f"Logs: {logs}",
            ]
            print("\n".join(lines))
        elif name in ("memory", "forget"):
            print(printable(await memory_reply(self.harness.memory, self.user, name, direct=True)))
        elif row is not None and row.who is Who.ADMIN:
            print(f"/{name} decides pairing requests in chats; here use `chital pairing` (docs/access.md).")
        else:
            print(f"/{name} works in the chats the daemon (`chital run`) serves, not in this terminal.")
        return True

    async def plan_reply(self) -> str:
        """``/plan``: the thread's plan as its checkpoint holds it, as the turn prints it."""
        from gateway.delivery.plan import plan_plain

        items = await self.harness.plan(self.thread_id) if self.thread_id else ()
        if not items:
            return "No plan in this conversation yet: the agent writes one when a task takes several steps."
        return plan_plain(items, self._redact) + "\n(as the last answer left it)"

    def _redact(self, text: str) -> str:
        from channels.base import scrub

        return scrub(text, *self.secrets)

    async def ask(self, text: str) -> None:
        """Run one turn as a task that Ctrl-C can cancel, and wait for it (or for the user leaving)."""
        turn = self.turn = asyncio.create_task(self._answer(text))
        leaving = asyncio.create_task(self.leave.wait())
        try:
            await asyncio.wait({turn, leaving}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            leaving.cancel()
        if not turn.done():  # a second Ctrl-C: leave; _settle gives the turn time to wind down
            print("\n⏹ Cancelled.", flush=True)
            return
        self.turn = None
        if turn.cancelled():
            print("\n⏹ Cancelled. Ask the next question (Ctrl-C again or Ctrl-D leaves).", flush=True)
        elif turn.exception() is not None:
            exc = turn.exception()
            log.error("the turn failed", exc_info=exc)
            print(f"\n⚠ The turn failed ({type(exc).__name__}); the details are in the log.", flush=True)

    async def _settle(self) -> None:
        turn = self.turn
        if turn is not None and not turn.done():
            turn.cancel()
            await asyncio.wait({turn}, timeout=CANCEL_WAIT)

    async def _answer(self, text: str) -> None:
        from agent.events import PlanUpdated, TextDelta
        from gateway.delivery.plan import plan_plain

        sys.stdout.write("chital> ")
        sys.stdout.flush()
        streamed = False
        plan: tuple[PlanItem, ...] | None = None
        # Cancelling this task raises inside the harness' generator, which closes the turn.
        events = self.harness.run(
            self.thread_id, user_id=self.user, message_id=f"cli-{time.time_ns()}", text=text
        )
        try:
            async for ev in events:
                if isinstance(ev, PlanUpdated):  # the checklist, printed when it changes
                    if ev.items != plan:
                        plan = ev.items
                        sys.stdout.write(f"\n{printable(plan_plain(plan, self._redact))}\n")
                        sys.stdout.flush()
                    continue
                sys.stdout.write(printable(self._shown(ev, streamed)))
                sys.stdout.flush()
                streamed = streamed or isinstance(ev, TextDelta)
        finally:
            if plan and any(item.status != "completed" for item in plan):
                # A plan left unfinished (abandoned, failed, Ctrl-C) says so, as in the chats.
                sys.stdout.write(f"\n{printable(plan_plain(plan, self._redact, final=True))}")
        sys.stdout.write("\n")
        sys.stdout.flush()

    def _shown(self, ev: AgentEvent, streamed: bool) -> str:
        """What the terminal prints for one event of a turn (``streamed``: text was printed)."""
        from agent.events import Clarification, Final, StatusUpdate, TextDelta, ToolProgress, TurnFailed
        from agent.plan import TOOL as PLAN_TOOL
        from channels.base import scrub

        if isinstance(ev, TextDelta):
            return ev.text
        if isinstance(ev, ToolProgress) and ev.phase == "start" and ev.name != PLAN_TOOL:  # checklist instead
            return f"\n  [{ev.name}{' ' + ev.detail if ev.detail else ''}]\n"
        if isinstance(ev, StatusUpdate):
            return f"\n  [{ev.text}]\n"
        if isinstance(ev, Clarification):
            return f"? {ev.question}"
        if isinstance(ev, Final):
            return "" if streamed else ev.text
        if isinstance(ev, TurnFailed):
            cause = f"\n  cause: {scrub(ev.detail, *self.secrets)}" if ev.detail else ""
            return f"{chr(10) if streamed else ''}⚠ {ev.message}{cause}"
        return ""


# -- set-up -----------------------------------------------------------------------------------------
def log_to_file(cfg: Config) -> Path | None:
    """Send every log record (redacted) and Python warning to ``<storage>/chat.log``; None, and
    warnings only on stderr, when that file cannot be written."""
    from gateway.ops.logs import setup_logging

    path = cfg.storage.path / LOG_FILE
    handler: logging.Handler
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        from logging.handlers import RotatingFileHandler  # `chital chat` only, not `chital run`

        handler = RotatingFileHandler(path, maxBytes=LOG_BYTES, backupCount=1, encoding="utf-8")
        with contextlib.suppress(OSError):
            path.chmod(0o600)
        found: Path | None = path
    except OSError:
        handler = logging.StreamHandler(sys.stderr)
        handler.setLevel(logging.WARNING)
        found = None
    setup_logging(cfg, handler)
    logging.captureWarnings(True)
    return found


async def _chat(cfg: Config, log_path: Path | None) -> int:
    from channels.base import scrub
    from gateway.config.data_dir import secure
    from gateway.daemon.agent_setup import open_harness
    from gateway.daemon.lifecycle import database_error, one_line
    from gateway.ops.logs import secrets_of
    from gateway.store.journal import open_store

    secrets = secrets_of(cfg)
    try:
        fixed = secure(cfg)  # the daemon's data directory: 0700, files 0600 (gateway/config/data_dir.py)
        if fixed:
            log.warning("%s", fixed)
        store = await open_store(cfg.storage)  # the daemon's: SQLite under storage.path, or PostgreSQL
    except Exception as exc:
        if cfg.storage.database_url:
            print(f"chital: cannot open the database: {scrub(one_line(exc), *secrets)}", file=sys.stderr)
        else:
            print(f"chital: {database_error(cfg.storage.path / 'gateway.sqlite', exc)}", file=sys.stderr)
        return 1
    loop = asyncio.get_running_loop()
    try:
        harness = await open_harness(cfg)
        try:
            chat = Chat(cfg, store, harness, log_path, secrets)
            # Held until everything is closed: a Ctrl-C while closing only asks to leave again.
            loop.add_signal_handler(signal.SIGINT, chat.interrupt)
            await chat.run()
        except Exception as exc:  # our bug or a broken database: one line here, the traceback in the log
            log.error("chital chat failed", exc_info=exc)
            where = f"; the traceback is in {log_path}" if log_path else ""
            what = scrub(one_line(exc), *secrets)
            print(f"\nchital: chat failed: {what}{where}", file=sys.stderr)
            return 1
        finally:
            await harness.close()
    finally:
        await store.close()
        with contextlib.suppress(ValueError, RuntimeError):
            loop.remove_signal_handler(signal.SIGINT)
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    cfg = load_config_arg(args)
    log_path = log_to_file(cfg)
    try:
        return asyncio.run(_chat(cfg, log_path))
    except KeyboardInterrupt:  # Ctrl-C while starting (before the REPL took over the signal)
        print(flush=True)
        return 0
