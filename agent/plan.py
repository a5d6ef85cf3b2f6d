"""Plan mode: the lead agent's ``write_todos`` tool, its plan kept in the thread's graph state.

LangChain's :class:`~langchain.agents.middleware.TodoListMiddleware` gives the tool, the ``todos``
state key and the prompt that teaches the model when to plan. Because the plan is graph state, it
is checkpointed with every step: a turn resumed after a crash (agent/harness.py) continues the
same plan, and ``/plan`` reads it from the checkpoint (:func:`plan_of`). What :class:`PlanMode`
changes, and why:

- **Bounded.** The plan is the model's text shown in a chat: more than :data:`MAX_ITEMS` items or
  an item longer than :data:`MAX_ITEM_CHARS` characters is refused with an error the model reads
  (and can correct), so 10,000 items never reach the state, the checkpoint or the chat.
- **Seen.** Each accepted plan is written to the ``custom`` stream as ``{PLAN_EVENT: [...]}``, which
  :func:`plan_events` turns into a :class:`~agent.events.PlanUpdated` for the gateway's checklist
  message (gateway/delivery/plan.py). Nothing is emitted when no todo is written.
- **No extra graph node.** The library rejects parallel ``write_todos`` calls in an
  ``after_model`` hook, one more super-step (and checkpoint write) on every model call of every
  turn, plans or not. The same check runs inside the tool instead, where it costs nothing unless
  the tool is called; with only ``wrap_model_call`` left, the middleware merges into the model-call
  group (agent/merge.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain.agents.middleware import TodoListMiddleware
from langchain.agents.middleware.todo import WRITE_TODOS_SYSTEM_PROMPT, Todo, WriteTodosInput
from langchain.agents.middleware.types import AgentMiddleware
from langchain.tools import ToolRuntime
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import StructuredTool
from langgraph.types import Command

from agent.events import AgentEvent, PlanItem, PlanUpdated

TOOL = "write_todos"
PLAN_EVENT = "chital_plan"
"""Key of the ``custom`` stream part that carries a new plan."""
MAX_ITEMS = 25
"""Items one plan may hold: enough for real multi-step work, few enough for one chat message."""
MAX_ITEM_CHARS = 200
"""Characters of one item: a step, not a document."""
STATUSES = ("pending", "in_progress", "completed")

PLAN_PROMPT = (
    WRITE_TODOS_SYSTEM_PROMPT
    + f"""

The user sees your to-do list as a checklist in the chat, updated as you go. Keep it to at most
{MAX_ITEMS} short items (at most {MAX_ITEM_CHARS} characters each); mark an item in_progress when you
start it and completed when it is done."""
)


def _refusal(runtime: ToolRuntime[Any, Any], text: str) -> ToolMessage:
    return ToolMessage(content=f"Error: {text}", tool_call_id=runtime.tool_call_id, status="error", name=TOOL)


def _problem(runtime: ToolRuntime[Any, Any], todos: Sequence[Todo]) -> str | None:
    """Why this call is refused, or None. Parallel calls first: each replaces the whole list, so
    which one wins would be a race (the library's own rule, checked here instead of after_model)."""
    messages = (runtime.state or {}).get("messages", ()) if isinstance(runtime.state, dict) else ()
    last = next((m for m in reversed(messages) if isinstance(m, AIMessage)), None)
    if last is not None and sum(call["name"] == TOOL for call in last.tool_calls) > 1:
        return (
            f"The `{TOOL}` tool should never be called multiple times in parallel. "
            "Please call it only once per model invocation to update the todo list."
        )
    if len(todos) > MAX_ITEMS:
        return (
            f"the plan has {len(todos)} items; at most {MAX_ITEMS} are allowed. "
            "Group the steps into fewer, larger items and call write_todos again."
        )
    long = [i + 1 for i, todo in enumerate(todos) if len(todo["content"]) > MAX_ITEM_CHARS]
    if long:
        shown = ", ".join(map(str, long[:10])) + (" …" if len(long) > 10 else "")
        return (
            f"item(s) {shown} are longer than {MAX_ITEM_CHARS} characters. "
            "Write each item as one short step and call write_todos again."
        )
    return None


def _write_todos(runtime: ToolRuntime[Any, Any], todos: list[Todo]) -> Command[Any] | ToolMessage:
    """Replace the plan (validated and bounded), and tell the chat."""
    problem = _problem(runtime, todos)
    if problem is not None:
        return _refusal(runtime, problem)
    plan = [{"content": t["content"], "status": t["status"]} for t in todos]
    if runtime.stream_writer is not None:
        runtime.stream_writer({PLAN_EVENT: plan})
    return Command(
        update={
            "todos": plan,
            "messages": [ToolMessage(f"Updated todo list to {plan}", tool_call_id=runtime.tool_call_id)],
        }
    )


async def _awrite_todos(runtime: ToolRuntime[Any, Any], todos: list[Todo]) -> Command[Any] | ToolMessage:
    return _write_todos(runtime, todos)


class PlanMode(TodoListMiddleware):
    """``TodoListMiddleware`` with a bounded tool that reports each plan, and no after-model node
    (see the module docstring)."""

    # The library's parallel-call check is a graph node on every model call; the tool does it.
    after_model = AgentMiddleware.after_model
    aafter_model = AgentMiddleware.aafter_model

    def __init__(self) -> None:
        super().__init__(system_prompt=PLAN_PROMPT)
        self.tools = [
            StructuredTool.from_function(
                name=TOOL,
                description=self.tool_description,
                func=_write_todos,
                coroutine=_awrite_todos,
                args_schema=WriteTodosInput,
                infer_schema=False,
            )
        ]


def plan_items(todos: Any) -> tuple[PlanItem, ...]:
    """The plan as events carry it, from what the state or a stream part holds (anything not
    shaped like a todo is skipped; the tool's own bounds apply again, for old checkpoints)."""
    if not isinstance(todos, list | tuple):
        return ()
    items = []
    for todo in todos[:MAX_ITEMS]:
        if not isinstance(todo, dict):
            continue
        content, status = todo.get("content"), todo.get("status")
        if isinstance(content, str) and status in STATUSES:
            items.append(PlanItem(content[:MAX_ITEM_CHARS], status))
    return tuple(items)


def plan_events(part: Any) -> list[AgentEvent]:
    """A ``custom_events`` converter (agent/stream_events.py): the plan the tool just wrote."""
    if isinstance(part, dict) and PLAN_EVENT in part:
        return [PlanUpdated(plan_items(part[PLAN_EVENT]))]
    return []


def plan_of(values: dict[str, Any]) -> tuple[PlanItem, ...]:
    """The thread's current plan from its state values (empty: none written)."""
    return plan_items(values.get("todos"))
