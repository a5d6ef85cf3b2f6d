"""Context engineering and safety middleware of the lead agent.

``build_context_middleware`` returns the stack the harness takes as ``extra_middleware``. Almost
everything is a ``wrap_model_call`` / ``wrap_tool_call`` hook, so the stack adds no graph node
(each node is one more super-step and checkpoint write per model call):

==========================  ==================================================================
ClarificationMiddleware     ends the turn after ``ask_clarification`` (agent/tools/clarify.py)
TitleMiddleware             names the thread once, in parallel with its first model call
LoopGuard                   same tool + same args N times in a turn: warn, then force an answer
summarization               deepagents' SummarizationMiddleware (history kept in state)
PatchDanglingToolCalls      unanswered tool calls get "cancelled" results in the request
GuardrailMiddleware         async vetoes of tool calls, fail-closed (agent/safety.py)
ToolErrors                  LangChain's ToolErrorMiddleware, short secret-free texts (safety.py)
==========================  ==================================================================

Order matters: summarization must see ``request.messages`` exactly as the state holds them
(its cutoff is a state index), so only middleware that leaves the messages alone may sit
outside it; PatchDanglingToolCalls sits inside it, next to the model.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, NotRequired

from langchain.agents.middleware.types import (
    AgentMiddleware,
    AgentState,
    ExtendedModelResponse,
    ModelRequest,
    ModelResponse,
)
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.runnables import RunnableLambda
from langgraph.config import get_config
from langgraph.constants import TAG_NOSTREAM
from langgraph.types import Command

from agent.compaction import bounded_history_backend, drop_summarised
from agent.model import unstreamed
from agent.safety import (  # noqa: F401 - re-exported for callers of the stack
    Allow,
    Deny,
    Guardrail,
    GuardrailContext,
    GuardrailMiddleware,
    Redactor,
    ToolErrors,
)
from agent.settings import ContextSettings
from agent.thread_context import without_context
from agent.tool_output import ToolOutputCap
from agent.tools.clarify import ClarificationMiddleware
from compat import deepagents as deepagents_compat

log = logging.getLogger(__name__)


# ---- dangling tool calls ------------------------------------------------------------------------
def patch_dangling(messages: Sequence[AnyMessage]) -> list[AnyMessage] | None:
    """Messages with a "cancelled" error result after every unanswered tool call, or None when
    nothing dangles. Results go right after the call's other results, where providers want them."""
    answered = {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
    if not any(
        c.get("id") and c["id"] not in answered
        for m in messages
        if isinstance(m, AIMessage)
        for c in (*m.tool_calls, *m.invalid_tool_calls)
    ):
        return None
    out: list[AnyMessage] = []
    pending: list[dict[str, Any]] = []
    for message in [*messages, None]:
        if pending and not isinstance(message, ToolMessage):
            out.extend(
                ToolMessage(
                    content=f"Tool call {c.get('name') or 'unknown'} was cancelled; it returned no result.",
                    name=c.get("name") or "unknown",
                    tool_call_id=c["id"],
                    status="error",
                )
                for c in pending
            )
            pending = []
        if message is None:
            break
        out.append(message)
        if isinstance(message, AIMessage):
            calls = (*message.tool_calls, *message.invalid_tool_calls)
            pending = [dict(c) for c in calls if c.get("id") and c["id"] not in answered]
    return out


class PatchDanglingToolCalls(AgentMiddleware[Any, Any, Any]):
    """Answer tool calls that never got a result, in the model request only.

    Why not deepagents' PatchToolCallsMiddleware: it is a ``before_agent`` node that rewrites the
    whole message history in state (``RemoveMessage(REMOVE_ALL_MESSAGES)``), which defeats the
    DeltaChannel the harness keeps messages in, and it runs only at the start of a run. This
    patches every model request (a scan per call, no state write, no node).
    """

    def wrap_model_call(
        self, request: ModelRequest[Any], handler: Callable[[ModelRequest[Any]], ModelResponse[Any]]
    ) -> ModelResponse[Any]:
        patched = patch_dangling(request.messages)
        return handler(request if patched is None else request.override(messages=patched))

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any]:
        patched = patch_dangling(request.messages)
        return await handler(request if patched is None else request.override(messages=patched))


# ---- loop detection -----------------------------------------------------------------------------
def _is_turn_start(message: AnyMessage) -> bool:
    return isinstance(message, HumanMessage) and message.additional_kwargs.get("lc_source") != "summarization"


def repeated_calls(messages: Sequence[AnyMessage]) -> tuple[str, int]:
    """(tool name, count) of the most repeated identical call (same name, same args) this turn."""
    counts: Counter[tuple[str, str]] = Counter()
    for message in reversed(messages):
        if _is_turn_start(message):
            break
        if isinstance(message, AIMessage):
            for call in message.tool_calls:
                args = json.dumps(call.get("args"), sort_keys=True, default=str)
                counts[(call["name"], args)] += 1
    if not counts:
        return "", 0
    (name, _), count = counts.most_common(1)[0]
    return name, count


class LoopGuard(AgentMiddleware[Any, Any, Any]):
    """Stop a model that keeps making the same tool call.

    Why our own: LangChain's ToolCallLimitMiddleware counts calls per tool name (whatever the
    arguments) and stops with a canned message; a loop is the *same* call again, and the user is
    better served by a real answer from what was gathered. From ``warn_after`` repeats the model
    gets a note; from ``stop_after`` it must answer (``tool_choice="none"``), and any tool call
    it still returns is dropped so the turn ends.
    """

    def __init__(self, warn_after: int, stop_after: int) -> None:
        super().__init__()
        self.warn_after = warn_after
        self.stop_after = stop_after

    def _prepare(self, request: ModelRequest[Any]) -> tuple[ModelRequest[Any], str | None]:
        name, count = repeated_calls(request.messages)
        if count < self.warn_after:
            return request, None
        forced = count >= self.stop_after
        if forced:
            note = (
                f"You have called {name} with the same arguments {count} times in this turn. Stop "
                "calling tools: answer the user now with what you have, and say what did not work."
            )
            log.info("loop guard: %s repeated %d times; forcing an answer", name, count)
        else:
            note = (
                f"Note: you have called {name} with the same arguments {count} times in this turn. "
                "Repeating it will not give a different result: use what you have, try something "
                "different, or answer the user."
            )
        base = request.system_message.text if request.system_message is not None else ""
        system = SystemMessage(f"{base}\n\n{note}" if base else note)
        if forced:
            return request.override(system_message=system, tool_choice="none"), name
        return request.override(system_message=system), None

    @staticmethod
    def _drop_tool_calls(response: ModelResponse[Any], name: str) -> ModelResponse[Any]:
        result = []
        for message in response.result:
            if isinstance(message, AIMessage) and message.tool_calls:
                text = message.text or (
                    f"I stopped because I kept repeating the same step ({name}) without getting "
                    "anywhere. Could you give me more details or another way to approach it?"
                )
                message = AIMessage(content=text, id=message.id, response_metadata=message.response_metadata)
            result.append(message)
        return dataclasses.replace(response, result=result)

    def wrap_model_call(
        self, request: ModelRequest[Any], handler: Callable[[ModelRequest[Any]], ModelResponse[Any]]
    ) -> ModelResponse[Any]:
        request, forced = self._prepare(request)
        response = handler(request)
        return self._drop_tool_calls(response, forced) if forced else response

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any]:
        request, forced = self._prepare(request)
        response = await handler(request)
        return self._drop_tool_calls(response, forced) if forced else response


# ---- thread title -------------------------------------------------------------------------------
TITLE_PROMPT = (
    "Write a title of at most six words for a chat that starts with the message below. "
    "Answer with the title only, no quotes, no final period, in the message's language.\n\n"
    "<message>\n{message}\n</message>"
)
TitleCallback = Callable[[str, str], Awaitable[None]]
"""``on_title(thread_id, title)``, awaited once when a thread gets its title."""


class TitleState(AgentState[Any]):
    title: NotRequired[str]


def thread_title(values: Mapping[str, Any]) -> str | None:
    """The title in a thread's state values (``(await graph.aget_state(config)).values``)."""
    title = values.get("title")
    return title if isinstance(title, str) and title else None


def _cut(text: str, limit: int) -> str:
    text = " ".join(text.split()).strip(" \"'“”`#*.")
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


class TitleMiddleware(AgentMiddleware[Any, Any, Any]):
    """Give a thread a short title (state key ``title``) on its first model call.

    The title call runs concurrently with that model call and is awaited after it, so it adds
    no latency in the usual case; it is hidden from the answer stream (``nostream``). On failure
    or timeout the first message, cut short, is the title: every thread gets one, once.
    """

    state_schema = TitleState

    def __init__(
        self,
        model: BaseChatModel | None,
        *,
        max_chars: int,
        timeout: float,
        on_title: TitleCallback | None = None,
    ) -> None:
        super().__init__()
        self._model = (
            unstreamed(model).with_config(tags=[TAG_NOSTREAM], run_name="chital_title") if model else None
        )
        self.max_chars = max_chars
        self.timeout = timeout
        self.on_title = on_title

    async def make_title(self, first: str) -> str:
        fallback = _cut(first, self.max_chars) or "New chat"
        if self._model is None:
            return fallback
        try:
            async with asyncio.timeout(self.timeout):
                reply = await self._model.ainvoke(TITLE_PROMPT.format(message=first[:2000]))
        except Exception as exc:
            log.info("title call failed (%s); using the first message", type(exc).__name__)
            return fallback
        return _cut(reply.text.splitlines()[0] if reply.text.strip() else "", self.max_chars) or fallback

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any] | ExtendedModelResponse[Any]:
        if thread_title(request.state):
            return await handler(request)
        first = next((m.text for m in request.state.get("messages", ()) if _is_turn_start(m)), "")
        first = without_context(first)  # the user's words, not the thread quoted before them
        task = asyncio.ensure_future(self.make_title(first))
        try:
            response = await handler(request)
        except BaseException:
            task.cancel()
            raise
        title = await task
        if self.on_title is not None:
            try:
                thread_id = str((get_config().get("configurable") or {}).get("thread_id", ""))
                await self.on_title(thread_id, title)
            except Exception as exc:
                log.warning("on_title callback failed: %s", type(exc).__name__)
        return ExtendedModelResponse(model_response=response, command=Command(update={"title": title}))


# ---- summarization ------------------------------------------------------------------------------
class _SummaryFailed(Exception):
    pass


def build_summarization(
    settings: ContextSettings, model: BaseChatModel, backend: Any = None
) -> AgentMiddleware[Any, Any, Any]:
    """deepagents' SummarizationMiddleware, with the summary call hidden from the answer stream.

    Why deepagents' and not LangChain's: LangChain's is a ``before_model`` node that rewrites
    the whole history (``RemoveMessage(REMOVE_ALL_MESSAGES)``); deepagents' runs inside the model
    call, keeps the raw history in state and records the cut in ``_summarization_event`` (compat), and
    recovers from a provider's context-overflow error by summarizing.

    What we add: the summary call is tagged ``nostream`` (otherwise its tokens would stream as
    the answer, since it runs in the model node), and a failed summary call does not fail the
    turn: the model is called with the unsummarized history instead.
    ``backend`` receives the evicted history (``/conversation_history/<session>.md``); default:
    deepagents' StateBackend (the thread's own checkpoint, state key ``files``).
    """
    from deepagents.middleware.filesystem import FilesystemState
    from deepagents.middleware.summarization import (
        DEEPAGENTS_DEFAULT_SUMMARY_PROMPT,
        SummarizationMiddleware,
        SummarizationState,
    )
    from langchain_core.messages import get_buffer_string

    def prompt(messages: list[AnyMessage]) -> str:
        return DEEPAGENTS_DEFAULT_SUMMARY_PROMPT.format(
            messages=get_buffer_string(messages, format="xml")
        ).rstrip()

    chain = (
        RunnableLambda(prompt, name="chital_summary_prompt")
        | unstreamed(model).with_config(tags=[TAG_NOSTREAM], run_name="chital_summary")
        | StrOutputParser()
    ).with_retry(retry_if_exception_type=(Exception,), stop_after_attempt=2)

    async def summarize(messages: list[AnyMessage]) -> str:
        try:
            return await chain.ainvoke(messages)
        except Exception as exc:
            raise _SummaryFailed(type(exc).__name__) from exc

    class _State(SummarizationState, FilesystemState):
        pass

    class ChitalSummarization(SummarizationMiddleware):
        state_schema = _State
        summarizes = True  # the harness adds none of its own (agent/harness.py)

        async def awrap_model_call(self, request: ModelRequest[Any], handler: Any) -> Any:
            # deepagents counts tokens (tool schemas included) on every model call; a history far
            # below both triggers needs none of that work. Never summarised: the model sees the
            # messages as they are; summarised: the summary and the messages since, which is what
            # deepagents hands the model when it does not summarise (and truncates no arguments:
            # Chital configures no truncation).
            if not deepagents_compat.maybe_summarised(request.state):
                if len(request.messages) < by_count and _clearly_short(request.messages, by_tokens):
                    return await handler(request)
            else:
                effective = deepagents_compat.effective_messages(self, request)
                if (
                    effective is not None
                    and len(effective) < by_count
                    and _clearly_short(effective, by_tokens)
                ):
                    return await handler(request.override(messages=effective))
            try:
                response = await super().awrap_model_call(request, handler)
            except _SummaryFailed as exc:
                messages = deepagents_compat.effective_messages(self, request)
                if messages is None:
                    raise
                log.warning("summary call failed (%s); calling the model with the full history", exc)
                return await handler(request.override(messages=messages))
            command = getattr(response, "command", None)
            if isinstance(response, ExtendedModelResponse) and command is not None:
                if isinstance(command.update, dict):  # a new summary: drop what it covers from state
                    update = drop_summarised(
                        command.update, request.state.get("messages", ()), request.messages
                    )
                    response = dataclasses.replace(
                        response, command=dataclasses.replace(command, update=update)
                    )
            return response

    by_count = settings.summarize_after_messages or 1 << 30
    by_tokens = settings.summarize_after_tokens or 0
    trigger: list[Any] = [("tokens", settings.summarize_after_tokens or 0)]  # only built when set (below)
    if settings.summarize_after_messages:
        trigger.append(("messages", settings.summarize_after_messages))
    return ChitalSummarization(
        model=model,
        backend=backend if backend is not None else bounded_history_backend(),
        trigger=trigger,
        keep=("messages", settings.keep_recent_messages),
        trim_tokens_to_summarize=settings.summary_input_tokens,
        summarizer=summarize,
    )


def own_summarization(
    settings: ContextSettings, model: BaseChatModel, middleware: Sequence[AgentMiddleware[Any, Any, Any]]
) -> list[AgentMiddleware[Any, Any, Any]]:
    """The summarization middleware for a harness whose ``middleware`` brings none (``agent.tools:
    false``, a bare ``Harness``): without summaries a thread's state, and the cost of each of its
    turns, grow with the conversation (agent/compaction.py). Empty when summaries are off."""
    if not settings.summarize_after_tokens or any(getattr(m, "summarizes", False) for m in middleware):
        return []
    return [build_summarization(settings, model)]


_PROMPT_AND_TOOLS_ALLOWANCE = 12_000
"""Tokens set aside for the system prompt and tool schemas when judging a thread "clearly short"."""


def _clearly_short(messages: Sequence[AnyMessage], trigger: int) -> bool:
    """A cheap upper bound of the history's size (one token per character: English runs about four
    characters a token, CJK one or two) stays under the summarization trigger."""
    chars = 0
    for m in messages:
        content = m.content
        chars += len(content) if isinstance(content, str) else len(str(content))
        # Only AI messages have tool calls; getattr on other messages is pydantic's slow miss path.
        calls = m.tool_calls if isinstance(m, AIMessage) else None
        if calls:
            chars += len(str(calls))
    return chars + _PROMPT_AND_TOOLS_ALLOWANCE < trigger


# ---- the stack ----------------------------------------------------------------------------------
def build_context_middleware(
    settings: ContextSettings,
    model: BaseChatModel,
    *,
    guardrails: Sequence[Guardrail] = (),
    secrets: Iterable[str] = (),
    history_backend: Any = None,
    on_title: TitleCallback | None = None,
) -> list[AgentMiddleware[Any, Any, Any]]:
    """The middleware list for ``Harness(extra_middleware=...)``, outermost first.

    ``model``: the lead's chat model (``agent.model.build_chat_model(spec, agent_settings)``);
    summaries and titles use it. ``secrets``: values to scrub from tool error texts (e.g.
    ``WebSettings.api_key``, ``McpSettings.secrets()``).
    """
    stack: list[AgentMiddleware[Any, Any, Any]] = [ClarificationMiddleware()]
    if settings.title != "off":
        stack.append(
            TitleMiddleware(
                model if settings.title == "model" else None,
                max_chars=settings.title_max_chars,
                timeout=settings.title_timeout,
                on_title=on_title,
            )
        )
    stack.append(LoopGuard(settings.loop_warn_after, settings.loop_stop_after))
    if settings.summarize_after_tokens:
        stack.append(build_summarization(settings, model, history_backend))
    stack.append(PatchDanglingToolCalls())
    if guardrails:
        stack.append(GuardrailMiddleware(guardrails, timeout=settings.guardrail_timeout))
    stack.append(ToolErrors(secrets, settings.tool_error_max_chars))
    stack.append(ToolOutputCap())  # any tool's result, bounded before it joins the history
    return stack
