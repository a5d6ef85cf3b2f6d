"""Usage in money (gateway/turns/pricing.py, docs/models-and-usage.md "Cost"): prices per model in
the config, cost beside tokens in ``/usage`` and the metrics, budgets in money.

In process: the real recorder, store and ``/usage`` with a FakeChannel. End to end: ``chital run``
with the fake Telegram and the fake model, which reports its usage (cached prompt tokens included)
as OpenAI does; what the user reads comes from the fake Telegram, the metrics from ``/metrics``.
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

import pytest

from agent.usage import BudgetRefused, PlannedCall, TokenUsage
from gateway.config.schema import Config, ConfigError
from gateway.store.db import SqliteConnection
from gateway.store.schema import MIGRATIONS, migrate
from gateway.turns.budget import Budgets, Hold
from gateway.turns.pricing import cost_micros, money
from gateway.turns.usage import UsageRecorder
from tests.daemon import chat_config, started_daemon
from tests.fakes.gateway_rig import Rig, fake_rig, make_config, store_at, until
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.fakes.telegram_server import FakeTelegram

USER = 200
PRICES = {"default": {"input": 3.0, "output": 15.0, "cached_input": 0.3}}
_MIDS = itertools.count(1)


def test_a_calls_cost_in_micros_and_in_words() -> None:
    cfg = make_config(usage={"prices": PRICES})
    prices = cfg.usage.prices
    # 600 uncached × 3 + 400 cached × 0.3 + 200 × 15 micros
    assert cost_micros(prices, "default", 1000, 200, cached=400) == 1800 + 120 + 3000
    assert cost_micros(prices, "default", 1000, 200, cached=5000) == 1000 * 0.3 + 3000, "cached ≤ prompt"
    assert cost_micros(prices, "unpriced", 1000, 200) is None
    assert money(4920, "USD") == "0.0049 USD" and money(12_345_678, "EUR") == "12.35 EUR"


def test_prices_and_money_budgets_are_checked_against_the_models() -> None:
    with pytest.raises(ConfigError, match=r"usage.prices: \['gpt-9'\] are not models\[\].name"):
        make_config(usage={"prices": {"gpt-9": {"input": 1, "output": 2}}})
    with pytest.raises(ConfigError, match="a money budget needs a price for every model"):
        make_config(usage={"daily_cost": 1.5})
    with pytest.raises(ConfigError, match="greater than or equal to 0"):
        make_config(usage={"prices": {"default": {"input": -1, "output": 2}}})
    with pytest.raises(ConfigError, match="write users as 'platform:user_id'"):
        make_config(usage={"prices": PRICES, "user_costs": {"alice": 1.0}})
    assert isinstance(make_config(usage={"prices": PRICES, "daily_cost": 1.5}), Config)


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf", "1e400"])
def test_non_finite_prices_and_money_budgets_are_refused_with_a_specific_error(bad: str) -> None:
    """YAML reads ``.nan``/``.inf`` as floats: a price or budget of NaN or infinity is refused at
    load as not finite (a NaN price made every cost unknown-looking garbage, an infinite budget
    crashed the first budget check converting it to micros)."""
    for where in ("input", "output", "cached_input"):
        price = {"input": 1, "output": 2, where: float(bad)}
        with pytest.raises(ConfigError, match="finite number"):
            make_config(usage={"prices": {"default": price}})
    with pytest.raises(ConfigError, match="finite number"):
        make_config(usage={"prices": PRICES, "daily_cost": float(bad)})
    with pytest.raises(ConfigError, match="a money budget is a number"):
        make_config(usage={"prices": PRICES, "user_costs": {"telegram:1": float(bad)}})
    with pytest.raises(ConfigError, match="less than 1000000000"):
        make_config(usage={"prices": PRICES, "daily_cost": 1e300})


async def ask(rig: Rig, text: str) -> str:
    msg = rig.channel.message(USER, text, mid=f"c{next(_MIDS)}")
    await rig.channel.deliver(msg)
    (answer,) = await until(lambda: rig.channel.replies_to(msg.message_id), what=text)
    return str(answer)


async def test_usage_shows_cost_beside_tokens_and_unknown_for_an_unpriced_model(tmp_path: Path) -> None:
    models = [
        {"name": "default", "use": "langchain_openai:ChatOpenAI", "model": "m", "api_key": "sk-x"},
        {"name": "other", "use": "langchain_openai:ChatOpenAI", "model": "o", "api_key": "sk-x"},
    ]
    cfg = make_config(models=models, access={"allow_users": [str(USER)]}, usage={"prices": PRICES})
    async with fake_rig(tmp_path, cfg) as rig:
        recorder = UsageRecorder(rig.store, rig.metrics, rig.gateway.config.usage)
        recorder.record(
            TokenUsage("default", "lead", f"telegram:{USER}", "", "", 1000, 200, cached_tokens=400)
        )
        recorder.record(TokenUsage("other", "lead", f"telegram:{USER}", "", "", 300, 50))
        await recorder.close()
        text = await ask(rig, "/usage")
        assert "default: 1,200 · 1,200 · 1,200 — cost 0.0049 USD · 0.0049 USD · 0.0049 USD" in text, text
        assert "other: 350 · 350 · 350 — cost unknown (no price for this model)" in text
        assert "Total: 1,550 · 1,550 · 1,550 — cost ≥ 0.0049 USD · ≥ 0.0049 USD · ≥ 0.0049 USD" in text
        assert "(unknown for 350 tokens)" in text
        assert "0.0000" not in text, "an unknown cost is never shown as 0"
        assert rig.metric("chital_model_cost_total", model="default", currency="USD") == pytest.approx(
            0.00492
        )
        assert 'chital_model_cost_total{currency="USD",model="other"}' not in rig.metrics_text()
        assert rig.metric("chital_model_unpriced_tokens_total", model="other") == 350
        (row,) = await (
            await rig.store._db.execute(
                "SELECT cached_tokens, cost_micros FROM token_usage WHERE model = 'default'"
            )
        ).fetchall()
        assert tuple(row) == (400, 4920)


# -- end to end ----------------------------------------------------------------------------------------
OWNER = 1001


def reply_for(tg_model: FakeOpenAI) -> None:
    tg_model.add_rule(lambda _t: True, lambda body: Reply(text="fine", usage=(1000, 200), cached=400))


async def answer(tg: FakeTelegram, text: str, needle: str) -> str:
    up = tg.inject_message(OWNER, OWNER, text)
    mid = up["message"]["message_id"]

    def check() -> str | None:
        return next((m.text for m in tg.bot_messages(OWNER) if m.reply_to == mid and needle in m.text), None)

    return str(await tg.wait_for(check, timeout=30, what=f"a reply with {needle!r}"))


async def test_e2e_cost_in_usage_metrics_and_a_money_budget(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    """Each turn costs 0.00492 USD (1,000 prompt tokens of which 400 cached, 200 completion). With a
    budget of 0.005 USD the first two turns run (the second starts under the budget), the third is
    refused at intake with the money note; /usage and /metrics show the cost."""
    reply_for(model)
    cfg: dict[str, Any] = chat_config(
        tmp_path,
        model.base_url,
        tg,
        allow=[str(OWNER)],
        agent={"tools": False, "memory": {"enabled": False}},
        usage={"prices": PRICES, "daily_cost": 0.005, "reserve_output_tokens": 100},
    )
    async with started_daemon(tmp_path, cfg) as daemon:
        await answer(tg, "one", "fine")
        await answer(tg, "two", "fine")
        refused = await answer(tg, "three", "money budget")
        assert refused.startswith("⚠️ You have used your money budget for today (0.0098 USD of 0.0050 USD)")
        usage = await answer(tg, "/usage", "Your tokens")
        assert "default: 2,400 · 2,400 · 2,400 — cost 0.0098 USD · 0.0098 USD · 0.0098 USD" in usage, usage
        assert "Daily money budget: 0.0098 USD of 0.0050 USD spent today, 0.0000 USD left" in usage
        metrics = await daemon.metrics()
        assert 'chital_model_cost_total{currency="USD",model="default"} 0.00984' in metrics, metrics


# -- a money budget at every model call, across concurrent turns ----------------------------------------
def planned(prompt_chars: int) -> PlannedCall:
    from langchain_core.messages import HumanMessage

    return PlannedCall("default", "lead", f"telegram:{USER}", "t", "m", [[HumanMessage("x" * prompt_chars)]])


async def test_concurrent_calls_share_one_money_budget(tmp_path: Path) -> None:
    """Each call holds its prompt estimate and its answer's bound at list price (104 input tokens
    × 3 + 100 × 15 = 1,812 micros); calls start only while spent + held is under 0.01 USD, so 12
    at once admit six (the sixth from 9,060), not twelve; settled, the spent cost refuses the next
    with the money note."""
    cfg = make_config(usage={"prices": PRICES, "daily_cost": 0.01, "reserve_output_tokens": 100})
    store = await store_at(tmp_path / "gateway.sqlite")
    try:
        budgets = Budgets(store, cfg)

        async def one() -> Hold | None:
            try:
                return await budgets.reserve(planned(400))
            except BudgetRefused:
                return None

        holds = [h for h in await asyncio.gather(*(one() for _ in range(12))) if h is not None]
        assert [h.micros for h in holds] == [104 * 3 + 100 * 15] * 6 and all(h.tokens == 0 for h in holds)
        day = holds[0].day
        assert await store.ledger_state(f"telegram:{USER}", day, money=True) == (0, 6 * 1812)
        with pytest.raises(BudgetRefused, match=r"held by your other answers running now \(0.0000 USD spent"):
            await budgets.reserve(planned(400))
        await store.ledger_settle_money([(2500, h.micros, h.user, day) for h in holds])
        with pytest.raises(BudgetRefused, match=r"money budget of 0.0100 USD is used up \(0.0150 USD spent"):
            await budgets.reserve(planned(4))
        assert await store.ledger_state(f"telegram:{USER}", day, money=True) == (15_000, 0)
    finally:
        await store.close()


async def test_usage_recorded_before_prices_existed_is_unpriced_not_free(tmp_path: Path) -> None:
    """A database from before the usage-in-money step with a month of tokens: after it those tokens have no cost, so a
    price configured later shows ``cost unknown`` for them, never 0."""
    db = await SqliteConnection.connect(tmp_path / "g.sqlite")
    try:
        step = next(m.version for m in MIGRATIONS if m.what.startswith("usage in money"))
        await migrate(db, MIGRATIONS[: step - 1])
        await db.execute(
            "INSERT INTO token_usage(user, day, conversation, model, purpose, prompt_tokens,"
            " completion_tokens, calls) VALUES ('telegram:200', '2026-11-20', 'c', 'default', 'lead', 900, 100, 3)"
        )
        await db.commit()
        assert await migrate(db) == step - 1
        async with db.execute("SELECT cost_micros, unpriced_tokens, cached_tokens FROM token_usage") as cur:
            assert [tuple(r) for r in await cur.fetchall()] == [(0, 1000, 0)]
    finally:
        await db.close()
