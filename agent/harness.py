"""The agent core: one LangChain ``create_agent`` graph, checkpointed in SQLite, run turn by turn.

``Harness.run`` turns a LangGraph run into Chital's ``AgentEvent`` stream (the part-by-part
translation is agent/stream_events.py). What it adds on top of the library:

- **Exactly-once turns.** The HumanMessage of a turn carries the chat message id. Before running,
  the thread's checkpoint says whether that message was already answered (replay the answer, no
  model call), was interrupted mid-turn (continue from the checkpoint, input ``None``), or is new.
- **Durability ``"sync"``.** Each super-step's checkpoint is committed before the next step starts,
  so a daemon killed mid-turn resumes right after the last finished step and a finished tool is
  not run again. ``"async"`` overlaps that write with the next step (a crash can lose the last
  step and repeat a tool's side effects); ``"exit"`` writes once per turn (a crash loses the whole
  turn, so a long tool-using turn would start over, and "continue from the checkpoint" could never
  happen). Measured with an instant model, the three differ by about 1 ms CPU per turn (within
  noise of ~13 ms), so the safe one wins. SQLite runs in WAL mode with synchronous=NORMAL: no fsync
  per commit, still safe against a process crash (not against power loss of the last commits).
- **Clear failures.** Model errors are retried by ``RetryModelCalls``; what is left becomes a
  ``TurnFailed`` with a message fit for the chat (no provider text, no secrets).
- **Stop.** Cancelling the task that consumes ``run`` stops the model call; the next turn first
  answers any tool call the stopped turn left dangling, so the history stays valid for the model.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, aclosing
from pathlib import Path
from typing import Any

from deepagents import DeepAgentState
from langchain.agents import create_agent
from langchain.agents.middleware.types import AgentMiddleware
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command

from agent import tuning
from agent.approvals import resume_value
from agent.checkpoints import InlineSqliteSaver
from agent.compaction import Pruner
from agent.config import AgentSettings, ModelSpec
from agent.context import own_summarization
from agent.events import (
    AgentEvent,
    ApprovalDecision,
    ApprovalRequested,
    Final,
    PlanItem,
    TurnFailed,
)
from agent.failures import turn_failure
from agent.history import earlier_answer, messages_of, starts_turn, tool_patches, with_files
from agent.merge import merge_model_calls
from agent.middleware import RetryModelCalls, StepBudget
from agent.model import build_chat_model, model_display_name
from agent.plan import plan_of
from agent.provenance import PROVENANCE_KEY, Provenance, Source, of_context
from agent.safety import Redactor
from agent.settled import SettledThreads
from agent.steering import Inbox, SteerInbox, Taken, receiving, turn_start
from agent.stream_events import CustomEventConverter, stream_events
from agent.thread_context import with_context
from agent.turn import PLAIN, ContextMessage, ImagePart, TurnOptions
from agent.turn_overrides import TurnChoice, TurnOverrides, choose, skill_section
from agent.usage import UsageSink, attach_usage
from agent.vision import IMAGES_KEY, carries_images, faded, human_content, image_index

TurnScope = Callable[[str], AbstractAsyncContextManager[Any]]
"""Entered around each turn of a thread (e.g. acquire and bind the thread's sandbox)."""
SkillText = Callable[[str], str | None]
"""The instructions of a skill by name (None when there is no such skill)."""

log = logging.getLogger(__name__)

_SETTLED_CACHE = 4096


class HarnessNotStarted(RuntimeError):
    """``run`` was called before ``start()`` (or after ``close()``)."""


class Harness:
    """The lead agent of every chat thread; one instance serves all threads of the daemon.

    The compiled graph and the model client are built once in ``start()`` and reused by every
    turn: per-turn work is the graph run itself, plus one checkpoint read on the first turn this
    process runs on a thread (to tell a crash-resume from a new message).
    """

    def __init__(
        self,
        settings: AgentSettings,
        model: ModelSpec,
        checkpoint_path: Path,
        *,
        extra_tools: Sequence[BaseTool | Callable[..., Any]] = (),
        extra_middleware: Sequence[AgentMiddleware[Any, Any, Any]] = (),
        turn_scope: TurnScope | None = None,
        custom_events: Sequence[CustomEventConverter] = (),
        redact: Callable[[str], str] | None = None,
        models: Sequence[ModelSpec] = (),
        usage: UsageSink | None = None,
        persona_base: str | None = None,
        skill_text: SkillText | None = None,
        checkpoint_url: str | None = None,
    ) -> None:
        """``models``: every configured model a turn may choose (``TurnOptions.model``), built on
        first use; ``usage`` counts each model call; ``persona_base``: the part of the system
        prompt a persona replaces (default: all of ``settings.system_prompt``)."""
        self.settings = settings
        self.spec = model
        self.checkpoint_path = Path(checkpoint_path)
        self.checkpoint_url = checkpoint_url
        """PostgreSQL instead of the SQLite file (several daemons share the threads)."""
        self._close_saver: Callable[[], Awaitable[None]] | None = None
        self.tools: list[BaseTool | Callable[..., Any]] = list(extra_tools)
        self.extra_middleware = list(extra_middleware)
        self._turn_scope = self._scope = turn_scope
        self._custom_events = list(custom_events)
        self._redact = redact or Redactor()
        """Masks secrets in the arguments an approval request shows (agent/approvals.py)."""
        self._model = attach_usage(build_chat_model(model, settings), model.name, usage)
        self._specs = {spec.name: spec for spec in models}
        self._chat_models = {model.name: self._model}
        self._usage = usage
        self._persona_base = settings.system_prompt if persona_base is None else persona_base
        self._skill_text = skill_text
        self._choices: dict[str, TurnChoice | None] = {}
        """The last turn's choice per thread, for a turn resumed after an approval."""
        self._saver: Any = None
        self._graph: CompiledStateGraph[Any, Any, Any, Any] | None = None
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        # What lets a turn skip its state read (agent/settled.py; shared checkpoints: _unchanged too).
        self._known = SettledThreads()
        self._unchanged: Callable[[str], Awaitable[bool]] | None = None
        self._pruner: Pruner | None = None

    @property
    def model_name(self) -> str:
        return model_display_name(self.spec, self._model)

    def middleware(self) -> list[AgentMiddleware[Any, Any, Any]]:
        """The middleware stack, outermost first. Sandbox tools, sub-agents, skills, memory and
        summarization (issue 4) go here; keep them ``wrap_*`` hooks where possible, as every
        before/after hook is one more graph node per turn."""
        return [
            TurnOverrides(self._persona_base),
            StepBudget(self.settings.max_steps),
            SteerInbox(),  # before the others: they see the steered messages as the model will
            *self.extra_middleware,
            # Summaries of older turns unless the caller's middleware has its own (agent/context.py).
            *own_summarization(self.settings.context, self._model, self.extra_middleware),
            RetryModelCalls(
                max_retries=self.settings.model_retries, initial_delay=self.settings.retry_backoff
            ),
        ]

    def _takes_images(self, name: str | None) -> bool:
        """Whether the turn's model (``name``, None: the default) is marked ``vision: true``."""
        spec = self._specs.get(name) if name else None
        return (spec or self.spec).vision

    def chat_model(self, name: str) -> BaseChatModel:
        """The configured model ``name``, built once (raises ValueError naming what is wrong)."""
        model = self._chat_models.get(name)
        if model is None:
            spec = self._specs.get(name)
            if spec is None:
                raise ValueError(f"no model named {name!r} in the config")
            model = attach_usage(build_chat_model(spec, self.settings), name, self._usage)
            self._chat_models[name] = model
        return model

    def _choice(self, options: TurnOptions) -> TurnChoice | None:
        """The turn's model, persona and skill as :class:`TurnOverrides` applies them."""
        model = self.chat_model(options.model) if options.model and options.model != self.spec.name else None
        skill = None
        if options.skill:
            text = self._skill_text(options.skill) if self._skill_text is not None else None
            if text is None:
                log.warning("turn asked for skill %r, which is not offered; ignored", options.skill)
            else:
                skill = skill_section(options.skill, text)
        if model is None and not options.system_prompt and skill is None:
            return None
        return TurnChoice(model=model, persona=options.system_prompt or None, skill=skill)

    async def start(self) -> None:
        """Open the checkpoint database and compile the agent graph (once)."""
        if self._graph is not None:
            return
        tuning.apply()
        saver: Any
        if self.checkpoint_url:
            from agent.postgres import postgres_checkpointer

            saver, self._close_saver = await postgres_checkpointer(self.checkpoint_url)
            self._unchanged = saver.unchanged_since_own  # agent/postgres_saver.py
            self._scope = saver.scoped(self._turn_scope)  # a turn holds some checkpoint writes
        else:
            saver = InlineSqliteSaver.open(self.checkpoint_path)
        self._saver = saver
        self._graph = create_agent(
            self._model,
            self.tools,
            system_prompt=self.settings.system_prompt,
            # Adjacent wrap_model_call-only middleware run as one layer (agent/merge.py).
            middleware=merge_model_calls(self.middleware()),
            # deepagents' state: messages live in a DeltaChannel, so a checkpoint stores the new
            # messages of a step instead of the whole history (and issue 4's deep agent reads the
            # same threads).
            state_schema=DeepAgentState,
            checkpointer=saver,
        )
        self._pruner = Pruner(saver, self._graph, postgres=bool(self.checkpoint_url))

    async def close(self) -> None:
        self._graph = None
        if self._saver is not None:
            saver, self._saver = self._saver, None
            if self._close_saver is not None:
                closer, self._close_saver = self._close_saver, None
                await closer()
            else:
                saver.close()

    async def __aenter__(self) -> Harness:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def require_graph(self) -> CompiledStateGraph[Any, Any, Any, Any]:
        if self._graph is None:
            raise HarnessNotStarted("Harness.start() was not called")
        return self._graph

    def _config(self, thread_id: str, **metadata: str) -> RunnableConfig:
        limit = 2 * self.settings.max_steps + 5  # a model call and its tool step: two super-steps
        return {"configurable": {"thread_id": thread_id}, "recursion_limit": limit, "metadata": metadata}

    async def message_count(self, thread_id: str) -> int:
        """Messages in the thread's history (for /status)."""
        snap = await self.require_graph().aget_state(self._config(thread_id))
        return len(snap.values.get("messages", ()))

    async def plan(self, thread_id: str) -> tuple[PlanItem, ...]:
        """The thread's current plan (``write_todos``, agent/plan.py) from its checkpoint, for
        ``/plan`` and for closing a resumed turn's checklist; empty when none was written."""
        snap = await self.require_graph().aget_state(self._config(thread_id))
        return plan_of(snap.values)

    async def run(
        self,
        thread_id: str,
        *,
        user_id: str,
        message_id: str,
        text: str,
        files: Sequence[str] = (),
        options: TurnOptions = PLAIN,
    ) -> AsyncIterator[AgentEvent]:
        """Answer one chat message: TextDelta/ToolProgress/StatusUpdate events, then exactly one
        ``Final`` or ``TurnFailed``.

        Safe to call again with the same ``message_id`` after a crash (see the module docstring).
        Turns of one thread are serialised. Consume it with ``contextlib.aclosing`` so that a
        consumer that stops early releases the thread at once rather than at garbage collection.
        """
        graph = self.require_graph()
        config = self._config(thread_id, user_id=user_id, message_id=message_id)
        try:
            choice = self._choice(options)
        except ValueError as exc:  # a model of the config that cannot be built
            log.error("thread %s: %s", thread_id, exc)
            yield TurnFailed(f"The model {options.model!r} cannot be used; ask the admin ({exc}).")
            return
        if len(self._choices) >= _SETTLED_CACHE:
            self._choices.pop(next(iter(self._choices)))
        self._choices[thread_id] = choice

        async def prepare() -> dict[str, Any] | Command[Any] | Final | None:
            return await self._prepare(
                graph, config, thread_id, message_id, text, files, user_id, options.context, options.images,
                self._takes_images(options.model), options.provenance,
            )  # fmt: skip

        drive = self._drive(graph, config, thread_id, message_id, prepare, choice, options.inbox)
        async with aclosing(drive) as events:
            async for event in events:
                yield event

    async def resume(
        self,
        thread_id: str,
        *,
        user_id: str,
        message_id: str,
        approval_id: str,
        decision: ApprovalDecision,
    ) -> AsyncIterator[AgentEvent]:
        """Continue the turn of ``message_id`` that paused on approval ``approval_id`` with a
        person's ``decision``; the same events as :meth:`run`.

        Safe to call again (a crash after the decision, a redelivered click): when the thread no
        longer waits on that approval, the turn is continued or its answer replayed as by ``run``."""
        graph = self.require_graph()
        config = self._config(thread_id, user_id=user_id, message_id=message_id)

        async def prepare() -> dict[str, Any] | Command[Any] | Final | None:
            snap = await graph.aget_state(config)
            self._read(thread_id, snap.values.get("messages", ()))
            if any(i.id == approval_id for i in snap.interrupts):
                return Command(resume={approval_id: resume_value(decision)})
            log.info("thread %s: approval %s is no longer pending; continuing", thread_id, approval_id)
            self._known.forget(thread_id)  # the message is in the thread: only the read says how
            return await self._prepare(graph, config, thread_id, message_id, "", (), user_id)

        async with aclosing(
            self._drive(graph, config, thread_id, message_id, prepare, self._choices.get(thread_id))
        ) as events:
            async for event in events:
                yield event

    async def _drive(
        self,
        graph: CompiledStateGraph[Any, Any, Any, Any],
        config: RunnableConfig,
        thread_id: str,
        message_id: str,
        prepare: Callable[[], Awaitable[dict[str, Any] | Command[Any] | Final | None]],
        choice: TurnChoice | None = None,
        inbox: Inbox | None = None,
    ) -> AsyncGenerator[AgentEvent, None]:
        """One turn on the thread's lock: the input ``prepare`` decides, the stream, then one Final
        or TurnFailed (or none when the turn paused on approval requests)."""
        lock = self._locks.get(thread_id)
        if lock is None:
            lock = self._locks[thread_id] = asyncio.Lock()
        steered = Taken(inbox)  # the messages steered into the turn
        async with lock:
            begun = self._known.begin(thread_id)
            try:
                inp = await prepare()
                if isinstance(inp, Final):  # a replay: the message is in the thread
                    self._known.answered(thread_id, (message_id,))
                    yield inp
                    return
                final: str | None = None
                paused = False
                async with AsyncExitStack() as scope:
                    scope.enter_context(choose(choice))
                    scope.enter_context(receiving(steered if inbox is not None else None))
                    if self._scope is not None:
                        await scope.enter_async_context(self._scope(thread_id))
                    events = stream_events(
                        graph, inp, config, redact=self._redact, custom_events=self._custom_events,
                        model_retries=self.settings.model_retries,
                    )  # fmt: skip
                    async with aclosing(events):
                        async for event in events:
                            if isinstance(event, Final):
                                final = event.text
                            else:
                                paused = paused or isinstance(event, ApprovalRequested)
                                yield event
                if paused:  # the turn waits for a person; resume() continues it
                    self._known.forget(thread_id, (message_id, *steered.ids))
                    return
                if final is None:
                    final = await self._final_from_state(graph, config)
            except Exception as exc:
                self._known.forget(thread_id, (message_id, *steered.ids))
                yield turn_failure(exc)
                return
            except BaseException:  # cancelled (/stop) or closed early: the history may dangle
                self._known.forget(thread_id, (message_id, *steered.ids))
                raise
            self._known.finished(thread_id, message_id, steered.ids, begun)
            if self._pruner is not None:
                await self._pruner.after_turn(thread_id)
            yield Final(final, fresh=starts_turn(inp, message_id))

    # ---- turn preparation ----------------------------------------------------------------------
    async def _prepare(
        self,
        graph: CompiledStateGraph[Any, Any, Any, Any],
        config: RunnableConfig,
        thread_id: str,
        message_id: str,
        text: str,
        files: Sequence[str],
        user_id: str,
        context: Sequence[ContextMessage] = (),
        images: Sequence[ImagePart] = (),
        takes_images: bool = True,
        provenance: Sequence[Source] = (),
    ) -> dict[str, Any] | Final | None:
        """Decide between replaying the answer (Final), continuing (None) and a new turn (input).
        The thread's earlier messages (``context``) go into the new turn's HumanMessage as a quoted
        block (agent/thread_context.py), so the checkpoint keeps them with the turn; so do the
        untrusted sources it carries (``provenance`` and the context's authors, agent/provenance.py)."""
        sources = Provenance(tuple(provenance)).merged(of_context(context)).to_json()
        human = HumanMessage(
            content=human_content(with_files(with_context(text, context), files), images),
            id=message_id,
            additional_kwargs={
                "user_id": user_id,
                **({IMAGES_KEY: image_index(images)} if images else {}),
                **({PROVENANCE_KEY: sources} if sources else {}),
            },
        )
        if images:  # its history holds images until they fade (agent/vision.py)
            self._known.pictured(thread_id, True)
        if self._known.is_new(thread_id, message_id) and (
            self._unchanged is None or await self._unchanged(thread_id)
        ):
            return {"messages": [human]}
        snap = await graph.aget_state(config)
        messages: list[AnyMessage] = list(snap.values.get("messages", ()))
        self._read(thread_id, messages)
        earlier = earlier_answer(messages, message_id)
        if earlier is not None:
            log.info("thread %s: message %s was answered before later ones; replaying", thread_id, message_id)
            return earlier
        # The message that started the latest turn; messages steered into it (agent/steering.py) are
        # part of it, so a turn killed after taking one continues instead of counting as answered.
        last_human = next((m for m in reversed(messages) if turn_start(m)), None)
        # Messages a step stored as writes but whose checkpoint was not stored (a full disk): the
        # state shows them, a run with new input drops them, a run with no input applies them.
        pending = {m.id for task in snap.tasks if task.result for m in messages_of(task.result)}
        if last_human is not None and last_human.id == message_id:
            if pending and not snap.next:
                log.info("thread %s: finishing the stored step of message %s", thread_id, message_id)
                return None
            last = messages[-1]
            if (
                not snap.next
                and isinstance(last, AIMessage)
                and not last.tool_calls
                and last is not last_human
            ):
                log.info(
                    "thread %s: message %s already answered; replaying the answer", thread_id, message_id
                )
                return Final(last.text)
            log.info("thread %s: continuing the interrupted turn of message %s", thread_id, message_id)
            if not snap.next:
                # Nothing scheduled (an unusual stop): run the agent again from its start, with
                # the message already in place and any dangling tool call answered.
                return {"messages": tool_patches(messages)}
            return None
        if pending:  # the messages as of the step's start: what a run with new input builds on
            messages = list((await graph.aget_state(snap.config)).values.get("messages", ()))
        patches = tool_patches(messages)
        if patches:
            log.info("thread %s: closing %d tool call(s) left by a stopped turn", thread_id, len(patches))
        # Images shown long enough fade; all of them when this turn's model takes none (a /model
        # switch to a text-only model must not send it the pictures of earlier turns).
        old = faded(messages, self.settings.vision.keep_turns if takes_images else 0)
        gone = {m.id for m in old}
        # Marked either way: a turn another daemon ran may have brought the images.
        self._known.pictured(
            thread_id, bool(images) or any(carries_images(m) for m in messages if m.id not in gone)
        )
        return {"messages": [*patches, *old, human]}

    def _read(self, thread_id: str, messages: Sequence[AnyMessage]) -> None:
        """What any read tells agent/settled.py: people's messages in it, and images (whoever sent them)."""
        people = [m.id for m in messages if isinstance(m, HumanMessage) and m.id]
        self._known.seen(thread_id, people, any(carries_images(m) for m in messages))

    async def prune(self, thread_id: str) -> int:
        """Delete the thread's checkpoints that its latest one does not need (agent/compaction.py);
        the number deleted. Call it between turns of the thread (``run`` does, every few turns)."""
        if self._pruner is None:
            raise HarnessNotStarted("Harness.start() was not called")
        return await self._pruner.prune(thread_id)

    async def _final_from_state(
        self, graph: CompiledStateGraph[Any, Any, Any, Any], config: RunnableConfig
    ) -> str:
        """The answer when the stream did not show it (e.g. a middleware ended the turn)."""
        snap = await graph.aget_state(config)
        for message in reversed(snap.values.get("messages", ())):
            if isinstance(message, HumanMessage):
                break
            if isinstance(message, AIMessage) and not message.tool_calls:
                return message.text
        raise RuntimeError("the agent finished without an answer")
