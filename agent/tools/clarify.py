"""``ask_clarification``: end the turn with a question to the user.

How the turn ends: the tool only records the question (its ToolMessage). On the next model step,
:class:`ClarificationMiddleware` sees that ToolMessage, skips the model call and answers with an
``AIMessage(question)`` without tool calls, so the agent graph ends the normal way. Why not
``Command(goto=END)`` or ``return_direct``: then the thread would end on a ToolMessage, which the
harness reads as an interrupted turn (and a redelivered message would run the model again); an
AIMessage answer keeps the "last message answers the turn" rule, costs no model call and no
extra graph node, and survives a crash between the tool step and the model step.

The middleware also writes the custom stream event ``{"chital.clarification": question}``; the
harness turns it into a ``Clarification`` event with :func:`clarification_from_custom`. The
final AIMessage carries ``response_metadata["chital_clarification"] = True`` for code that only
sees the checkpoint (:func:`is_clarification`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from langchain.agents.middleware.types import AgentMiddleware, ModelRequest, ModelResponse
from langchain_core.messages import AIMessage, AnyMessage, ToolMessage
from langchain_core.tools import BaseTool, StructuredTool, ToolException
from langgraph.config import get_stream_writer
from pydantic import BaseModel, Field

from agent.events import Clarification
from agent.untrusted import visible

ASK_CLARIFICATION = "ask_clarification"
CLARIFICATION_EVENT = "chital.clarification"
"""Key of the custom stream event carrying the question."""
OPTIONS_EVENT = "chital.options"
"""Key of the question's options, in the custom stream event and the final AIMessage's metadata."""
_MARK = "chital_clarification"


MAX_OPTIONS = 8
MIN_OPTIONS = 2
MAX_OPTION_CHARS = 60
"""Options become buttons (docs/choices.md): a few short ones fit every platform's label limit."""
LABEL_DISTINCT = 36
"""Options must differ within their first characters: a button shows about 40 (then an ellipsis),
so two options alike up to there would be two buttons that look the same but answer differently.
Options are compared as people see them (without zero-width or bidi characters), so invisible
characters cannot make two options "distinct" that read the same."""


class _AskArgs(BaseModel):
    question: str = Field(description="One clear question for the user, in the user's language.")
    options: list[str] | None = Field(
        default=None,
        description=(
            f"Optional: {MIN_OPTIONS} to {MAX_OPTIONS} short answers (at most {MAX_OPTION_CHARS} "
            "characters each) the user can pick with one press. Use it when the answer is one of a "
            "few known choices; leave it out for open questions."
        ),
    )


def checked_options(options: list[str] | None) -> tuple[str, ...]:
    """The options, stripped; a ToolException the model can act on when they do not fit."""
    if not options:
        return ()
    cleaned = tuple(" ".join(str(o).split()) for o in options)
    shown = [" ".join(visible(o).split()).casefold() for o in cleaned]  # as people see them
    if not MIN_OPTIONS <= len(cleaned) <= MAX_OPTIONS:
        raise ToolException(f"Give {MIN_OPTIONS} to {MAX_OPTIONS} options (got {len(cleaned)}), or none.")
    if any(not o for o in shown):  # nothing visible (only zero-width characters) is empty too
        raise ToolException("An option is empty; give each option some text.")
    if any(len(o) > MAX_OPTION_CHARS for o in cleaned):
        raise ToolException(f"Each option must be at most {MAX_OPTION_CHARS} characters; shorten them.")
    if len(set(shown)) != len(cleaned):
        raise ToolException("Two options are the same; give distinct options.")
    if len({o[:LABEL_DISTINCT] for o in shown}) != len(cleaned):
        raise ToolException(
            f"Two options start with the same {LABEL_DISTINCT} characters and would look the same on "
            "their buttons; make them differ early."
        )
    return cleaned


async def _ask(question: str, options: list[str] | None = None) -> tuple[str, dict[str, Any]]:
    picked = checked_options(options)
    text = question.strip()
    shown = text + "".join(f"\n{n}. {o}" for n, o in enumerate(picked, 1))
    return shown, {"question": text, "options": list(picked)}


def build_ask_clarification() -> BaseTool:
    return StructuredTool.from_function(
        coroutine=_ask,
        name=ASK_CLARIFICATION,
        description=(
            "Ask the user a question when you cannot continue without their answer (missing or "
            "ambiguous requirements, a choice only they can make, a risky action to confirm). "
            "Your turn ends with the question; the user's reply starts the next turn. When the "
            "answer is one of a few known choices, pass them as `options`: the user gets buttons "
            "and their pick comes back as their answer. Do not use it for things you can find "
            "out yourself."
        ),
        args_schema=_AskArgs,
        response_format="content_and_artifact",
        handle_tool_error=True,
    )


def pending_question(messages: Sequence[AnyMessage]) -> tuple[str, str, tuple[str, ...]] | None:
    """(question, tool call id, options) when the last tool step ran ``ask_clarification``."""
    for message in reversed(messages):
        if not isinstance(message, ToolMessage):
            return None
        if message.name == ASK_CLARIFICATION and message.status != "error":
            art = message.artifact if isinstance(message.artifact, dict) else {}
            opts = art.get("options")
            question = art.get("question")
            text = question if isinstance(question, str) else message.text
            options = tuple(str(o) for o in opts) if isinstance(opts, list) else ()
            return text.strip(), message.tool_call_id, options
    return None


class ClarificationMiddleware(AgentMiddleware[Any, Any, Any]):
    """Registers ``ask_clarification`` and ends the turn after it (see the module docstring).

    Place it before (outside) summarization: a turn that ends on a question needs no summary.
    """

    def __init__(self) -> None:
        super().__init__()
        self.tools = [build_ask_clarification()]

    @staticmethod
    def _answer(request: ModelRequest[Any]) -> AIMessage | None:
        found = pending_question(request.messages)
        if found is None:
            return None
        question, call_id, options = found
        try:
            get_stream_writer()({CLARIFICATION_EVENT: question, OPTIONS_EVENT: list(options)})
        except RuntimeError:  # outside a graph run
            pass
        shown = question + "".join(f"\n{n}. {o}" for n, o in enumerate(options, 1))
        meta: dict[str, Any] = {_MARK: True, OPTIONS_EVENT: list(options), CLARIFICATION_EVENT: question}
        return AIMessage(content=shown, id=f"clarify-{call_id}", response_metadata=meta)

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelResponse[Any] | AIMessage:
        return self._answer(request) or handler(request)

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any] | AIMessage:
        answer = self._answer(request)
        return answer if answer is not None else await handler(request)


def clarification_from_custom(part: Any) -> Clarification | None:
    """The Clarification a custom stream part announces, if it is one."""
    if isinstance(part, dict) and isinstance(part.get(CLARIFICATION_EVENT), str):
        opts = part.get(OPTIONS_EVENT)
        options = tuple(str(o) for o in opts) if isinstance(opts, list) else ()
        return Clarification(part[CLARIFICATION_EVENT], options)
    return None


def is_clarification(message: Any) -> bool:
    """Whether a checkpointed AIMessage is a turn-ending question (for replays after a restart)."""
    return isinstance(message, AIMessage) and bool(message.response_metadata.get(_MARK))


def open_choices(messages: Sequence[Any]) -> tuple[str, tuple[str, ...]] | None:
    """(question, options) when the thread's last message is a question with options: the only
    state in which a press may answer it (any later message makes the buttons stale)."""
    if not messages or not is_clarification(messages[-1]):
        return None
    last = messages[-1]
    opts = last.response_metadata.get(OPTIONS_EVENT)
    if not isinstance(opts, list) or not opts:
        return None
    question = last.response_metadata.get(CLARIFICATION_EVENT)
    return str(question or ""), tuple(str(o) for o in opts)
