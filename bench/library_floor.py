"""What one short turn costs at each layer, from the bare openai SDK up to Chital's agent (run by hand).

    python bench/library_floor.py [--turns 200] [--rounds 5]

Each layer adds one thing to the one below, all against the same instant fake model (a child
process, so its CPU is not counted), in one process, rounds interleaved so that the machine's
noise falls on every layer alike:

1. ``openai SDK``: ``AsyncOpenAI.chat.completions.create``, not streamed (the relay's model call).
2. ``langchain-openai``: the chat model as Chital builds it (``agent.model.build_chat_model``:
   streamed, usage on), ``ainvoke``.
3. ``create_agent``: LangChain's agent graph on that model, no tools, no checkpointer.
4. ``+ SQLite checkpoints``: the same graph with deepagents' state and Chital's checkpointer
   (``InlineSqliteSaver``), durability "sync", streamed as the harness streams it: the least a
   durable LangGraph turn costs.
5. ``Harness (tools off)``: Chital's harness (``agent.tools: false``).
6. ``AgentRuntime (tools on)``: the default stack (sandbox, sub-agents, skills, memory, context).

Every round starts 20 new threads and spreads ``--turns`` turns over them, so a thread's history
stays as short as in ``bench/bench_telegram.py``'s 20 chats x 10. Prints the median CPU per turn
(``time.process_time``: every thread of this process) of each layer and what it adds. GC is frozen
after the warm-up, as the daemon does.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import compat.lean_imports

compat.lean_imports.install()  # as the daemon's entry point does first

from agent import tuning  # noqa: E402  (after the hook, as in the daemon)
from agent.checkpoints import InlineSqliteSaver  # noqa: E402
from agent.config import AgentSettings, ModelSpec  # noqa: E402
from agent.harness import Final, Harness  # noqa: E402
from agent.model import build_chat_model  # noqa: E402
from agent.runtime import AgentRuntime  # noqa: E402
from bench.harness_turns import fake_model  # noqa: E402

Turn = Callable[[str, int], Awaitable[None]]
"""One turn: (thread id, turn number)."""


async def layers(base_url: str, tmp: Path) -> tuple[list[tuple[str, Turn]], Callable[[], Awaitable[None]]]:
    """The six layers as turn functions, and a closer."""
    import openai
    from deepagents import DeepAgentState
    from langchain.agents import create_agent

    spec = ModelSpec(model="bench-model", base_url=base_url, api_key="sk-bench")
    settings = AgentSettings()
    client = openai.AsyncOpenAI(base_url=base_url, api_key="sk-bench", max_retries=0)
    model = build_chat_model(spec, settings)
    bare_graph = create_agent(model, [])
    saver = InlineSqliteSaver.open(tmp / "floor.sqlite")
    durable_graph = create_agent(model, [], state_schema=DeepAgentState, checkpointer=saver)
    bare = Harness(settings, spec, tmp / "harness.sqlite")
    (tmp / "runtime").mkdir(mode=0o755)
    runtime = AgentRuntime(settings, spec, tmp / "runtime")
    await bare.start()
    await runtime.start()

    async def sdk(thread: str, i: int) -> None:
        await client.chat.completions.create(
            model="bench-model", messages=[{"role": "user", "content": f"hello {i}"}]
        )

    async def chat_model(thread: str, i: int) -> None:
        await model.ainvoke(f"hello {i}")

    async def agent_graph(thread: str, i: int) -> None:
        await bare_graph.ainvoke({"messages": [{"role": "user", "content": f"hello {i}"}]})

    async def durable(thread: str, i: int) -> None:
        config: Any = {"configurable": {"thread_id": thread}}
        inp = {"messages": [{"role": "user", "content": f"hello {i}"}]}
        async for _ in durable_graph.astream(
            inp, config, stream_mode=["updates", "custom"], durability="sync"
        ):
            pass

    def ours(harness: Harness | AgentRuntime) -> Turn:
        async def turn(thread: str, i: int) -> None:
            final = None
            async for event in harness.run(
                thread, user_id="u", message_id=f"{thread}-m{i}", text=f"hello {i}"
            ):
                final = event
            assert isinstance(final, Final), final

        return turn

    async def close() -> None:
        await runtime.close()
        await bare.close()
        saver.close()
        await client.close()

    return [
        ("openai SDK (the relay's model call)", sdk),
        ("langchain-openai chat model", chat_model),
        ("create_agent, no checkpointer", agent_graph),
        ("+ SQLite checkpoints, durability sync", durable),
        ("Harness (agent.tools: false)", ours(bare)),
        ("AgentRuntime (tools on, the default)", ours(runtime)),
    ], close


async def cpu_per_turn(turn: Turn, turns: int, tag: str) -> float:
    cpu0 = time.process_time()
    for i in range(turns):
        await turn(f"{tag}-t{i % 20}", i)
    return (time.process_time() - cpu0) / turns * 1000


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=200, help="turns per layer and round (over 20 threads)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    tuning.apply()
    async with fake_model() as base_url:
        with tempfile.TemporaryDirectory() as tmp:
            os.chmod(tmp, 0o755)  # the sandbox user must reach its directories
            named, close = await layers(base_url, Path(tmp))
            try:
                for name, turn in named:  # imports, connection pools, caches
                    await cpu_per_turn(turn, 40, f"warm-{name}")
                gc.collect()
                gc.freeze()
                gc.set_threshold(20_000, 20, 50)
                figures: dict[str, list[float]] = {name: [] for name, _ in named}
                for r in range(args.rounds):
                    for name, turn in named:
                        figures[name].append(await cpu_per_turn(turn, args.turns, f"r{r}-{name}"))
            finally:
                await close()
    print(f"CPU per turn, median of {args.rounds} rounds of {args.turns} turns over 20 new threads")
    print(f"{'layer':<42} {'ms/turn':>8} {'adds':>7}   rounds")
    previous = None
    for name, values in figures.items():
        median = statistics.median(values)
        adds = "" if previous is None else f"{median - previous:+7.2f}"
        spread = " ".join(f"{v:.2f}" for v in values)
        print(f"{name:<42} {median:8.2f} {adds:>7}   {spread}")
        previous = median


if __name__ == "__main__":
    asyncio.run(main())
