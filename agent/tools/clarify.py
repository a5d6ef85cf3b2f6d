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
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.config import get_stream_writer
from pydantic import BaseModel, Field

from agent.events import Clarification

ASK_CLARIFICATION = "ask_clarification"
CLARIFICATION_EVENT = "chital.clarification"
"""Key of the custom stream event carrying the question."""
_MARK = "chital_clarification"


class _AskArgs(BaseModel):
    question: str = Field(description="One clear question for the user, in the user's language.")


async def _ask(question: str) -> str:
    return question.strip()


def build_ask_clarification() -> BaseTool:
    return StructuredTool.from_function(
        coroutine=_ask,
        name=ASK_CLARIFICATION,
        description=(
            "Ask the user a question when you cannot continue without their answer (missing or "
            "ambiguous requirements, a choice only they can make, a risky action to confirm). "
            "Your turn ends with the question; the user's reply starts the next turn. Do not use "
            "it for things you can find out yourself."
        ),
        args_schema=_AskArgs,
    )


def pending_question(messages: Sequence[AnyMessage]) -> tuple[str, str] | None:
    """(question, tool call id) when the last tool step ran ``ask_clarification`` successfully."""
    for message in reversed(messages):
        if not isinstance(message, ToolMessage):
            return None
        if message.name == ASK_CLARIFICATION and message.status != "error":
            return message.text.strip(), message.tool_call_id
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
        question, call_id = found
        try:
            get_stream_writer()({CLARIFICATION_EVENT: question})
        except RuntimeError:  # outside a graph run
            pass
        return AIMessage(content=question, id=f"clarify-{call_id}", response_metadata={_MARK: True})

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
        return Clarification(part[CLARIFICATION_EVENT])
    return None


def is_clarification(message: Any) -> bool:
    """Whether a checkpointed AIMessage is a turn-ending question (for replays after a restart)."""
    return isinstance(message, AIMessage) and bool(message.response_metadata.get(_MARK))
