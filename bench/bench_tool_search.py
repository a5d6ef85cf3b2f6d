"""Deferred tools: prompt size and first-call latency with 0, 10, 50 and 200 MCP tools (run by hand).

    python bench/bench_tool_search.py [--turns 5] [--counts 0,10,50,200]

For each count a real stdio MCP server (tests/fixtures/mcp_many_tools.py, FastMCP) offers that many
tools, and the whole agent runtime (sandbox, file tools, web, present_files, sub-agents, skills,
context middleware; memory and titles off so no side call is counted) runs against the fake model
(tests/fakes/openai_server.py, in this process) twice: ``agent.tool_search.enabled`` false (every
MCP tool bound: before) and true (after). Measured, as the fake model receives them:

- tool tokens: the size of the ``tools`` array of the turn's first request;
- request tokens: the whole first request (messages + tools);
- use-one-tool turn: prompt tokens summed over every request of a turn that calls one MCP tool
  (before: call, answer = 2 requests; after: tool_search, call, answer = 3 requests);
- first call: wall time from ``run()`` to the fake model holding the first request (median and
  minimum of ``--turns`` plain turns after one warm-up turn; the minimum is the figure least
  disturbed by other load on the machine), and a plain turn's total wall time (median).

Tokens: tiktoken's cl100k_base when it can be loaded, otherwise characters / 4 (the output says
which).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.config import AgentSettings, ModelSpec
from agent.events import Final
from agent.runtime import AgentRuntime
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall, last_user_text

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "mcp_many_tools.py"
FIXED_TOOLS = 3  # stock_quote, run_probe, helpful_notes


def token_counter() -> tuple[Callable[[str], int], str]:
    try:
        import tiktoken

        enc = tiktoken.get_encoding("cl100k_base")
        return (lambda text: len(enc.encode(text))), "tiktoken cl100k_base"
    except Exception:  # not installed, or its encoding file cannot be fetched (offline)
        return (lambda text: len(text) // 4), "characters / 4 (tiktoken encoding not available)"


def settings(count: int, deferred: bool) -> AgentSettings:
    servers = {}
    if count:
        args = [str(FIXTURE), "--filler", str(max(0, count - FIXED_TOOLS))]
        servers["many"] = {"command": sys.executable, "args": args, "timeout": 120}
    return AgentSettings.model_validate(
        {
            "model_retries": 0,
            "memory": {"enabled": False},
            "context": {"title": "off", "summarize_after_tokens": None},
            "mcp": {"servers": servers},
            "tool_search": {"enabled": deferred},
        }
    )


async def measure(
    tmp: Path, count: int, deferred: bool, turns: int, tokens: Callable[[str], int]
) -> dict[str, Any]:
    arrived: list[float] = []

    def plain(body: dict[str, Any]) -> Reply:
        arrived.append(time.perf_counter())
        return Reply(text="ok")

    def one_tool(body: dict[str, Any]) -> Reply:
        done = {m["tool_call_id"] for m in body["messages"] if m["role"] == "tool"}
        if "q1" in done:
            return Reply(text="done")
        if "s1" in done or not deferred:
            return Reply(tool_calls=[ToolCall("stock_quote", {"symbol": "acme"}, id="q1")])
        return Reply(tool_calls=[ToolCall("tool_search", {"query": "stock price quote"}, id="s1")])

    async with FakeOpenAI() as fake:
        return await _measure(fake, tmp, count, deferred, turns, tokens, plain, one_tool, arrived)


async def _measure(
    fake: FakeOpenAI,
    tmp: Path,
    count: int,
    deferred: bool,
    turns: int,
    tokens: Callable[[str], int],
    plain: Callable[[dict[str, Any]], Reply],
    one_tool: Callable[[dict[str, Any]], Reply],
    arrived: list[float],
) -> dict[str, Any]:
    fake.add_rule(lambda text: text.startswith("plain"), plain)
    fake.add_rule(lambda text: text.startswith("use"), one_tool)
    data = Path(tempfile.mkdtemp(prefix=f"{count}-{deferred}-", dir=tmp))
    os.chmod(data, 0o755)
    spec = ModelSpec(model="bench-model", base_url=fake.base_url, api_key="sk-bench")
    runtime = AgentRuntime(settings(count if count else 0, deferred), spec, data)
    await runtime.start()
    try:
        firsts: list[float] = []
        walls: list[float] = []
        for i in range(turns + 1):
            fake.requests.clear()
            arrived.clear()
            t0 = time.perf_counter()
            async for event in runtime.run(f"p{i}", user_id="u", message_id=f"p{i}", text=f"plain {i}"):
                final = event
            assert isinstance(final, Final), final
            if not i:  # the first turn warms imports, pools and caches; then GC as the daemon sets it
                gc.collect()
                gc.freeze()
            else:
                walls.append(time.perf_counter() - t0)
                firsts.append(arrived[0] - t0)
        first = fake.requests[0]
        fake.requests.clear()
        if count:
            async for event in runtime.run("use", user_id="u", message_id="use", text="use the quote tool"):
                final = event
            assert isinstance(final, Final) and final.text == "done", final
        used = [r for r in fake.requests if last_user_text(r).startswith("use")]
    finally:
        await runtime.close()
        gc.unfreeze()
    return {
        "tools": len(first.get("tools") or []),
        "tool_tokens": tokens(json.dumps(first.get("tools") or [])),
        "request_tokens": tokens(json.dumps(first)),
        "use_turn_tokens": sum(tokens(json.dumps(r)) for r in used) if used else None,
        "use_turn_requests": len(used),
        "first_ms": statistics.median(firsts) * 1000,
        "first_min_ms": min(firsts) * 1000,
        "turn_ms": statistics.median(walls) * 1000,
    }


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--counts", default="0,10,50,200")
    args = parser.parse_args()
    for key in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        os.environ.pop(key, None)
    tokens, how = token_counter()
    print(f"tokens counted with {how}; latency: median of {args.turns} turns\n")
    header = (
        f"{'MCP tools':>9} {'deferred':>8} {'bound':>5} {'tool tok':>8} {'request tok':>11} "
        f"{'use-1-tool turn tok (reqs)':>27} {'first call ms':>13} {'min':>6} {'turn ms':>8}"
    )
    print(header)
    print("-" * len(header))
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)
        for count in (int(c) for c in args.counts.split(",")):
            for deferred in (False, True):
                r = await measure(Path(tmp), count, deferred, args.turns, tokens)
                use = f"{r['use_turn_tokens']} ({r['use_turn_requests']})" if r["use_turn_tokens"] else "-"
                print(
                    f"{count:>9} {('on' if deferred else 'off'):>8} {r['tools']:>5} {r['tool_tokens']:>8} "
                    f"{r['request_tokens']:>11} {use:>27} {r['first_ms']:>13.1f} {r['first_min_ms']:>6.1f} {r['turn_ms']:>8.1f}",
                    flush=True,
                )


if __name__ == "__main__":
    asyncio.run(main())
