"""A message that arrives while a turn runs in its conversation: queue it, interrupt the turn, or
steer the turn with it (docs/steering.md).

The mode comes from the message itself (``/queue``, ``/steer`` or ``/interrupt`` before its
text), else the conversation's (an admin's ``/busy``, the ``conversation_busy`` table), else its
channel's ``busy_mode`` (default ``queue``: today's behaviour). It is looked up only when a turn
runs in the conversation: an idle conversation's message costs nothing more than before, and a
busy one's at most one read per :data:`MODE_CACHE_SECONDS`.

Who may steer or interrupt: only someone whose message passed the access policy (a stranger's
never reaches this), and only the sender of the running turn or an admin. Another member of a
group is queued: their message never lands in someone else's answer, nor cuts it short.

Every message is journaled first, as a turn of its own, whatever its mode:

- **interrupt**: the running turn is stopped as by ``/stop``, its reply ends with
  :data:`INTERRUPTED` under what it had written so far (a restart shows the note), and the new
  message is answered with the stopped one quoted as context (kept in its journal entry, so a
  restarted turn quotes it too).
- **steer**: the message waits in the queue behind the running turn *and* in that turn's inbox.
  The turn takes it at its next model call (agent/steering.py); its reply then reads
  :data:`ADDED`. When the turn that took it ends, its entry is done and leaves the queue. When no
  model call took it (it came after the last one, or as the turn was finishing), it stays in the
  queue and is answered as a queued message: never dropped, never answered twice. A turn cut by a
  shutdown or kill -9 leaves it open in the journal: the restart answers it (or, when the history
  already holds it, replays the answer of the turn that took it: agent/history.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from agent.provenance import Provenance
from agent.steering import SteerMessage
from agent.turn import ContextMessage, TurnOptions
from channels.base import Inbound
from gateway.config.sections import BUSY_MODES, BusyMode
from gateway.intake import access
from gateway.intake.provenance import forwarded_sources, inbound_sources
from gateway.store.entries import JournalEntry, JournalKind, JournalState
from gateway.turns.outcome import TurnOutcome
from gateway.turns.queue import Stop

if TYPE_CHECKING:
    from agent.redact import Redactor
    from gateway.config.schema import Config
    from gateway.ops.tasks import TaskTracker
    from gateway.store.journal import Store
    from gateway.turns.inflight import InFlight
    from gateway.turns.queue import TurnQueue

log = logging.getLogger(__name__)

ADDED = "↪️ Added to the current answer."
"""A steered message's reply once the running turn took it."""
INTERRUPTED = "⏭ Interrupted by a newer message; I'm answering that one instead."
"""Under what an interrupted turn had written so far."""
INTERRUPTS_KEY = "chital_interrupts"
"""``Inbound.extra`` of a message that interrupted a turn: that turn's author and text."""
ONE_OFF: dict[str, BusyMode] = {"queue": "queue", "steer": "steer", "interrupt": "interrupt"}
"""Commands that set the mode of the one message they start."""
MODE_CACHE_SECONDS = 30.0
"""How long a conversation's ``/busy`` choice is remembered without reading it again (another
daemon's change shows within this; this daemon's own at once)."""
MODE_CACHE_MAX = 4096
CONTEXT_CHARS = 4000
"""Characters of an interrupted message quoted to the next turn."""
MAX_STEERS = 10
"""Messages waiting in one turn's inbox; more are queued (a flood does not grow one turn)."""


class BusyHost(Protocol):
    """What busy modes use of the daemon (the Gateway is one)."""

    config: Config
    store: Store
    turns: TurnQueue
    inflight: InFlight
    tasks: TaskTracker
    redact: Redactor


@dataclass(frozen=True, slots=True)
class Route:
    """What to do with a message for a busy conversation: ``mode`` against the turn ``running``."""

    mode: BusyMode
    running: JournalEntry


class _Parsed(Protocol):
    """A parsed ``/name args`` (gateway/commands/registry.py's ``Command``, which this layer
    cannot import)."""

    @property
    def name(self) -> str: ...
    @property
    def args(self) -> str: ...
    @property
    def known(self) -> bool: ...


C = TypeVar("C", bound=_Parsed)


def one_off(command: C | None, inbound: Inbound) -> tuple[C | None, BusyMode | None, Inbound]:
    """``/steer text`` (``/queue``, ``/interrupt``): no command but a turn on ``text``, in that
    mode. Anything else, and such a command without text (it answers with its usage), is as it
    was."""
    mode = ONE_OFF.get(command.name) if command is not None and command.known and command.args else None
    if command is None or mode is None:
        return command, None, inbound
    return None, mode, dataclasses.replace(inbound, text=command.args)


def mode_text(mode: str) -> str:
    return {
        "queue": "queue (a message sent while I work waits and is answered after the current answer)",
        "interrupt": "interrupt (a message sent while I work stops the current answer and is answered "
        "instead, with the stopped one as context)",
        "steer": "steer (a message sent while I work is added to the current answer)",
    }[mode]


class _Inbox:
    """The inbox handed to one turn (agent/steering.py calls :meth:`take` before each model call)."""

    def __init__(self, busy: Busy, key: str) -> None:
        self._busy, self._key = busy, key

    def take(self) -> list[SteerMessage]:
        return self._busy.take(self._key)


class Busy:
    """Busy modes of one daemon: the mode lookup, the inboxes of running turns, interrupts."""

    def __init__(self, host: BusyHost) -> None:
        self._host = host
        self._modes: dict[str, tuple[str | None, float]] = {}
        self._waiting: dict[str, list[JournalEntry]] = {}
        """Running turn's key → messages offered to it, not taken yet."""
        self._taken: dict[str, list[JournalEntry]] = {}
        """Running turn's key → messages it took into a model call."""

    # -- intake ---------------------------------------------------------------------------------
    async def mode(self, inbound: Inbound) -> BusyMode:
        """The conversation's mode: ``/busy``'s choice, else the channel's ``busy_mode``."""
        now = time.monotonic()
        cached = self._modes.get(inbound.conversation)
        if cached is None or cached[1] < now:
            chosen = await self._host.store.busy_mode(inbound.conversation)
            if len(self._modes) >= MODE_CACHE_MAX:
                self._modes.pop(next(iter(self._modes)))
            cached = self._modes[inbound.conversation] = (chosen, now + MODE_CACHE_SECONDS)
        chosen = cached[0]
        if chosen in BUSY_MODES:
            return chosen
        return getattr(self._host.config.channels, inbound.platform).busy_mode

    def forget(self, conversation: str) -> None:
        """``/busy`` changed the conversation's mode: read it again at its next busy message."""
        self._modes.pop(conversation, None)

    async def route(
        self, inbound: Inbound, admin: bool, asked: BusyMode | None
    ) -> tuple[Inbound, Route | None]:
        """How to handle ``inbound`` (``asked``: the mode its ``/queue``, ``/steer`` or
        ``/interrupt`` asks for), and the message as it is journaled. No route: as today, queued
        behind whatever runs."""
        route = await self._route(inbound, admin, asked)
        return self.marked(inbound, route), route

    async def _route(self, inbound: Inbound, admin: bool, asked: BusyMode | None) -> Route | None:
        running, _ = self._host.turns.status(inbound.conversation)
        if running is None:
            return None  # nothing runs: no lookup at all (the common case)
        mode = asked or await self.mode(inbound)
        if mode == "queue" or not _may_touch(running, inbound, admin):
            return None
        if mode == "steer" and (inbound.attachments or len(self._waiting.get(running.key, ())) >= MAX_STEERS):
            return None  # files need a turn of their own (uploads, images): queued
        return Route(mode, running)

    def marked(self, inbound: Inbound, route: Route | None) -> Inbound:
        """``inbound`` as it is journaled: an interrupting message carries what it interrupts."""
        interrupts = route is not None and route.mode == "interrupt"
        if not interrupts and INTERRUPTS_KEY not in inbound.extra:
            return inbound  # the common case: journaled as it came
        extra = {k: v for k, v in inbound.extra.items() if k != INTERRUPTS_KEY}
        if route is not None and interrupts:
            old = route.running.inbound
            extra[INTERRUPTS_KEY] = {
                "author": old.sender_name or old.sender_id,
                "text": old.text[:CONTEXT_CHARS],
            }
        return dataclasses.replace(inbound, extra=extra)

    async def journaled(self, entry: JournalEntry, route: Route | None) -> None:
        """``entry`` is in the journal: offer it to the running turn, or interrupt that turn."""
        if route is None or self._host.turns.status(entry.conversation)[0] is not route.running:
            return  # it ended meanwhile: the message is simply queued (and runs next)
        if route.mode == "steer":
            self._waiting.setdefault(route.running.key, []).append(entry)
        elif route.mode == "interrupt":
            await self._interrupt(route.running)

    async def _interrupt(self, target: JournalEntry) -> None:
        """Stop the running turn ``target`` as /stop does (gateway/turns/stopping.py), with its own
        note: the journal says so before anything else, and the turn's handler shows it."""
        if self._host.turns.stop(target.key, INTERRUPTED) is not Stop.CANCELLED:
            return  # its answer is going out already: the new message waits for it
        await self._host.store.journal_stop(target, INTERRUPTED)

    # -- the running turn -----------------------------------------------------------------------
    def with_inbox(self, entry: JournalEntry, options: TurnOptions) -> TurnOptions:
        """The turn of ``entry``'s options with what it needs: its inbox (busy mode ``steer``;
        a turn started by the bot, a schedule's, takes none) and the message it interrupted."""
        if self._waiting:  # offered to a turn that ended before taking it: it runs on its own now
            for key, offered in list(self._waiting.items()):
                kept = [e for e in offered if e.key != entry.key]
                if len(kept) != len(offered):
                    self._waiting[key] = kept
                    if not kept:
                        del self._waiting[key]
        interrupted = entry.inbound.extra.get(INTERRUPTS_KEY)
        if isinstance(interrupted, dict):
            quoted = ContextMessage(
                author=self._host.redact(str(interrupted.get("author", ""))),
                text=self._host.redact(str(interrupted.get("text", ""))[:CONTEXT_CHARS]),
            )
            options = dataclasses.replace(options, context=(*options.context, quoted))
        if entry.kind is JournalKind.TURN and not entry.inbound.extra.get(access.STARTED_BY_BOT):
            options = dataclasses.replace(options, inbox=_Inbox(self, entry.key))
        return options

    def take(self, key: str) -> list[SteerMessage]:
        """The messages waiting for the turn ``key``, now its (called before its model call)."""
        waiting = self._waiting.pop(key, None)
        if not waiting:
            return []
        self._taken.setdefault(key, []).extend(waiting)
        for entry in waiting:
            self._host.tasks.spawn(self._show_added(entry), f"steered:{entry.key}")
        return [
            SteerMessage(
                e.key, e.inbound.user, self._host.redact(e.inbound.text.strip()), _sources(e.inbound)
            )
            for e in waiting
        ]

    async def _show_added(self, entry: JournalEntry) -> None:
        """The steered message's reply: its queued sign (if shown) edited, else a new message."""
        reply = self._host.inflight.reply(entry)
        with contextlib.suppress(Exception):
            await reply.status(ADDED)

    async def settle(self, key: str, outcome: TurnOutcome | None) -> None:
        """The turn ``key`` ended with ``outcome`` (None: cut by a shutdown, or another daemon took
        it over). Messages it never took stay queued and are answered after it. Messages it took are
        done with it when it ended here (answered, failed, stopped, paused for an approval): they
        leave the queue. Cut, they stay open in the journal and in the queue."""
        self._waiting.pop(key, None)
        taken = self._taken.pop(key, None)
        if not taken or outcome is None:
            return
        for entry in taken:
            if self._host.turns.stop(entry.key) is not Stop.REMOVED:
                continue  # not waiting here any more (a /stop took it off): its outcome is shown
            try:
                if outcome is TurnOutcome.STOPPED:
                    reply = self._host.inflight.reply(entry)
                    with contextlib.suppress(Exception):
                        await reply.status("⏹ Stopped with the answer it was added to.")
                await self._host.store.journal_set(entry.key, JournalState.DONE)
            except Exception as exc:  # the database: the entry stays open, a restart replays it
                log.warning("could not mark the steered message %s done: %s", entry.key, exc)
            finally:
                self._host.inflight.release(entry.key)
                self._host.inflight.drop_reply(entry.key)


def _sources(inbound: Inbound) -> str | None:
    """What a steered message carries to the turn, as its own turn would (gateway/turns/options.py):
    a forwarded message is someone else's words, a firing's message its schedule's sources."""
    return Provenance(inbound_sources(inbound) + forwarded_sources(inbound)).to_json()


def _may_touch(running: JournalEntry, inbound: Inbound, admin: bool) -> bool:
    """Whether ``inbound``'s sender may steer or interrupt the turn ``running``: its own sender,
    or an admin; never a turn the bot started (a schedule's firing)."""
    started_by_bot: Any = running.inbound.extra.get(access.STARTED_BY_BOT)
    if running.kind is not JournalKind.TURN or started_by_bot:
        return False
    return admin or running.inbound.user == inbound.user
