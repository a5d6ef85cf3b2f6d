"""Attacks on the option buttons (docs/choices.md), end to end: `chital run`, the real agent,
python-telegram-bot against the fake Telegram and the fake model.

Forged button values (unknown code, index out of range, a non-digit, extra fields, another
question's prefix) and a press on buttons a newer turn made stale each get a clear refusal and
change nothing (the model is not called again); an admin may choose for the person asked."""

from __future__ import annotations

from typing import Any

from tests.daemon import DaemonProcess
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall
from tests.fakes.telegram_server import FakeTelegram
from tests.telegram_daemon import GROUP, OTHER, OWNER, telegram_config

ASK = ToolCall("ask_clarification", {"question": "Tea or coffee?", "options": ["Tea", "Coffee"]})


def _press(tg: FakeTelegram, message: Any, user: int, data: str, qid: str) -> str:
    """A callback query carrying ``data`` as a modified client could send it."""
    tg.push_update({"callback_query": {
        "id": qid, "from": {"id": user, "is_bot": False, "first_name": "Olga"},
        "message": message.raw, "chat_instance": str(GROUP), "data": data,
    }})  # fmt: skip
    return qid


async def _toast(tg: FakeTelegram, qid: str) -> dict[str, Any]:
    found: dict[str, Any] = await tg.wait_for(lambda: tg.answered_queries.get(qid), timeout=20, what=qid)
    return found


async def test_forged_values_are_refused_and_an_admin_may_choose(
    tmp_path: Any, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    model.script(Reply(tool_calls=[ASK]), Reply(text="Coffee, coming up."))
    cfg = telegram_config(tmp_path, tg, model)
    cfg["agent"]["memory"] = {"enabled": False}
    cfg["access"]["admins"] = [f"telegram:{OWNER}"]
    daemon = DaemonProcess(tmp_path, cfg)
    await daemon.start()
    try:
        tg.inject_mention(GROUP, OTHER, "a drink please", first_name="Ivan")
        choice = await tg.wait_for(
            lambda: next((m for m in tg.bot_messages(GROUP) if tg.buttons(GROUP, m.message_id)), None),
            timeout=30,
            what="the option buttons",
        )
        data = [b["callback_data"] for row in choice.raw["reply_markup"]["inline_keyboard"] for b in row]
        code = data[0].split(":")[1]
        forged = [
            "ask:ZZZZZZZZ:0",  # no such question
            f"ask:{code}:2",  # one past the last option
            f"ask:{code}:99",
            f"ask:{code}:x",  # not a number
            f"ask:{code}:-1",
            f"ask:{code}:0:1",  # an extra field
            f"ask:{code}",
            "ask:",
            f"ask:{code.lower()}:0",  # the code is exact
        ]
        for n, value in enumerate(forged):
            toast = await _toast(tg, _press(tg, choice, OTHER, value, f"forged{n}"))
            assert toast.get("show_alert") is True, value
            assert toast["text"] and "went wrong" not in toast["text"], value
        assert len(model.requests) == 1, "no forged press reached the model"
        assert tg.buttons(GROUP, choice.message_id), "the buttons are still open"

        admin = await _toast(tg, _press(tg, choice, OWNER, data[1], "admin"))  # not the asker, an admin
        assert not admin.get("show_alert") and "Coffee" in admin["text"]
        await tg.wait_for(lambda: len(model.requests) >= 2, timeout=30, what="the admin's choice")
        users = [str(m.get("content")) for m in model.requests[1]["messages"] if m.get("role") == "user"]
        assert users[-1].endswith("Coffee")
        await tg.wait_for(lambda: tg.buttons(GROUP, choice.message_id) == [], timeout=20, what="closed")
    finally:
        await daemon.close()


async def test_a_newer_turn_makes_the_buttons_stale(
    tmp_path: Any, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    model.script(Reply(tool_calls=[ASK]), Reply(text="Here is a joke."))
    cfg = telegram_config(tmp_path, tg, model)
    cfg["agent"]["memory"] = {"enabled": False}
    daemon = DaemonProcess(tmp_path, cfg)
    await daemon.start()
    try:
        tg.inject_message(OWNER, OWNER, "a drink please", first_name="Olga")
        choice = await tg.wait_for(
            lambda: next((m for m in tg.bot_messages(OWNER) if tg.buttons(OWNER, m.message_id)), None),
            timeout=30,
            what="the option buttons",
        )
        data = [b["callback_data"] for row in choice.raw["reply_markup"]["inline_keyboard"] for b in row]
        tg.inject_message(OWNER, OWNER, "never mind, tell me a joke", first_name="Olga")
        await tg.wait_for(lambda: len(model.requests) >= 2, timeout=30, what="the newer turn")
        users = [str(m.get("content")) for m in model.requests[1]["messages"] if m.get("role") == "user"]
        assert users[-1].endswith("tell me a joke"), "a text that is no option stays the user's text"
        await tg.wait_for(lambda: tg.buttons(OWNER, choice.message_id) == [], timeout=20, what="closed")
        tg.push_update({"callback_query": {
            "id": "late", "from": {"id": OWNER, "is_bot": False, "first_name": "Olga"},
            "message": choice.raw, "chat_instance": str(OWNER), "data": data[0],
        }})  # fmt: skip
        late = await _toast(tg, "late")
        assert late.get("show_alert") is True and "already answered" in late["text"]
        assert len(model.requests) == 2
    finally:
        await daemon.close()
