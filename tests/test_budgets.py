"""Budgets that hold (issue 19, item 3): the daily token budget is enforced at every model call
(lead, sub-agents), across concurrent turns and daemons, and counts calls the provider reported
no usage for, by estimate.

End to end: the real daemon with Telegram and the fake OpenAI server; the tests count the model
requests the fake received, read the chat and the daemon's database. The ledger's atomicity is
also shown directly on the store, with two stores on one PostgreSQL database standing for two
daemons.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agent.usage import BudgetRefused, PlannedCall
from gateway.store.journal import Store
from gateway.turns.budget import Budgets, Hold
from tests.daemon import DaemonProcess, base_config, free_port
from tests.fakes.gateway_rig import daemon_rows, make_config, store_at
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall, last_user_text
from tests.fakes.telegram_server import FakeTelegram

ME = 4242
"""The user with the budget (a private chat with the bot has the user's id)."""
PROMPT, COMPLETION = 300, 10
CALL = PROMPT + COMPLETION
"""What each scripted model call reports."""
STOP = "Stopped: your daily token budget of"


def config(tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI, budget: int) -> dict[str, Any]:
    cfg = base_config(tmp_path / "data", model.base_url, free_port())
    cfg["channels"]["telegram"] = tg.channel_settings()
    cfg["access"] = {"allow_users": [str(ME)], "group_policy": "free"}
    cfg["agent"]["memory"] = {"enabled": False}
    cfg["agent"]["max_steps"] = 40
    cfg["usage"] = {"daily_tokens": budget, "reserve_output_tokens": 50}
    return cfg


@pytest.fixture
async def started() -> AsyncIterator[list[DaemonProcess]]:
    daemons: list[DaemonProcess] = []
    yield daemons
    for d in daemons:
        await d.close()


async def start(daemons: list[DaemonProcess], tmp_path: Path, cfg: dict[str, Any]) -> DaemonProcess:
    d = DaemonProcess(tmp_path, cfg)
    daemons.append(d)
    await d.start()
    return d


async def reply_to(tg: FakeTelegram, chat: int, update: dict[str, Any], needle: str) -> str:
    """The text of the bot's reply to ``update`` once it shows ``needle``."""
    mid = update["message"]["message_id"]

    def found() -> str | None:
        for m in tg.bot_messages(chat):
            if m.reply_to == mid and needle in m.text:
                return m.text
        return None

    return await tg.wait_for(found, timeout=30, what=f"a reply containing {needle!r}")


def recorded(d: DaemonProcess) -> tuple[int, int, int]:
    """(tokens, estimated tokens, calls) recorded for ME today, once the writes settled."""
    rows = daemon_rows(
        d.config["storage"],
        "SELECT SUM(prompt_tokens + completion_tokens), SUM(estimated_tokens), SUM(calls)"
        " FROM token_usage WHERE user = ?",
        (f"telegram:{ME}",),
    )
    tokens, estimated, calls = rows[0] if rows else (0, 0, 0)
    return int(tokens or 0), int(estimated or 0), int(calls or 0)


async def settled(d: DaemonProcess, calls: int) -> tuple[int, int, int]:
    """What :func:`recorded` says once ``calls`` model calls are in the table (written in the
    background after each call)."""
    for _ in range(200):
        found = recorded(d)
        if found[2] >= calls:
            return found
        await asyncio.sleep(0.05)
    raise AssertionError(f"{calls} calls were never recorded: {recorded(d)}")


async def journal_states(d: DaemonProcess, turns: int) -> list[str]:
    """The states of the daemon's ``turns`` turn entries once none is open (the entry is marked
    after the reply is sent); what is still open after a while is returned as it is."""
    sql = "SELECT state FROM journal WHERE kind = 'turn'"
    states: list[str] = []
    for _ in range(200):
        states = [str(r[0]) for r in daemon_rows(d.config["storage"], sql)]
        if len(states) == turns and not {"pending", "running"} & set(states):
            return states
        await asyncio.sleep(0.05)
    return states


def loop_forever(model: FakeOpenAI) -> None:
    """Every request asks for one more call of a tool that does not exist (the agent answers it
    with an error and calls the model again), with new arguments each time (the loop guard stops
    the same call repeated): a tool loop that only a limit ends."""
    ids = itertools.count()

    def another(_: dict[str, Any]) -> Reply:
        n = next(ids)
        return Reply(tool_calls=[ToolCall("no_such_tool", {"n": n}, id=f"c{n}")], usage=(PROMPT, COMPLETION))

    model.add_rule(lambda _: True, another)


# ---- one message, a tool loop ---------------------------------------------------------------------
async def test_a_tool_loop_stops_at_the_budget_with_a_note(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI, started: list[DaemonProcess]
) -> None:
    budget = 5 * CALL - 100  # the fifth call starts under the budget, the sixth would not
    d = await start(started, tmp_path, config(tmp_path, tg, model, budget))
    loop_forever(model)
    text = await reply_to(tg, ME, tg.inject_message(ME, ME, "loop please"), STOP)
    assert f"{STOP} {budget:,} tokens is used up" in text and "It renews at 00:00 UTC" in text
    assert text.startswith("⚠️ Stopped:"), text
    requests = len(model.requests)
    assert requests == 5, f"{requests} model calls for a budget of {budget} at {CALL} a call"
    tokens, estimated, calls = await settled(d, requests)
    assert (tokens, estimated, calls) == (requests * CALL, 0, requests)
    assert tokens <= budget + CALL
    assert await journal_states(d, 1) == ["done"], "the stopped turn is done, not run again at a restart"
    logs = d.logs()  # the operator: one line for the refusal, no callback "error" from LangChain
    assert f"budget: a lead call (default) refused: {tokens} used and 0 held of {budget}" in logs
    assert "Error in UsageCallback" not in logs
    # The next message is refused at intake: no model call at all.
    refused = tg.inject_message(ME, ME, "and now?")
    await reply_to(tg, ME, refused, "You have used your token budget for today")
    await asyncio.sleep(0.3)
    assert len(model.requests) == requests


# ---- sub-agents -------------------------------------------------------------------------------------
async def test_three_sub_agents_stop_at_the_budget(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI, started: list[DaemonProcess]
) -> None:
    budget = 8 * CALL
    d = await start(started, tmp_path, config(tmp_path, tg, model, budget))
    tasks = [
        ToolCall("task", {"description": f"job {name}", "subagent_type": "general-purpose"}, id=f"t{name}")
        for name in "ABC"
    ]
    model.script(Reply(tool_calls=tasks, usage=(PROMPT, COMPLETION)))
    loop_forever(model)  # each sub-agent, and the lead after them, loops on a tool
    text = await reply_to(tg, ME, tg.inject_message(ME, ME, "split this three ways"), STOP)
    assert f"{budget:,} tokens is used up" in text
    requests = len(model.requests)
    subagent_requests = sum(last_user_text(r).startswith("job ") for r in model.requests)
    assert subagent_requests >= 3, "all three sub-agents started"
    tokens, _, calls = await settled(d, requests)
    assert calls == requests and tokens == requests * CALL
    # Each call is held before it is sent (its estimated request plus 50 for the answer, more
    # than the 310 it reports), so calls in flight together cannot pass on the same remainder.
    assert tokens <= budget + CALL, f"{requests} calls, {tokens} tokens for a budget of {budget}"
    assert await journal_states(d, 1) == ["done"]


# ---- memory extraction --------------------------------------------------------------------------
async def test_memory_extraction_is_held_to_the_budget_too(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI, started: list[DaemonProcess]
) -> None:
    cfg = config(tmp_path, tg, model, 1000)
    cfg["agent"]["memory"] = {"enabled": True, "debounce_seconds": 0.3}
    d = await start(started, tmp_path, cfg)
    model.script(Reply(text="Noted, Ann.", usage=(1200, 10)))  # the answer spends the budget
    await reply_to(tg, ME, tg.inject_message(ME, ME, "I am Ann and I like tea"), "Noted, Ann.")
    for _ in range(300):  # the extraction runs in the background, after its debounce
        if "budget: a memory call (default) refused" in d.logs():
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the memory extraction was never refused:\n" + d.logs()[-3000:])
    assert len(model.requests) == 1, "the extraction call never reached the model"
    assert await settled(d, 1) == (1210, 0, 1)


# ---- concurrent turns of one user -------------------------------------------------------------------
async def test_eight_messages_at_once_stay_within_the_budget(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI, started: list[DaemonProcess]
) -> None:
    budget = 20 * CALL
    d = await start(started, tmp_path, config(tmp_path, tg, model, budget))
    loop_forever(model)
    groups = [-1001000 - i for i in range(8)]  # eight chats: eight turns run at once
    ups = [
        (g, tg.inject_message(g, ME, f"loop in group {i}", chat_type="supergroup"))
        for i, g in enumerate(groups)
    ]
    texts = [await reply_to(tg, g, up, "⚠️ Stopped:") for g, up in ups]
    assert all(f"daily token budget of {budget:,} tokens" in t for t in texts), texts
    requests = len(model.requests)
    tokens, _, calls = await settled(d, requests)
    assert calls == requests and tokens == requests * CALL
    assert tokens <= budget + CALL, f"{requests} calls, {tokens} tokens for a budget of {budget}"
    assert await journal_states(d, 8) == ["done"] * 8


# ---- a provider that reports no usage ------------------------------------------------------------
async def test_calls_without_reported_usage_are_estimated_counted_and_said_so(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI, started: list[DaemonProcess]
) -> None:
    d = await start(started, tmp_path, config(tmp_path, tg, model, 1_000_000))
    model.report_usage = False
    await reply_to(tg, ME, tg.inject_message(ME, ME, "count me " + "x" * 4000), "echo: count me")
    tokens, estimated, calls = await settled(d, 1)
    # The request holds 4,000 characters of the user's words: at least 1,000 tokens by estimate.
    assert calls == 1 and tokens == estimated and tokens >= 1000
    usage = await reply_to(
        tg, ME, tg.inject_command(ME, ME, "usage", chat_type="private", at=None), "Your tokens"
    )
    assert f"(≈ {estimated:,} estimated)" in usage
    assert "counted by estimate" in usage


async def test_estimated_usage_holds_the_budget_too(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI, started: list[DaemonProcess]
) -> None:
    d = await start(started, tmp_path, config(tmp_path, tg, model, 20_000))
    model.report_usage = False
    loop_forever(model)
    text = await reply_to(tg, ME, tg.inject_message(ME, ME, "loop, uncounted"), STOP)
    assert "20,000 tokens is used up" in text
    requests = len(model.requests)
    assert requests < 40, "stopped by the budget, not by the step limit"
    tokens, estimated, calls = await settled(d, requests)
    assert calls == requests and tokens == estimated > 0


# ---- the ledger itself: atomic across daemons ---------------------------------------------------
def planned(prompt_chars: int) -> PlannedCall:
    from langchain_core.messages import HumanMessage

    return PlannedCall("default", "lead", f"telegram:{ME}", "t", "m", [[HumanMessage("x" * prompt_chars)]])


async def admitted(budgets: list[Budgets], calls: int) -> list[Hold]:
    async def one(i: int) -> Hold | None:
        try:
            return await budgets[i % len(budgets)].reserve(planned(400))
        except BudgetRefused:
            return None

    return [h for h in await asyncio.gather(*(one(i) for i in range(calls))) if h is not None]


async def test_concurrent_holds_on_one_store_stay_within_the_budget(tmp_path: Path) -> None:
    cfg = make_config(usage={"daily_tokens": 1000, "reserve_output_tokens": 100})
    store = await store_at(tmp_path / "gateway.sqlite")
    try:
        holds = await admitted([Budgets(store, cfg)], 12)
        # Each hold is 400 / 4 + 4 + 100 = 204 tokens: five fit under 1,000 (the fifth from 816).
        assert [h.tokens for h in holds] == [204] * 5
        assert await store.ledger_state(f"telegram:{ME}", holds[0].day) == (0, 1020)
        held = r"held by your other answers running now \(0 used today, 1,020 held\)"
        with pytest.raises(BudgetRefused, match=held):
            await Budgets(store, cfg).reserve(planned(400))
        # Settled with what the calls cost: the holds are freed, the cost is spent.
        await store.ledger_settle([(150, h.tokens, h.user, h.day) for h in holds])
        assert await store.ledger_state(f"telegram:{ME}", holds[0].day) == (750, 0)
        assert len(await admitted([Budgets(store, cfg)], 4)) == 2  # from 750, then from 954
        await store.ledger_settle([(300, 204, f"telegram:{ME}", holds[0].day)] * 2)
        with pytest.raises(BudgetRefused, match=r"budget of 1,000 tokens is used up \(1,350 used today\)"):
            await Budgets(store, cfg).reserve(planned(4))
    finally:
        await store.close()


async def test_two_daemons_on_one_postgresql_share_the_budget(pg_url: str) -> None:
    cfg = make_config(usage={"daily_tokens": 1000, "reserve_output_tokens": 100})
    first, second = await Store.open_postgres(pg_url), await Store.open_postgres(pg_url)
    try:
        holds = await admitted([Budgets(first, cfg), Budgets(second, cfg)], 16)
        assert len(holds) == 5, "one remainder, not one per daemon"
        assert await second.ledger_state(f"telegram:{ME}", holds[0].day) == (0, 1020)
        await first.ledger_settle([(150, h.tokens, h.user, h.day) for h in holds])
        assert await second.ledger_state(f"telegram:{ME}", holds[0].day) == (750, 0)
    finally:
        await first.close()
        await second.close()


# ---- a provider whose reported usage cannot be true --------------------------------------------
@pytest.mark.parametrize("usage", [(-50_000, 10), (10**15, 10**15)], ids=["negative", "absurd"])
async def test_unbelievable_reported_usage_is_counted_by_estimate(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI, started: list[DaemonProcess], usage: tuple[int, int]
) -> None:
    """A negative count would give budget back (the loop would never stop); one past any real
    call overflows the database's integer. Either way the call is counted by estimate."""
    d = await start(started, tmp_path, config(tmp_path, tg, model, 20_000))
    ids = itertools.count()
    model.add_rule(
        lambda _: True,
        lambda _: Reply(
            tool_calls=[ToolCall("no_such_tool", {"n": (n := next(ids))}, id=f"c{n}")], usage=usage
        ),
    )
    text = await reply_to(tg, ME, tg.inject_message(ME, ME, "loop, miscounted"), STOP)
    assert "20,000 tokens is used up" in text
    requests = len(model.requests)
    assert requests < 40, "stopped by the budget, not by the step limit"
    tokens, estimated, calls = await settled(d, requests)
    assert calls == requests and tokens == estimated > 0
