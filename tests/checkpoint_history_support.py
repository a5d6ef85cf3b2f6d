"""Graphs shared by the kept-history tests (tests/test_checkpoint_history*.py), on either
saver: the random-run graph whose nodes do what real agents do to ``messages``, and a fan-out of
two workers whose failures a test switches (:data:`FAIL`)."""

from __future__ import annotations

import operator
import random
from typing import Annotated, Any, TypedDict

from deepagents._messages_reducer import _messages_delta_reducer
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, RemoveMessage, ToolMessage
from langgraph.channels.delta import DeltaChannel
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send, interrupt


class State(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], DeltaChannel(_messages_delta_reducer, snapshot_frequency=7)]
    plan: str
    fanout: Annotated[list[str], operator.add]


class Unsnapshotted(TypedDict, total=False):
    """No snapshot in a test's lifetime: every read extends the kept history."""

    messages: Annotated[list[AnyMessage], DeltaChannel(_messages_delta_reducer, snapshot_frequency=10_000)]
    plan: str
    fanout: Annotated[list[str], operator.add]


class Boom(RuntimeError):
    pass


def graph(saver: Any, state: type[Any] = State) -> Any:
    """A graph whose nodes do, on the input's orders, what real agents do to ``messages``."""

    def route(state: Any) -> str:
        return state.get("plan") or "answer"

    def answer(state: Any) -> dict[str, Any]:
        n = len(state.get("messages", []))
        return {"messages": [AIMessage(f"answer {n}", id=f"ai-{n}-{random.random()}")]}

    def parallel(state: Any) -> list[Send]:
        flaky = state.get("plan") == "fanfail"
        return [Send("worker", {"plan": f"{'flaky' if flaky else 'w'}{i}"}) for i in range(3)]

    def worker(state: Any) -> dict[str, Any]:
        plan = state.get("plan", "")
        if plan.startswith("flaky") and random.random() < 0.4:
            # The others' writes of this step are kept as pending writes of the checkpoint; a
            # retry runs only the failed ones.
            raise Boom(f"{plan} failed")
        return {"messages": [AIMessage(f"from {plan}")], "fanout": [plan]}

    def rewrite(state: Any) -> dict[str, Any]:
        messages = state.get("messages", [])
        if len(messages) < 3:
            return {}
        old, gone = messages[0], messages[1]
        # The same id with new content replaces it; RemoveMessage takes one out.
        return {"messages": [HumanMessage(f"{old.content} (edited)", id=old.id), RemoveMessage(id=gone.id)]}

    def tool_then_ask(state: Any) -> dict[str, Any]:
        call = {"name": "shell", "args": {"cmd": "ls"}, "id": f"call-{len(state.get('messages', []))}"}
        return {"messages": [AIMessage("", tool_calls=[call])]}

    def ask(state: Any) -> dict[str, Any]:
        calls = [m for m in state.get("messages", []) if isinstance(m, AIMessage) and m.tool_calls]
        decision = interrupt({"approve": calls[-1].tool_calls[0]["id"] if calls else None})
        if not calls:  # a fork replaced the history under the paused step
            return {"messages": [AIMessage(f"nothing to decide ({decision})")]}
        last = calls[-1]
        # Reassigns a field of a message it read, in place, as human-in-the-loop does.
        last.tool_calls = [] if decision == "no" else last.tool_calls
        return {"messages": [last, ToolMessage(f"decided {decision}", tool_call_id=f"t-{random.random()}")]}

    def fail(state: Any) -> dict[str, Any]:
        raise Boom("node failed")

    def mutate(state: Any) -> dict[str, Any]:
        # Changes messages it was handed without writing anything back: the stored history must
        # not change, so the next read must not show it either.
        for message in state.get("messages", []):
            message.content = "MUTATED"
        return {}

    builder = StateGraph(state)
    for name, fn in (
        ("answer", answer), ("worker", worker), ("rewrite", rewrite), ("tool_then_ask", tool_then_ask),
        ("ask", ask), ("fail", fail), ("mutate", mutate),
    ):  # fmt: skip
        builder.add_node(name, fn)
    builder.add_node("fan", lambda state: {})
    builder.add_conditional_edges(
        START, route, {"answer": "answer", "fan": "fan", "fanfail": "fan", "rewrite": "rewrite",
                       "tool_then_ask": "tool_then_ask", "fail": "fail", "mutate": "mutate"},
    )  # fmt: skip
    builder.add_conditional_edges("fan", parallel, ["worker"])
    builder.add_edge("worker", "answer")
    builder.add_edge("rewrite", "answer")
    builder.add_edge("tool_then_ask", "ask")
    builder.add_edge("ask", "answer")
    builder.add_edge("mutate", "answer")
    builder.add_edge("fail", END)
    builder.add_edge("answer", END)
    return builder.compile(checkpointer=saver)


def shape(messages: list[Any]) -> list[tuple[Any, ...]]:
    return [
        (type(m).__name__, m.id, m.content, [c["id"] for c in getattr(m, "tool_calls", [])]) for m in messages
    ]


class FanState(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], DeltaChannel(_messages_delta_reducer, snapshot_frequency=10_000)]
    plan: str
    fanout: Annotated[list[str], operator.add]


def full(messages: Any) -> list[dict[str, Any]]:
    return [m.model_dump() for m in messages]


FAIL = {"w0": True, "w1": True}


def worker(state: Any) -> dict[str, Any]:
    plan = state["plan"]
    if FAIL[plan]:
        raise RuntimeError(f"{plan} failed")
    return {"messages": [AIMessage(f"from {plan}", id=f"id-{plan}")]}


def fan(saver: Any) -> Any:
    builder = StateGraph(FanState)
    builder.add_node("fan", lambda state: {})
    builder.add_node("worker", worker)
    builder.add_edge(START, "fan")
    builder.add_conditional_edges(
        "fan", lambda s: [Send("worker", {"plan": f"w{i}"}) for i in range(2)], ["worker"]
    )
    builder.add_edge("worker", END)
    return builder.compile(checkpointer=saver)
