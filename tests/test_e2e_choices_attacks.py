"""Attacks on the option buttons (docs/choices.md), end to end: `chital run`, the real agent,
the real SDKs against the fake Telegram, Discord and Lark and the fake model.

Forged button values (unknown code, index out of range, a non-digit, extra fields, another
question's prefix) and a press on buttons a newer turn made stale each get a clear refusal and
change nothing (the model is not called again); an admin may choose for the person asked; a kill -9
after a press neither loses nor doubles the answer."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.daemon import chat_config, started_daemon
from tests.discord_daemon import FRIEND as DC_FRIEND
from tests.fakes.discord_server import FakeDiscord
from tests.fakes.lark_server import FakeLark
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall
from tests.fakes.slack_server import FakeSlack
from tests.fakes.telegram_server import FakeTelegram
from tests.slack_daemon import CHANNEL as SLACK_CHANNEL
from tests.slack_daemon import FRIEND as SLACK_FRIEND
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
    async with started_daemon(tmp_path, cfg):
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


async def test_a_newer_turn_makes_the_buttons_stale(
    tmp_path: Any, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    model.script(Reply(tool_calls=[ASK]), Reply(text="Here is a joke."))
    cfg = telegram_config(tmp_path, tg, model)
    cfg["agent"]["memory"] = {"enabled": False}
    async with started_daemon(tmp_path, cfg):
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


DC_OTHER = "535353535353535353"
LARK_ASKER, LARK_OTHER = "ou_asker", "ou_other"
HOSTILE = ToolCall(
    "ask_clarification",
    {
        "question": "Which?",
        "options": ["Tea @everyone <@424242424242424242>", 'Coffee <at user_id="all"></at>'],
    },
)


async def test_discord_another_users_press_and_a_forged_value_are_refused(
    tmp_path: Any, dc: FakeDiscord, model: FakeOpenAI
) -> None:
    model.script(Reply(tool_calls=[HOSTILE]), Reply(text="Tea it is."))
    allow = [f"discord:{DC_FRIEND}", f"discord:{DC_OTHER}"]
    cfg = chat_config(tmp_path, model.base_url, dc, allow=allow, group_policy="mention")
    cfg["agent"]["memory"] = {"enabled": False}
    async with started_daemon(tmp_path, cfg, dc):
        await dc.inject_message(None, DC_FRIEND, "a drink please", mention_bot=True)
        choice = await dc.wait_for(lambda: next((m for m in dc.bot_messages() if dc.buttons(m.id)), None), 30)
        labels = "".join(dc.buttons(choice.id))
        assert "@everyone" not in labels and "<@" not in labels  # no ping from a label
        other = await dc.press_button(choice.id, DC_OTHER, "Tea")
        refused = await dc.wait_for(lambda: dc.interaction_responses.get(other), timeout=15)
        assert "Not yours" in str(refused) and int(refused["data"].get("flags") or 0) & 64  # ephemeral
        forged = dc.interaction(
            3, choice.channel_id, DC_FRIEND, {"custom_id": "ask:ZZZZZZZZ:0", "component_type": 2}
        )
        forged["message"] = dc._messages[choice.id]  # the buttons message, as press_button sends it
        await dc.inject_interaction(forged)
        answer = await dc.wait_for(lambda: dc.interaction_responses.get(forged["id"]), timeout=15)
        assert "no longer exists" in str(answer) and len(model.requests) == 1
        press = await dc.press_button(choice.id, DC_FRIEND, "Tea")
        toast = await dc.wait_for(lambda: dc.interaction_responses.get(press), timeout=15)
        assert "Tea" in str(toast) and "@everyone" not in str(toast) and "<@" not in str(toast)
        await dc.wait_for(lambda: any("Tea it is." in m.content for m in dc.bot_messages()) or None, 30)
        users = [str(m.get("content")) for m in model.requests[1]["messages"] if m.get("role") == "user"]
        assert "Tea @everyone" in users[-1]  # the model gets the option as written


async def test_lark_another_users_press_is_refused(tmp_path: Any, lark: FakeLark, model: FakeOpenAI) -> None:
    model.script(Reply(tool_calls=[HOSTILE]), Reply(text="Coffee it is."))
    allow = [f"lark:{LARK_ASKER}", f"lark:{LARK_OTHER}"]
    cfg = chat_config(tmp_path, model.base_url, lark, allow=allow, group_policy="mention")
    cfg["agent"]["memory"] = {"enabled": False}
    async with started_daemon(tmp_path, cfg):
        lark.inject_message("oc_group", LARK_ASKER, "a drink please", chat_type="group", mention_bot=True)
        choice = await lark.wait_for_async(
            lambda f: next((m for m in f.bot_messages("oc_group") if m.buttons()), None), timeout=30
        )
        labels = "".join(b["text"]["content"] for b in choice.buttons())
        assert "<at" not in labels and "@everyone" not in labels
        other = lark.press_button(choice.message_id, LARK_OTHER, "Coffee")
        toast = await lark.wait_for_async(lambda f: f.ack_data(other), timeout=15)
        assert toast["toast"]["type"] == "error" and "Not yours" in toast["toast"]["content"]
        assert len(model.requests) == 1
        press = lark.press_button(choice.message_id, LARK_ASKER, "Coffee")
        done = await lark.wait_for_async(lambda f: f.ack_data(press), timeout=15)
        assert done["toast"]["type"] == "success"
        await lark.wait_for_async(
            lambda f: any("Coffee it is." in m.text for m in f.bot_messages()) or None, timeout=30
        )


async def test_kill9_after_a_press_answers_once(tmp_path: Any, tg: FakeTelegram, model: FakeOpenAI) -> None:
    held = asyncio.Event()
    model.script(
        Reply(tool_calls=[ASK]),
        Reply(text="never seen", hold=held),  # the daemon dies while the answer's turn "thinks"
        Reply(text="Coffee, coming up."),
    )
    cfg = telegram_config(tmp_path, tg, model)
    cfg["agent"]["memory"] = {"enabled": False}
    async with started_daemon(tmp_path, cfg) as daemon:
        tg.inject_message(OWNER, OWNER, "a drink please", first_name="Olga")
        choice = await tg.wait_for(
            lambda: next((m for m in tg.bot_messages(OWNER) if tg.buttons(OWNER, m.message_id)), None),
            timeout=30,
            what="the option buttons",
        )
        press = tg.press_button(OWNER, choice.message_id, OWNER, "Coffee", first_name="Olga")
        toast = await tg.wait_for(lambda: tg.answered_queries.get(press["callback_query"]["id"]), timeout=20)
        assert not toast.get("show_alert")
        await tg.wait_for(lambda: len(model.requests) >= 2 or None, timeout=30, what="the answer's turn")
        daemon.kill9()
        await daemon.wait_exit()
        held.set()
        await daemon.start()
        await tg.wait_for(
            lambda: any("Coffee, coming up." in m.text for m in tg.bot_messages(OWNER)) or None,
            timeout=40,
            what="the answer after the restart",
        )
        texts = [m.text for m in tg.bot_messages(OWNER)]
        assert sum("Coffee, coming up." in t for t in texts) == 1 and not any(
            "never seen" in t for t in texts
        )
        users = [str(m.get("content")) for m in model.requests[-1]["messages"] if m.get("role") == "user"]
        assert users[-1].endswith("Coffee") and sum(u.endswith("Coffee") for u in users) == 1, "not doubled"
        await tg.wait_for(lambda: tg.buttons(OWNER, choice.message_id) == [], timeout=20, what="closed")


async def test_slack_secrets_and_links_in_options_never_show(
    tmp_path: Any, slack: FakeSlack, model: FakeOpenAI
) -> None:
    options = [f"use {slack.bot_token}", f"<https://evil.example|{slack.app_token}>", "*bold* <!here>"]
    model.script(
        Reply(tool_calls=[ToolCall("ask_clarification", {"question": "Which?", "options": options})])
    )
    cfg = chat_config(
        tmp_path, model.base_url, slack, allow=[f"slack:{SLACK_FRIEND}"], group_policy="mention"
    )
    cfg["agent"]["memory"] = {"enabled": False}
    async with started_daemon(tmp_path, cfg, slack):
        await slack.inject_mention(SLACK_CHANNEL, SLACK_FRIEND, "pick one")
        choice = await slack.wait_for(lambda: next((p for p in slack.posts if p.buttons()), None), timeout=30)
        shown = "".join(choice.buttons()) + str(choice.blocks) + choice.text
        for secret in (slack.bot_token, slack.app_token):
            assert secret not in shown
        assert "<https://evil.example" not in shown and "<!here>" not in shown
        assert len(choice.buttons()) == 3 and all(len(b) <= 75 for b in choice.buttons())
