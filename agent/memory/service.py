"""``MemoryService``: per-user long-term memory, learned in the background from finished turns.

The flow of one turn's memory:

1. ``note_turn`` (called by ``MemoryMiddleware`` when the model gives the turn's final answer) puts
   the turn on an in-memory inbox and returns at once: the reply is never delayed.
2. A writer task persists it as a pending row of the user and arms the user's debounce timer.
3. When the user has been quiet for ``debounce_seconds`` (or ``max_delay_seconds`` after the first
   pending turn), one non-streaming call of the chat model reads all pending turns and the known
   facts and answers with a JSON plan (add / update / delete). The facts are written and the
   pending rows removed in one transaction.
4. At start-up, users with pending rows are scheduled again: a restart loses no turn.

Tasks are created from ``start()``'s context with a fresh ``contextvars.Context``, never from
inside a graph run: a task spawned in the model node would inherit the run's callbacks and stream
the extraction's JSON into the user's chat.
"""

from __future__ import annotations

import asyncio
import builtins
import contextvars
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from contextlib import suppress
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from agent.memory.extraction import (
    BadExtraction,
    ExtractionPlan,
    apply_plan,
    build_messages,
    clean_fact,
    parse_plan,
)
from agent.memory.facts import Fact, FactStore, MemorySettings, PendingTurn, now_utc, trim_to_limit
from agent.memory.inject import MemoryMiddleware, render_section
from agent.middleware import is_retryable
from agent.provenance import NOT_THE_USERS_WORDS, PROVENANCE_KEY, Provenance
from agent.thread_context import without_context

if TYPE_CHECKING:
    from agent.memory.store import InlineSqliteStore

log = logging.getLogger(__name__)

_PRUNE_EVERY = 3600.0
_READ_TIMEOUT = 2.0
_MAX_PARALLEL_EXTRACTIONS = 2


def _from_elsewhere(message: HumanMessage) -> bool:
    """A turn's message that is not the user's own words: a scheduled run of a tainted schedule,
    a forwarded or shared message (someone else's words, whoever sent them on)."""
    sources = Provenance.from_json(message.additional_kwargs.get(PROVENANCE_KEY)).sources
    return any(s.kind in NOT_THE_USERS_WORDS for s in sources)


class MemoryNotStarted(RuntimeError):
    """An API call that needs the store came before ``start()`` (or after ``close()``)."""


class MemoryService:
    """One per daemon. ``start()`` before the harness runs turns, ``close()`` after it stops."""

    def __init__(
        self,
        settings: MemorySettings,
        model: BaseChatModel,
        *,
        db_path: Path | None = None,
        db_url: str | None = None,
    ):
        path = db_path or settings.db_path
        if path is None:
            raise ValueError("memory: no db_path (set memory.db_path or pass db_path)")
        self.settings = settings
        self.model = model
        self.db_path = Path(path)
        self.db_url = db_url
        """PostgreSQL (LangGraph's ``AsyncPostgresStore``) instead of the SQLite file."""
        self._close_store: Callable[[], Awaitable[None]] | None = None
        self._sqlite: InlineSqliteStore | None = None
        self._facts: FactStore | None = None
        self._inbox: asyncio.Queue[tuple[str, PendingTurn]] = asyncio.Queue()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._users: dict[str, asyncio.Task[None]] = {}
        self._due: dict[str, float] = {}
        self._first: dict[str, float] = {}
        self._wake: dict[str, asyncio.Event] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._epoch: dict[str, int] = {}
        self._applies: set[asyncio.Future[None]] = set()
        self._gate = asyncio.Semaphore(_MAX_PARALLEL_EXTRACTIONS)
        self.extractions = 0
        """Extraction model calls made (for /status and tests)."""

    # ---- lifecycle -----------------------------------------------------------------------------
    @property
    def active(self) -> bool:
        """Injection and extraction are on (enabled and started)."""
        return self.settings.enabled and self._facts is not None

    async def start(self) -> None:
        """Open the store, resume pending extraction, start pruning (idempotent)."""
        if self._facts is not None:
            return
        if self.db_url:
            from agent.postgres import postgres_store

            pg_store, self._close_store = await postgres_store(self.db_url)
            self._facts = FactStore(pg_store)
        else:
            # langgraph.store.sqlite imports sqlite_vec (and numpy, ~10 MB) for vector indexes,
            # which facts do not use: the daemon defers it (compat/lean_imports.py, DEFERRED).
            from agent.memory.store import InlineSqliteStore

            store = InlineSqliteStore.open(self.db_path)
            self._sqlite, self._facts = store, FactStore(store)
        self._spawn(self._writer())
        if self.settings.retention_days is not None:
            self._spawn(self._pruner())
        if self.settings.enabled:
            for user in await self._facts.users_with_pending():
                log.info("memory: resuming pending extraction for a user")
                self._arm(user, self.settings.debounce_seconds)

    async def close(self) -> None:
        """Persist noted turns, stop timers and running extractions (their pending rows stay for
        the next start), let a write in progress finish, close the store."""
        if self._facts is None:
            return
        await self._inbox.join()
        tasks = [*self._tasks, *self._users.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*self._applies, return_exceptions=True)
        self._users.clear()
        self._due.clear()
        self._first.clear()
        self._facts = None
        if self._sqlite is not None:
            sqlite, self._sqlite = self._sqlite, None
            sqlite.close()
        if self._close_store is not None:
            closer, self._close_store = self._close_store, None
            await closer()

    async def __aenter__(self) -> MemoryService:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, context=contextvars.Context())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _store(self) -> FactStore:
        if self._facts is None:
            raise MemoryNotStarted("MemoryService.start() was not called")
        return self._facts

    def _lock(self, user: str) -> asyncio.Lock:
        return self._locks.setdefault(user, asyncio.Lock())

    # ---- what the agent and the gateway call ---------------------------------------------------
    def build_middleware(self, *, for_subagent: bool = False) -> MemoryMiddleware:
        """The middleware for ``Harness(extra_middleware=[...])``; ``for_subagent=True`` reads
        memory only (sub-agents never write it)."""
        return MemoryMiddleware(self, note_turns=not for_subagent)

    async def section_for(self, user: str, query: str) -> str:
        """The "What you know about this user" section for one model call ("" if nothing)."""
        if not self.active or self.settings.token_budget <= 0:
            return ""
        try:
            async with asyncio.timeout(_READ_TIMEOUT):
                facts = await self._store().facts(user)
        except Exception as exc:  # memory must never break or stall a turn
            log.warning("memory: reading facts failed (%s); answering without them", type(exc).__name__)
            return ""
        return render_section(self._fresh(facts), query, self.settings.token_budget)

    def note_turn(
        self,
        user: str,
        thread_id: str,
        messages: Sequence[BaseMessage],
        *,
        message_id: str = "",
        untrusted: bool = False,
    ) -> None:
        """Queue a finished turn for extraction. Never blocks, never raises into the turn.

        ``untrusted``: the model had read content the user did not write (agent/provenance.py).
        Then only the user's own words are noted: not the answers, which may repeat what that
        content said, and not a scheduled run's text (quoted, perhaps from such content). A fact
        never comes from a web page or a stranger's message posing as the user's."""
        if not self.active or not user:
            return
        limit = self.settings.max_turn_chars
        lines: list[tuple[str, str]] = []
        for message in messages:
            if isinstance(message, HumanMessage):
                if untrusted and _from_elsewhere(message):
                    continue
                role = "user"
            elif untrusted:
                continue
            elif isinstance(message, AIMessage) and not message.tool_calls:
                role = "assistant"
            else:
                continue
            text = (without_context(message.text) if role == "user" else message.text).strip()
            if text:
                lines.append((role, text if len(text) <= limit else text[: limit - 1] + "…"))
        if not any(role == "user" for role, _ in lines):
            return
        message_id = message_id or str(time.time_ns())
        turn = PendingTurn(f"{thread_id}|{message_id}", thread_id, message_id, tuple(lines), now_utc())
        self._inbox.put_nowait((user, turn))

    async def list(self, user: str) -> builtins.list[Fact]:
        """Everything remembered about ``user`` (a ``platform:user_id``), newest first."""
        return self._fresh(await self._store().facts(user))

    async def remember(self, user: str, text: str) -> Fact:
        """Store one fact as given (a "/remember" command, or seeding); no model call."""
        store = self._store()
        text = clean_fact(text)
        if not text:
            raise ValueError("empty fact")
        async with self._lock(user):
            known = await store.facts(user)
            changes = apply_plan(ExtractionPlan(add=[text]), known, now=now_utc(), source="")
            if not changes.put:  # already known
                return next(f for f in known if f.text.casefold() == text.casefold())
            _, over = trim_to_limit([*known, *changes.put], self.settings.max_facts_per_user)
            await store.write(user, put=changes.put, delete=over)
            return changes.put[0]

    async def forget(self, user: str) -> int:
        """Erase all facts and pending extraction of ``user``; returns the number of facts erased.

        An extraction already asking the model for this user is discarded when it comes back.
        """
        store = self._store()
        await self._inbox.join()  # turns noted before the command are erased too
        async with self._lock(user):
            self._epoch[user] = self._epoch.get(user, 0) + 1
            self._due.pop(user, None)
            self._first.pop(user, None)
            task = self._users.pop(user, None)
            if task is not None:
                task.cancel()
            count = await store.erase(user)
        log.info("memory: erased %d facts of a user", count)
        return count

    async def prune(self, *, now: datetime | None = None) -> int:
        """Drop facts not updated within ``retention_days``; returns how many were dropped."""
        days = self.settings.retention_days
        if days is None:
            return 0
        store = self._store()
        cutoff = (now or now_utc()) - timedelta(days=days)
        dropped = 0
        for user in await store.users_with_facts():
            async with self._lock(user):
                old = [f.id for f in await store.facts(user) if f.updated_at < cutoff]
                await store.write(user, delete=old)
            dropped += len(old)
        if dropped:
            log.info("memory: pruned %d facts older than %d days", dropped, days)
        return dropped

    async def pending_count(self, user: str) -> int:
        """Turns of ``user`` persisted and waiting for extraction."""
        return len(await self._store().pending(user))

    def _fresh(self, facts: builtins.list[Fact]) -> builtins.list[Fact]:
        """Facts within retention (prune runs hourly; this hides the expired ones meanwhile)."""
        days = self.settings.retention_days
        if days is None:
            return facts
        cutoff = now_utc() - timedelta(days=days)
        return [f for f in facts if f.updated_at >= cutoff]

    # ---- background work -----------------------------------------------------------------------
    async def _writer(self) -> None:
        """Persist noted turns in order, then arm the user's debounce timer."""
        while True:
            user, turn = await self._inbox.get()
            try:
                async with self._lock(user):
                    await self._store().add_pending(user, turn)
                self._arm(user, self.settings.debounce_seconds)
            except Exception as exc:
                log.warning("memory: could not save a turn for extraction (%s)", type(exc).__name__)
            finally:
                self._inbox.task_done()

    def _arm(self, user: str, delay: float) -> None:
        """(Re)start the user's quiet period; start the user's task if it is not running."""
        now = time.monotonic()
        first = self._first.setdefault(user, now)
        self._due[user] = min(now + delay, first + max(self.settings.max_delay_seconds, delay))
        wake = self._wake.get(user)
        if wake is not None:
            wake.set()
        task = self._users.get(user)
        if task is None or task.done():
            self._users[user] = self._spawn_user(user)

    def _spawn_user(self, user: str) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(self._user_loop(user), context=contextvars.Context())
        task.add_done_callback(lambda t: self._users.pop(user, None) if self._users.get(user) is t else None)
        return task

    async def _user_loop(self, user: str) -> None:
        """Wait out the user's debounce, extract, repeat while new turns came in meanwhile."""
        attempt = 0
        wake = self._wake.setdefault(user, asyncio.Event())
        while True:
            due = self._due.get(user)
            if due is None:
                return
            delay = due - time.monotonic()
            if delay > 0:
                wake.clear()
                with suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await wake.wait()
                continue
            self._due.pop(user, None)
            self._first.pop(user, None)
            try:
                attempt = await self._extract(user, attempt)
            except Exception as exc:  # the store failed: the turns stay pending for the next try
                log.error("memory: extraction stopped (%s)", type(exc).__name__, exc_info=exc)
                return

    async def _extract(self, user: str, attempt: int) -> int:
        """One extraction over all pending turns of ``user``; returns the retry attempt count."""
        store = self._store()
        epoch = self._epoch.get(user, 0)
        turns = await store.pending(user)
        if not turns:
            return 0
        if len(turns) > self.settings.max_turns_per_extraction:
            turns = turns[: self.settings.max_turns_per_extraction]
            self._due.setdefault(user, time.monotonic())  # the rest right after this batch
        known = await store.facts(user)
        try:
            async with self._gate:
                plan = await self._ask(known, turns, user)
        except Exception as exc:
            retry = is_retryable(exc) and attempt < self.settings.extraction_retries
            log.warning(
                "memory: extraction failed (%s %s)%s",
                type(exc).__name__,
                getattr(exc, "status_code", ""),
                "; will retry" if retry else f"; {len(turns)} turns dropped",
            )
            if retry:
                backoff = max(self.settings.debounce_seconds, 0.1) * 2 ** (attempt + 1)
                self._due[user] = time.monotonic() + backoff
                return attempt + 1
            plan = None
        # Shielded: close() and forget() wait for a started write instead of cutting it.
        apply = asyncio.ensure_future(self._apply(user, epoch, plan, known, turns))
        self._applies.add(apply)
        apply.add_done_callback(self._applies.discard)
        await asyncio.shield(apply)
        return 0

    async def _ask(
        self, known: builtins.list[Fact], turns: builtins.list[PendingTurn], user: str = ""
    ) -> Any:
        """One non-streaming extraction call; None when the answer is not a usable plan. The
        metadata names whose turns these are, for token usage (agent/usage.py)."""
        last = turns[-1] if turns else None
        who = {"user_id": user, "thread_id": last.thread_id, "message_id": last.message_id} if last else {}
        self.extractions += 1
        async with asyncio.timeout(self.settings.extraction_timeout):
            reply = await self.model.ainvoke(
                build_messages(known, turns),
                config={"run_name": "memory_extraction", "tags": ["chital:memory"], "metadata": who},
                stream=False,
            )
        try:
            return parse_plan(reply.text)
        except BadExtraction as exc:
            # Not the answer text: it may quote what the user said.
            log.warning("memory: extraction answer skipped: %s (%d chars)", exc, len(reply.text))
            return None

    async def _apply(
        self,
        user: str,
        epoch: int,
        plan: ExtractionPlan | None,
        known: builtins.list[Fact],
        turns: builtins.list[PendingTurn],
    ) -> None:
        """Write the plan's facts and drop the turns it came from, in one transaction."""
        store = self._store()
        async with self._lock(user):
            if self._epoch.get(user, 0) != epoch:
                return  # the user asked to forget while the model was thinking
            current = await store.facts(user)
            if {f.id for f in current} != {f.id for f in known}:
                known = current  # pruned meanwhile: ids the plan names may be gone
            put: builtins.list[Fact] = []
            delete: builtins.list[str] = []
            if plan is not None:
                changes = apply_plan(plan, known, now=now_utc(), source=turns[-1].thread_id)
                merged = {f.id: f for f in known if f.id not in set(changes.delete)}
                merged.update({f.id: f for f in changes.put})
                kept, over = trim_to_limit(list(merged.values()), self.settings.max_facts_per_user)
                kept_ids, known_ids = {f.id for f in kept}, {f.id for f in known}
                put = [f for f in changes.put if f.id in kept_ids]
                delete = [*changes.delete, *(i for i in over if i in known_ids)]
                log.info(
                    "memory: %d turns -> %d facts written, %d deleted", len(turns), len(put), len(delete)
                )
            await store.write(user, put=put, delete=delete, done_pending=[t.key for t in turns])

    async def _pruner(self) -> None:
        while True:
            try:
                await self.prune()
            except Exception as exc:
                log.warning("memory: prune failed (%s)", type(exc).__name__)
            await asyncio.sleep(_PRUNE_EVERY)
