"""A clarifying question with options, as buttons (docs/choices.md), end to end: `chital run`, the
real agent, python-telegram-bot against the fake Telegram and the fake model.

What the user sees (the buttons, the answer replying to the question, the closed buttons saying
who chose what, refusals) and what the model sees (the option as the user's next message)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
from typing import Any

import aiohttp

from tests.daemon import chat_config, free_port, started_daemon
from tests.discord_daemon import FRIEND as DC_FRIEND
from tests.fakes.discord_server import FakeDiscord
from tests.fakes.gateway_rig import daemon_rows, until
from tests.fakes.lark_server import FakeLark
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall
from tests.fakes.slack_server import FakeSlack
from tests.fakes.telegram_server import FakeTelegram
from tests.slack_daemon import CHANNEL, FRIEND, thread_shows
from tests.telegram_daemon import GROUP, OTHER, OWNER, telegram_config

OPTIONS = ["Small", "Large <!channel> @everyone [x](https://evil.example)", "Medium\u202egnp.exe"]
SLACK_OTHER = "U_OTHER"
LARK_FRIEND = "ou_friend"
ASK = ToolCall("ask_clarification", {"question": "Which size do you want?", "options": OPTIONS})


async def _buttons(tg: FakeTelegram, chat: int) -> Any:
    return await tg.wait_for(
        lambda: next((m for m in tg.bot_messages(chat) if tg.buttons(chat, m.message_id)), None),
        timeout=30,
        what="the option buttons",
    )


async def _answer(tg: FakeTelegram, query: dict[str, Any]) -> dict[str, Any]:
    qid = query["callback_query"]["id"]
    found: dict[str, Any] = await tg.wait_for(lambda: tg.answered_queries.get(qid), timeout=20, what="answer")
    return found


def _stale_press(tg: FakeTelegram, chat: int, message: Any, user: int, data: str, n: int) -> dict[str, Any]:
    """A press from a client still showing the old keyboard (the buttons are gone from the message)."""
    return tg.push_update({"callback_query": {
        "id": f"stale{n}", "from": {"id": user, "is_bot": False, "first_name": "Olga"},
        "message": message.raw, "chat_instance": str(chat), "data": data,
    }})  # fmt: skip


def _config(tmp_path: Any, tg: FakeTelegram, model: FakeOpenAI) -> dict[str, Any]:
    cfg = telegram_config(tmp_path, tg, model)
    cfg["agent"]["memory"] = {"enabled": False}  # every model request is the conversation's
    return cfg


def _user_texts(request: dict[str, Any]) -> list[str]:
    return [str(m.get("content")) for m in request["messages"] if m.get("role") == "user"]


async def test_telegram_a_press_answers_the_question_across_a_restart(
    tmp_path: Any, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    model.script(Reply(tool_calls=[ASK]), Reply(text="Large it is."))
    async with started_daemon(tmp_path, _config(tmp_path, tg, model)) as daemon:
        tg.inject_mention(GROUP, OWNER, "order a coffee", first_name="Olga")
        choice = await _buttons(tg, GROUP)
        labels = tg.buttons(GROUP, choice.message_id)
        assert labels[0] == "Small" and len(labels) == 3
        assert all(len(label) <= 40 for label in labels)
        assert "\u202e" not in "".join(labels) + choice.text  # no bidi trick, label or list
        assert "Which size do you want?" in "\n".join(m.text for m in tg.bot_messages(GROUP))
        assert "https://evil.example" not in {e.get("url") for e in choice.raw.get("entities", [])}
        assert "Large" in choice.spans("code")[1]  # the list shows options inert, as code
        data = [b["callback_data"] for row in choice.raw["reply_markup"]["inline_keyboard"] for b in row]
        assert all(d.startswith("ask:") and len(d.encode()) <= 64 and "Large" not in d for d in data)

        stranger = tg.press_button(GROUP, choice.message_id, OTHER, "Small", first_name="Mallory")
        refused = await _answer(tg, stranger)
        assert refused.get("show_alert") is True and "Not yours" in refused["text"]
        assert len(model.requests) == 1

        await daemon.close()  # a restart between the question and the press
        await daemon.start()
        press = tg.press_button(GROUP, choice.message_id, OWNER, "Large", first_name="Olga")
        toast = await _answer(tg, press)
        assert not toast.get("show_alert") and "Large" in toast["text"]
        answer = await tg.wait_for(
            lambda: next((m for m in tg.bot_messages(GROUP) if m.reply_to == choice.message_id), None),
            timeout=30,
            what="the answer in reply to the question",
        )
        await tg.wait_for(lambda: "Large it is." in tg.message(GROUP, answer.message_id).text, timeout=30)
        assert _user_texts(model.requests[1])[-1].endswith(OPTIONS[1])  # the option, as the user's answer
        await tg.wait_for(lambda: tg.buttons(GROUP, choice.message_id) == [], timeout=20, what="closed")
        closed = tg.message(GROUP, choice.message_id).text
        assert "chosen by" in closed and "Olga" in closed and "Large" in closed

        again = _stale_press(tg, GROUP, choice, OWNER, data[0], 1)
        stale = await _answer(tg, again)
        assert stale.get("show_alert") is True and "already answered" in stale["text"]
        tg.redeliver(press)  # the same press served twice: one answer
        await tg.wait_for(lambda: len(tg.calls_to("answerCallbackQuery")) >= 4, what="the redelivered press")
        assert len(model.requests) == 2


async def test_telegram_a_kill_9_before_the_buttons_posts_them_after_the_restart(
    tmp_path: Any, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    """The question went out, then the daemon died (kill -9) before its buttons: at start-up the
    turn is replayed from its checkpoint (no second model call) and the buttons come then. A turn
    that ran whole here skips the checkpoint read for open options when it asked nothing
    (agent/events.py, ``Final.fresh``); a replay must not."""
    model.script(Reply(tool_calls=[ASK]))
    held = tg.hold_answer("sendMessage", lambda p: "Which size" in str(p.get("text")))
    async with started_daemon(tmp_path, _config(tmp_path, tg, model)) as daemon:
        tg.inject_mention(GROUP, OWNER, "order a coffee", first_name="Olga")
        await tg.wait_for(lambda: tg.holding == 1, timeout=30, what="the question being sent")
        assert not any(tg.buttons(GROUP, m.message_id) for m in tg.bot_messages(GROUP))
        daemon.kill9()
        await daemon.wait_exit()
        held.set()
        await daemon.start()
        choice = await _buttons(tg, GROUP)
        assert tg.buttons(GROUP, choice.message_id)[0] == "Small"
        assert len(model.requests) == 1  # replayed from the checkpoint, not asked again


async def test_telegram_a_typed_answer_makes_the_buttons_stale(
    tmp_path: Any, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    model.script(Reply(tool_calls=[ASK]), Reply(text="Medium, then."))
    async with started_daemon(tmp_path, _config(tmp_path, tg, model)):
        tg.inject_message(OWNER, OWNER, "order a coffee", first_name="Olga")
        choice = await _buttons(tg, OWNER)
        data = [b["callback_data"] for row in choice.raw["reply_markup"]["inline_keyboard"] for b in row]
        tg.inject_message(OWNER, OWNER, "3", first_name="Olga")  # a typed number is that option
        await tg.wait_for(lambda: len(model.requests) >= 2, timeout=30, what="the typed answer's turn")
        assert _user_texts(model.requests[1])[-1].endswith(OPTIONS[2])
        await tg.wait_for(lambda: tg.buttons(OWNER, choice.message_id) == [], timeout=20, what="closed")
        assert "Answered in the chat" in tg.message(OWNER, choice.message_id).text
        late = _stale_press(tg, OWNER, choice, OWNER, data[0], 2)
        stale = await _answer(tg, late)
        assert stale.get("show_alert") is True and "already answered" in stale["text"]
        assert len(model.requests) == 2


async def test_slack_a_press_answers_in_the_thread(
    tmp_path: Any, slack: FakeSlack, model: FakeOpenAI
) -> None:
    model.script(Reply(tool_calls=[ASK]), Reply(text="Small it is."))
    cfg = chat_config(
        tmp_path,
        model.base_url,
        slack,
        allow=[f"slack:{FRIEND}", f"slack:{SLACK_OTHER}"],
        group_policy="mention",
    )
    cfg["agent"]["memory"] = {"enabled": False}
    async with started_daemon(tmp_path, cfg, slack):
        post = await slack.inject_mention(CHANNEL, FRIEND, "order a coffee")
        choice = await slack.wait_for(lambda: next((p for p in slack.posts if p.buttons()), None), timeout=30)
        assert choice.thread_ts == post.ts and choice.buttons()[0] == "Small" and len(choice.buttons()) == 3
        assert "<!channel>" not in "".join(choice.buttons()) + str(choice.blocks)  # no live ping anywhere

        other = await slack.press_button(CHANNEL, choice.ts, SLACK_OTHER, "Small", name="mallory")
        await slack.wait_for(lambda: slack.is_acked(other) or None, timeout=10)
        note = await slack.wait_for(lambda: next(iter(slack.ephemerals), None), timeout=10)
        assert note["user"] == SLACK_OTHER and "Not yours" in note["text"] and len(model.requests) == 1

        press = await slack.press_button(CHANNEL, choice.ts, FRIEND, "Small", name="friend")
        await slack.wait_for(lambda: slack.is_acked(press) or None, timeout=10)
        await thread_shows(slack, CHANNEL, post.ts, "Small it is.", timeout=30)
        assert _user_texts(model.requests[1])[-1].endswith("Small")
        await slack.wait_for(
            lambda: (not choice.buttons() and "chosen by" in choice.text) or None, timeout=20
        )
        assert "friend" in choice.text

        again = await slack.press_button(CHANNEL, choice.ts, FRIEND, "Large", name="friend")  # stale client
        await slack.wait_for(lambda: slack.is_acked(again) or None, timeout=10)
        await slack.wait_for(lambda: len(slack.ephemerals) >= 2 or None, timeout=10)
        assert "already answered" in slack.ephemerals[-1]["text"] and len(model.requests) == 2


async def test_discord_a_press_answers(tmp_path: Any, dc: FakeDiscord, model: FakeOpenAI) -> None:
    model.script(Reply(tool_calls=[ASK]), Reply(text="Small it is."))
    cfg = chat_config(tmp_path, model.base_url, dc, allow=[f"discord:{DC_FRIEND}"], group_policy="mention")
    cfg["agent"]["memory"] = {"enabled": False}
    async with started_daemon(tmp_path, cfg, dc):
        await dc.inject_message(None, DC_FRIEND, "order a coffee", mention_bot=True)
        choice = await dc.wait_for(lambda: next((m for m in dc.bot_messages() if dc.buttons(m.id)), None), 30)
        assert dc.buttons(choice.id)[0] == "Small" and "@everyone" not in "".join(dc.buttons(choice.id))
        iid = await dc.press_button(choice.id, DC_FRIEND, "Small")
        await dc.wait_for(lambda: dc.interaction_responses.get(iid), timeout=15)
        await dc.wait_for(lambda: any("Small it is." in m.content for m in dc.bot_messages()) or None, 30)
        assert _user_texts(model.requests[1])[-1].endswith("Small")
        await dc.wait_for(lambda: dc.buttons(choice.id) == [] or None, 20)


async def test_lark_a_press_answers(tmp_path: Any, lark: FakeLark, model: FakeOpenAI) -> None:
    model.script(Reply(tool_calls=[ASK]), Reply(text="Small it is."))
    cfg = chat_config(tmp_path, model.base_url, lark, allow=[f"lark:{LARK_FRIEND}"], group_policy="mention")
    cfg["agent"]["memory"] = {"enabled": False}
    async with started_daemon(tmp_path, cfg):
        lark.inject_message("oc_group", LARK_FRIEND, "order a coffee", chat_type="group", mention_bot=True)
        choice = await lark.wait_for_async(
            lambda f: next((m for m in f.bot_messages("oc_group") if m.buttons()), None), timeout=30
        )
        assert choice.buttons()[0]["text"]["content"] == "Small"
        press = lark.press_button(choice.message_id, LARK_FRIEND, "Small")
        toast = await lark.wait_for_async(lambda f: f.ack_data(press), timeout=15)
        assert toast["toast"]["type"] == "success"
        await lark.wait_for_async(
            lambda f: any("Small it is." in m.text for m in f.bot_messages()) or None, timeout=30
        )
        assert _user_texts(model.requests[1])[-1].endswith("Small")


async def test_telegram_options_that_do_not_fit_are_a_tool_error_and_secrets_never_show(
    tmp_path: Any, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    too_many = ToolCall("ask_clarification", {"question": "Pick", "options": [f"o{n}" for n in range(9)]})
    leaky = ToolCall(
        "ask_clarification", {"question": "Which token?", "options": [f"use {tg.token}", "none"]}
    )
    model.script(Reply(tool_calls=[too_many]), Reply(tool_calls=[leaky]))
    async with started_daemon(tmp_path, _config(tmp_path, tg, model)):
        tg.inject_message(OWNER, OWNER, "pick one", first_name="Olga")
        choice = await _buttons(tg, OWNER)
        tool_results = [
            str(m.get("content")) for m in model.requests[1]["messages"] if m.get("role") == "tool"
        ]
        assert "Give 2 to 8 options (got 9)" in tool_results[-1]  # words the model can act on
        shown = "".join(tg.buttons(OWNER, choice.message_id)) + "".join(
            m.text for m in tg.bot_messages(OWNER)
        )
        assert tg.token not in shown and tg.token.split(":")[-1] not in shown


async def test_telegram_forged_presses_and_numbers_typed_by_someone_else_choose_nothing(
    tmp_path: Any, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    """A press whose value is not ``ask:CODE:<ascii index>`` (a superscript or Arabic-Indic digit,
    a sign, extra colons, an index past the options) gets a specific refusal and no turn; a number
    typed by a group member who was not asked stays their own words (only the asker chooses); a
    superscript "²" typed by the asker is plain text, never a crashed turn."""
    again = ToolCall("ask_clarification", {"question": "Which size, then?", "options": OPTIONS}, id="ask2")
    model.script(Reply(tool_calls=[ASK]), Reply(tool_calls=[again]), Reply(text="Noted."))
    async with started_daemon(tmp_path, _config(tmp_path, tg, model)):
        tg.inject_mention(GROUP, OWNER, "order a coffee", first_name="Olga")
        choice = await _buttons(tg, GROUP)
        data = [b["callback_data"] for row in choice.raw["reply_markup"]["inline_keyboard"] for b in row]
        code = data[0].split(":")[1]
        forged = [f"ask:{code}:²", f"ask:{code}:١", f"ask:{code}:-1", f"ask:{code}:7", f"ask:{code}:1:x"]
        for n, value in enumerate(forged):
            toast = await _answer(tg, _stale_press(tg, GROUP, choice, OWNER, value, 10 + n))
            assert toast.get("show_alert") is True, value
            assert "not one of the options" in toast["text"] or "not mine" in toast["text"], (value, toast)
        assert len(model.requests) == 1 and tg.buttons(GROUP, choice.message_id)  # still open

        tg.inject_mention(GROUP, OTHER, "2", first_name="Mallory")  # not the person asked
        await tg.wait_for(lambda: len(model.requests) >= 2, timeout=30, what="Mallory's turn")
        said = _user_texts(model.requests[1])[-1]
        assert said.endswith("2") and "Large" not in said  # Mallory's "2", not the option
        await _buttons(tg, GROUP)
        await tg.wait_for(
            lambda: len([m for m in tg.bot_messages(GROUP) if tg.buttons(GROUP, m.message_id)]) == 1
        )

        tg.inject_mention(GROUP, OWNER, "²", first_name="Olga")
        await tg.wait_for(lambda: any("Noted." in m.text for m in tg.bot_messages(GROUP)) or None, timeout=30)
        said = _user_texts(model.requests[2])[-1]
        assert said.endswith("²") and "Medium" not in said


async def test_telegram_a_press_racing_a_typed_answer_still_waiting_is_refused(
    tmp_path: Any, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    """The asker typed an answer that waits for a free slot; a press made meanwhile is refused
    (the typed answer is the one on its way), so the agent gets one answer, not two."""
    hold = asyncio.Event()
    model.script(
        Reply(tool_calls=[ASK]), Reply(text="Hello Mallory.", hold=hold), Reply(text="A flat white, then.")
    )
    cfg = _config(tmp_path, tg, model)
    cfg["concurrency"] = {"max_turns": 1}
    async with started_daemon(tmp_path, cfg):
        try:
            tg.inject_message(OWNER, OWNER, "order a coffee", first_name="Olga")
            choice = await _buttons(tg, OWNER)
            tg.inject_message(OTHER, OTHER, "hi", first_name="Mallory")  # holds the only slot
            await tg.wait_for(lambda: len(model.requests) >= 2, timeout=30, what="Mallory's turn")
            tg.inject_message(OWNER, OWNER, "a flat white", first_name="Olga")  # waits for the slot
            # Journaled and waiting (what the press is checked against; the "Queued" sign is not
            # shown on every store: several daemons on PostgreSQL claim an entry when a slot frees).
            waiting = "SELECT COUNT(*) FROM journal WHERE kind = 'turn' AND state = 'pending'"
            await until(lambda: daemon_rows(cfg["storage"], waiting)[0][0], 30, "the typed answer waiting")
            toast = await _answer(
                tg, tg.press_button(OWNER, choice.message_id, OWNER, "Small", first_name="Olga")
            )
            assert toast.get("show_alert") is True and "already being answered" in toast["text"]
            hold.set()
            await tg.wait_for(
                lambda: any("A flat white, then." in m.text for m in tg.bot_messages(OWNER)) or None,
                timeout=30,
            )
            assert _user_texts(model.requests[2])[-1].endswith("a flat white")
            await tg.wait_for(lambda: tg.buttons(OWNER, choice.message_id) == [], timeout=20, what="closed")
            assert (
                len(model.requests) == 3
                and "Answered in the chat" in tg.message(OWNER, choice.message_id).text
            )
        finally:
            hold.set()


async def test_discord_the_pressers_note_shows_no_live_link_or_markup(
    tmp_path: Any, dc: FakeDiscord, model: FakeOpenAI
) -> None:
    """Discord renders an ephemeral reply as Markdown: the option echoed to the presser (model
    text, maybe a prompt injection's) must not become a masked link, a bare link or a mention."""
    link = "[Verify](https://evil.example) @everyone **now**"
    ask = ToolCall("ask_clarification", {"question": "Continue?", "options": [link, "No"]})
    model.script(Reply(tool_calls=[ask]), Reply(text="Done."))
    cfg = chat_config(tmp_path, model.base_url, dc, allow=[f"discord:{DC_FRIEND}"], group_policy="mention")
    cfg["agent"]["memory"] = {"enabled": False}
    async with started_daemon(tmp_path, cfg, dc):
        await dc.inject_message(None, DC_FRIEND, "go on", mention_bot=True)
        choice = await dc.wait_for(lambda: next((m for m in dc.bot_messages() if dc.buttons(m.id)), None), 30)
        iid = await dc.press_button(choice.id, DC_FRIEND, "Verify")
        answer = await dc.wait_for(lambda: dc.interaction_responses.get(iid), timeout=15)
        note = str((answer.get("data") or {}).get("content"))
        assert "Verify" in note and "evil" in note  # the choice is echoed, inert
        assert "](" not in note and "https://" not in note and "@everyone" not in note and "**" not in note
        await dc.wait_for(lambda: any("Done." in m.content for m in dc.bot_messages()) or None, 30)


async def test_telegram_a_hooks_question_answered_by_an_admin_is_the_admins_own_message(
    tmp_path: Any, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    """A hook's turn (started by the bot, its input a webhook payload) asks with options; the
    webhook's "sender" is nobody who can press, a member is refused, an admin may answer; the press
    is the admin's own message: the answer replies to the buttons message, and the model is not
    told the choice is the webhook's payload."""
    secret, port = "hook-secret-choices-0123456789", free_port()
    model.script(Reply(tool_calls=[ASK]), Reply(text="Large, as the admin chose."))
    cfg = _config(tmp_path, tg, model)
    cfg["access"]["admins"] = [str(OWNER)]
    cfg["access"]["allow_chats"] = [str(GROUP)]  # a hook's target chat must be allowed
    cfg["hooks"] = {"host": "127.0.0.1", "port": port, "read_seconds": 3, "hooks": {"ci": {
        "secret": secret, "platform": "telegram", "chat_id": str(GROUP), "prompt": "CI says {payload.state}",
    }}}  # fmt: skip
    tg.inject_message(GROUP, OTHER, "morning all", chat_type="supergroup")  # the bot is in the group
    async with started_daemon(tmp_path, cfg):
        body = json.dumps({"state": "failed"}).encode()
        sig = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
        async with aiohttp.ClientSession() as http:
            url = f"http://127.0.0.1:{port}/hooks/ci"
            headers = {"X-Hub-Signature-256": sig, "Content-Type": "application/json"}
            async with http.post(url, data=body, headers=headers) as r:
                assert r.status == 202, await r.text()
        choice = await _buttons(tg, GROUP)
        refused = await _answer(
            tg, tg.press_button(GROUP, choice.message_id, OTHER, "Small", first_name="Mo")
        )
        assert refused.get("show_alert") is True and "Not yours" in refused["text"]
        toast = await _answer(
            tg, tg.press_button(GROUP, choice.message_id, OWNER, "Large", first_name="Olga")
        )
        assert not toast.get("show_alert") and "Large" in toast["text"]
        answer = await tg.wait_for(
            lambda: next((m for m in tg.bot_messages(GROUP) if "as the admin chose" in m.text), None),
            timeout=30,
        )
        assert answer.reply_to == choice.message_id  # the admin's message, answered in reply
        said = _user_texts(model.requests[1])[-1]
        print("the model was told:", said, sep="\n")
        assert said.endswith(OPTIONS[1]) and "webhook" not in said.lower()


async def test_telegram_a_press_after_new_is_refused_saying_so(
    tmp_path: Any, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    """/new starts a fresh thread: the old question's buttons answer nothing, and the presser is
    told why (not a generic "already answered"); the new thread's model request never sees it."""
    model.script(Reply(tool_calls=[ASK]))
    async with started_daemon(tmp_path, _config(tmp_path, tg, model)):
        tg.inject_message(OWNER, OWNER, "order a coffee", first_name="Olga")
        choice = await _buttons(tg, OWNER)
        before = len(tg.bot_messages(OWNER))
        tg.inject_command(OWNER, OWNER, "new")
        await tg.wait_for(
            lambda: len(tg.bot_messages(OWNER)) > before or None, timeout=30, what="/new's reply"
        )
        toast = await _answer(
            tg, tg.press_button(OWNER, choice.message_id, OWNER, "Small", first_name="Olga")
        )
        assert toast.get("show_alert") is True and "/new" in toast["text"]
        assert len(model.requests) == 1


async def test_telegram_options_that_would_look_the_same_on_buttons_are_a_tool_error(
    tmp_path: Any, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    """Two options alike but for an invisible character, or alike over the part a button shows,
    would be two buttons that look the same and answer differently: the model is told to change them."""
    long = "Yes, deploy the release to production now"
    hidden = ToolCall(
        "ask_clarification", {"question": "Keep?", "options": ["Keep the files", "Keep the\u200b files"]}
    )
    cut = ToolCall(
        "ask_clarification",
        {"question": "Go?", "options": [long + " and keep backups", long + " and wipe backups"]},
    )
    fine = ToolCall("ask_clarification", {"question": "Go?", "options": ["Keep backups", "Wipe backups"]})
    model.script(Reply(tool_calls=[hidden]), Reply(tool_calls=[cut]), Reply(tool_calls=[fine]))
    async with started_daemon(tmp_path, _config(tmp_path, tg, model)):
        tg.inject_message(OWNER, OWNER, "ship it", first_name="Olga")
        choice = await _buttons(tg, OWNER)
        assert tg.buttons(OWNER, choice.message_id) == ["Keep backups", "Wipe backups"]
        results = [str(m.get("content")) for m in model.requests[2]["messages"] if m.get("role") == "tool"]
        assert "Two options are the same" in results[-2]
        assert "would look the same on their buttons" in results[-1]
