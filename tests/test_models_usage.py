"""Models and personas per conversation, token usage and budgets, skills on demand (issue 11, items
4, 7 and 8).

Three layers: the harness against the fake OpenAI server (the chosen model, persona and skill reach
the request; every call's usage is reported); the gateway in process with a FakeChannel (what users
read from /model, /status, /usage, /skills and the budget note, what the agent is asked); and the
real daemon with Telegram and the fake model end to end.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest

from agent.config import AgentSettings, ModelSpec
from agent.events import AgentEvent, Final, TurnFailed
from agent.harness import Harness
from agent.model import build_chat_model
from agent.settings import SubagentSettings
from agent.subagents import build_subagents
from agent.turn import TurnOptions
from agent.turn_overrides import TurnOverrides
from agent.usage import TokenUsage, attach_usage
from gateway.config.schema import ConfigError, parse_config
from gateway.turns.usage import UsageRecorder
from tests.daemon import DaemonProcess, started_daemon
from tests.fakes.gateway_rig import (
    ADMIN,
    USER,
    Rig,
    daemon_rows,
    fake_rig,
    make_config,
    quiet,
    settled,
    store_at,
    until,
)
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall, last_user_text
from tests.fakes.telegram_server import FakeTelegram
from tests.telegram_daemon import OWNER, answered, telegram_config

API_KEY = "sk-test-secret-0123456789"
FAST = AgentSettings(retry_backoff=0.001, model_retries=1, model_timeout=5, system_prompt="BASE PROMPT.")
PERSONA = "You are Zed, the support desk of Acme. Answer in one line."
SKILL_BODY = "Always answer with a table. SKILL-BODY-MARKER."


def system_text(body: dict[str, Any]) -> str:
    """The system prompt of a request (string or content blocks)."""
    parts: list[str] = []
    for m in body["messages"]:
        if m.get("role") == "system":
            content = m.get("content")
            if isinstance(content, list):
                parts.append("".join(str(b.get("text", "")) for b in content if isinstance(b, dict)))
            else:
                parts.append(str(content))
    return "\n".join(parts)


def user_texts(body: dict[str, Any]) -> list[str]:
    return [str(m["content"]) for m in body["messages"] if m["role"] == "user"]


# ---- the harness ------------------------------------------------------------------------------------
class Sink:
    def __init__(self) -> None:
        self.records: list[TokenUsage] = []

    def record(self, usage: TokenUsage) -> None:
        self.records.append(usage)


def two_models(fake: FakeOpenAI) -> list[ModelSpec]:
    common = {"base_url": fake.base_url, "api_key": API_KEY}
    return [
        ModelSpec(name="default", model="fake-model", **common),
        ModelSpec(name="other", model="other-model", **common),
        ModelSpec(name="broken", use="no_such_module:Chat"),
    ]


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[tuple[Harness, FakeOpenAI, Sink]]:
    async with FakeOpenAI() as fake:
        models, sink = two_models(fake), Sink()
        h = Harness(
            FAST,
            models[0],
            tmp_path / "cp.sqlite",
            models=models,
            usage=sink,
            skill_text=lambda name: SKILL_BODY if name == "tables" else None,
        )
        await h.start()
        try:
            yield h, fake, sink
        finally:
            await h.close()


async def turn(h: Harness, text: str, mid: str, options: TurnOptions | None = None) -> list[AgentEvent]:
    run = h.run("t1", user_id="telegram:1", message_id=mid, text=text, options=options or TurnOptions())
    async with aclosing(run) as events:
        return [e async for e in events]


async def test_switched_model_and_persona_answer_with_the_thread_history(
    harness: tuple[Harness, FakeOpenAI, Sink],
) -> None:
    h, fake, sink = harness
    assert (await turn(h, "first question", "m1"))[-1] == Final("echo: first question")
    events = await turn(h, "second question", "m2", TurnOptions(model="other", system_prompt=PERSONA))
    assert events[-1] == Final("echo: second question")
    first, second = fake.requests
    assert first["model"] == "fake-model" and second["model"] == "other-model"
    # The persona replaced the configured prompt; the history went on across the switch.
    assert system_text(first).startswith("BASE PROMPT.")
    assert system_text(second).startswith(PERSONA) and "BASE PROMPT." not in system_text(second)
    assert user_texts(second) == ["first question", "second question"]
    assert "echo: first question" in json.dumps(second["messages"])
    # Back on the default model, without the persona.
    await turn(h, "third", "m3")
    assert fake.requests[-1]["model"] == "fake-model" and "Zed" not in system_text(fake.requests[-1])
    # Every call was counted, under the config's model names, for the turn's user, thread, message.
    assert [(r.model, r.purpose, r.user, r.thread_id, r.message_id) for r in sink.records] == [
        ("default", "lead", "telegram:1", "t1", "m1"),
        ("other", "lead", "telegram:1", "t1", "m2"),
        ("default", "lead", "telegram:1", "t1", "m3"),
    ]
    assert sink.records[0].prompt_tokens == 10 and sink.records[0].completion_tokens > 0


async def test_a_skill_asked_for_is_in_that_turn_only(harness: tuple[Harness, FakeOpenAI, Sink]) -> None:
    h, fake, _ = harness
    await turn(h, "/tables list the planets", "m1", TurnOptions(skill="tables"))
    await turn(h, "and the moons", "m2")
    with_skill, without = fake.requests
    assert "SKILL-BODY-MARKER" in system_text(with_skill) and "`tables`" in system_text(with_skill)
    assert "SKILL-BODY-MARKER" not in system_text(without)


async def test_a_model_that_cannot_be_built_fails_the_turn_clearly(
    harness: tuple[Harness, FakeOpenAI, Sink],
) -> None:
    h, fake, _ = harness
    events = await turn(h, "hi", "m1", TurnOptions(model="broken"))
    assert len(events) == 1 and isinstance(events[0], TurnFailed)
    assert "'broken' cannot be used" in events[0].message and "no_such_module" in events[0].message
    assert fake.requests == []


async def test_fake_model_reports_scripted_usage_in_the_stream(
    harness: tuple[Harness, FakeOpenAI, Sink],
) -> None:
    h, fake, sink = harness
    fake.script(Reply(text="hello", usage=(1234, 56)))
    await turn(h, "hi", "m1")
    assert fake.requests[0]["stream_options"] == {"include_usage": True}
    assert (sink.records[0].prompt_tokens, sink.records[0].completion_tokens) == (1234, 56)


async def test_sub_agents_follow_the_chosen_model_and_their_usage_is_counted(tmp_path: Path) -> None:
    async with FakeOpenAI() as fake:
        models, sink = two_models(fake), Sink()
        lead_model = attach_usage(build_chat_model(models[0], FAST), "default", sink)
        [task] = build_subagents(lead_model, [], SubagentSettings(), [TurnOverrides(lead=False)])
        h = Harness(
            FAST, models[0], tmp_path / "cp.sqlite", extra_middleware=[task], models=models, usage=sink
        )
        await h.start()
        try:
            fake.script(
                Reply(
                    tool_calls=[
                        ToolCall("task", {"description": "count", "subagent_type": "general-purpose"})
                    ]
                ),
                Reply(text="sub-agent report"),
                Reply(text="all done"),
            )
            events = await turn(h, "delegate it", "m1", TurnOptions(model="other"))
            assert events[-1] == Final("all done")
        finally:
            await h.close()
    assert [r["model"] for r in fake.requests] == ["other-model"] * 3
    assert [(r.model, r.purpose, r.message_id) for r in sink.records] == [
        ("other", "lead", "m1"),
        ("other", "subagent", "m1"),
        ("other", "lead", "m1"),
    ]


# ---- config -----------------------------------------------------------------------------------------
MODELS = [{"name": "default", "model": "fake-model"}, {"name": "other", "model": "other-model"}]


@pytest.mark.parametrize(
    ("profiles", "message"),
    [
        ({"a": {"model": "nope"}}, "profiles.a.model: 'nope' is not one of models[].name"),
        ({"a": {"channels": ["irc"]}}, "profiles.a.channels: 'irc' is not a platform"),
        ({"a": {"chats": ["12345"]}}, "profiles.a.chats: '12345' must be 'platform:chat_id'"),
        (
            {"a": {"chats": ["telegram:1"]}, "b": {"chats": ["telegram:1"]}},
            "profiles.b: chat telegram:1 is already given to profiles.a",
        ),
        ({"a": {"modle": "other"}}, "profiles.a.modle (line"),
    ],
)
def test_profile_errors_name_the_field(tmp_path: Path, profiles: dict[str, Any], message: str) -> None:
    from gateway.config.schema import load_config

    path = tmp_path / "config.yaml"
    path.write_text(json.dumps({"models": MODELS, "profiles": profiles}), encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert message in str(err.value)


def test_usage_config_errors() -> None:
    with pytest.raises(ConfigError, match="unknown time zone 'Mars/Base'"):
        parse_config({"usage": {"timezone": "Mars/Base"}})
    with pytest.raises(ConfigError, match="write users as 'platform:user_id'"):
        parse_config({"usage": {"users": {"12345": 10}}})


# ---- the gateway in process -------------------------------------------------------------------------
GROUP = "-100"


def config(tmp_path: Path, **sections: Any) -> Any:
    skills = tmp_path / "skills"
    for name, about in (("pdf-report", "Turn findings into a PDF report."), ("status", "Shadowed.")):
        (skills / name).mkdir(parents=True)
        (skills / name / "SKILL.md").write_text(
            f"---\nname: {name}\ndescription: {about}\n---\n{SKILL_BODY}\n", encoding="utf-8"
        )
    data: dict[str, Any] = {
        "models": MODELS,
        "agent": {"skills": {"public_dir": str(skills), "custom_dir": str(tmp_path / "none")}},
        "access": {"admins": [str(ADMIN)], "allow_users": [str(USER)]},
        "delivery": {"first_edit_delay": 0.05},
    }
    data.update(sections)
    return make_config(**data)


_MIDS = itertools.count(1)


async def ask(rig: Rig, sender: int, text: str, **kw: Any) -> list[str]:
    msg = rig.channel.message(sender, text, mid=f"q{next(_MIDS)}", **kw)
    await rig.channel.deliver(msg)
    return list(await until(lambda: rig.channel.replies_to(msg.message_id), what=f"reply to {text}"))


async def test_model_command_switches_the_conversation_and_survives_a_restart(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    async with fake_rig(tmp_path, cfg) as rig:
        (listing,) = await ask(rig, USER, "/model")
        assert "✓ default (fake-model) — the default here" in listing and "• other (other-model)" in listing
        (reply,) = await ask(rig, USER, "/model nope")
        assert reply == "Unknown model `nope`. Models: `default`, `other`. Send /model to see them."
        (reply,) = await ask(rig, USER, "/model other")
        assert reply.startswith("🔀 This conversation now uses other (other-model)")
        await ask(rig, USER, "hello")
        assert rig.harness.calls[-1].options.model == "other"
        (status,) = await ask(rig, USER, "/status")
        assert "Model: other-model (other) — chosen with /model (default here: default)" in status
        # Another user's DM keeps the default.
        await ask(rig, ADMIN, "hi")
        assert rig.harness.calls[-1].options.model is None
        channel = rig.channel.restarted()
    store = await store_at(tmp_path / "gateway.sqlite")
    try:
        async with fake_rig(tmp_path, cfg, store=store, channel=channel) as rig:
            await ask(rig, USER, "after the restart")
            assert rig.harness.calls[-1].options.model == "other"
            (reply,) = await ask(rig, USER, "/model default")
            assert reply == "↩️ Back to the default model here, default (fake-model)."
            await ask(rig, USER, "and now")
            assert rig.harness.calls[-1].options.model is None
    finally:
        await store.close()


async def test_a_chosen_model_removed_from_the_config_falls_back_to_the_default(tmp_path: Path) -> None:
    async with fake_rig(tmp_path, config(tmp_path)) as rig:
        await ask(rig, USER, "/model other")
        channel = rig.channel.restarted()
    smaller = config(tmp_path / "b", models=MODELS[:1])
    store = await store_at(tmp_path / "gateway.sqlite")
    try:
        async with fake_rig(tmp_path, smaller, store=store, channel=channel) as rig:
            await ask(rig, USER, "still there?")
            assert rig.harness.calls[-1].options.model is None
            (status,) = await ask(rig, USER, "/status")
            assert "Model: fake-model (default)\n" in status and "/model" not in status
    finally:
        await store.close()


async def test_group_model_switch_is_for_admins_by_default(tmp_path: Path) -> None:
    async with fake_rig(tmp_path, config(tmp_path)) as rig:
        (reply,) = await ask(rig, USER, "/model other", chat=GROUP, addressed=True)
        assert (
            reply == "Only an admin of this bot can change the model of a group chat (everyone here uses it)."
        )
        (reply,) = await ask(rig, ADMIN, "/model other", chat=GROUP, addressed=True)
        assert reply.startswith("🔀")
        await ask(rig, USER, "in the group", chat=GROUP, addressed=True)
        assert rig.harness.calls[-1].options.model == "other"
    cfg = config(tmp_path / "b", access={"allow_users": [str(USER)], "group_model_switch": "anyone"})
    async with fake_rig(tmp_path / "b", cfg) as rig:
        (reply,) = await ask(rig, USER, "/model other", chat=GROUP, addressed=True)
        assert reply.startswith("🔀")


async def test_profile_gives_a_chat_its_model_and_persona(tmp_path: Path) -> None:
    cfg = config(
        tmp_path,
        profiles={
            "support": {"model": "other", "system_prompt": PERSONA, "chats": [f"telegram:{GROUP}"]},
            "everyone": {"channels": ["telegram"], "system_prompt": "Be brief."},
        },
    )
    async with fake_rig(tmp_path, cfg) as rig:
        await ask(rig, USER, "help me", chat=GROUP, addressed=True)
        options = rig.harness.calls[-1].options
        assert (options.model, options.system_prompt) == ("other", PERSONA)
        (status,) = await ask(rig, USER, "/status", chat=GROUP, addressed=True)
        assert "Model: other-model (other)\nProfile: support — its own system prompt" in status
        await ask(rig, USER, "in my DM")
        options = rig.harness.calls[-1].options
        assert (options.model, options.system_prompt) == (None, "Be brief.")
        (listing,) = await ask(rig, USER, "/model", chat=GROUP, addressed=True)
        assert "✓ other (other-model) — the default here" in listing and "Profile: support" in listing


async def test_skill_command_runs_a_turn_with_that_skill(tmp_path: Path) -> None:
    async with fake_rig(tmp_path, config(tmp_path)) as rig:
        (reply,) = await ask(rig, USER, "/pdf_report summarise the findings")
        assert reply == "echo: /pdf_report summarise the findings"
        assert rig.harness.calls[-1].options.skill == "pdf-report"
        await ask(rig, USER, "/pdf-report@chital_bot again")
        assert rig.harness.calls[-1].options.skill == "pdf-report"
        await ask(rig, USER, "no skill here")
        assert rig.harness.calls[-1].options.skill is None
        (listing,) = await ask(rig, USER, "/skills")
        assert "/pdf_report — `Turn findings into a PDF report.`" in listing
        assert "status — `Shadowed.` (its name is a command: ask for it in words)" in listing
        # A skill never shadows a built-in command; an unknown name is still unknown.
        (status,) = await ask(rig, USER, "/status")
        assert status.startswith("Thread:")
        (unknown,) = await ask(rig, USER, "/nosuch thing")
        assert unknown.startswith("Unknown command /nosuch.")
        assert len(rig.harness.calls) == 3
        (helped,) = await ask(rig, USER, "/help")
        assert "/model — " in helped and "/usage — " in helped and "/skills — " in helped


async def record(rig: Rig, user: int, model: str, prompt: int, completion: int, mid: str = "") -> None:
    recorder = UsageRecorder(rig.store, rig.metrics, rig.gateway.config.usage)
    recorder.record(TokenUsage(model, "lead", f"telegram:{user}", "", mid, prompt, completion))
    await recorder.close()


async def test_usage_command_and_daily_budget(tmp_path: Path) -> None:
    cfg = config(tmp_path, usage={"daily_tokens": 1000, "users": {f"telegram:{ADMIN}": 50}})
    async with fake_rig(tmp_path, cfg) as rig:
        (nothing,) = await ask(rig, USER, "/usage")
        assert nothing.startswith("You have used no tokens in the last 30 days.")
        first = rig.channel.message(USER, "count me")
        await rig.channel.deliver(first)
        await until(lambda: rig.channel.replies_to(first.message_id))
        await record(rig, USER, "default", 600, 100, mid=first.key)
        await record(rig, USER, "other", 200, 50)
        await record(rig, ADMIN, "other", 10, 5)
        (mine,) = await ask(rig, USER, "/usage")
        assert mine == (
            "Your tokens (prompt + completion) — today · 7 days · 30 days\n"
            "default: 700 · 700 · 700\nother: 250 · 250 · 250\nTotal: 950 · 950 · 950\n"
            "Daily budget: 950 of 1,000 tokens used today, 50 left (renews at midnight, UTC)."
        )
        rows = await (
            await rig.store._db.execute("SELECT user, conversation, model FROM token_usage")
        ).fetchall()
        assert (f"telegram:{USER}", f"telegram:{USER}", "default") in rows  # found by the turn's key
        assert rig.metric("chital_model_tokens_total", model="default", kind="prompt") == 600
        assert rig.metric("chital_model_tokens_total", model="other", kind="completion") == 55

        await record(rig, USER, "default", 40, 10)  # 1,000: spent
        calls = len(rig.harness.calls)
        note = rig.channel.message(USER, "one more please")
        await rig.channel.deliver(note)
        (text,) = await until(lambda: rig.channel.replies_to(note.message_id))
        assert text.startswith("⚠️ You have used your token budget for today (1,000 of 1,000 tokens)")
        assert "renews at midnight (UTC)" in text
        await quiet(0.2)
        assert len(rig.harness.calls) == calls, "the turn did not run"
        await settled(rig.store)  # the note's entry is marked done a moment after the note is sent
        entries = await (
            await rig.store._db.execute("SELECT kind, state FROM journal WHERE key = ?", (note.key,))
        ).fetchall()
        assert entries == [("notice", "done")], "journaled and answered"
        (still,) = await ask(rig, USER, "/usage")  # commands keep working
        assert "1,000 of 1,000 tokens used today, 0 left" in still

        # The admin: a budget of their own (config), everyone's totals in a DM, not in a group.
        (admin,) = await ask(rig, ADMIN, "/usage")
        assert "Everyone — today · 7 days · 30 days" in admin
        assert (
            f"Top users (30 days, first 10):\ntelegram:{USER}: 1,000 · 1,000 · 1,000\ntelegram:{ADMIN}: 15"
            in admin
        )
        (group,) = await ask(rig, ADMIN, "/usage", chat=GROUP, addressed=True)
        assert "Top users" not in group and "(Everyone's usage: send me /usage in a direct message.)" in group


async def test_usage_from_a_worker_thread_is_recorded(tmp_path: Path) -> None:
    async with fake_rig(tmp_path, config(tmp_path)) as rig:
        recorder = UsageRecorder(rig.store, rig.metrics, rig.gateway.config.usage)
        usage = TokenUsage("other", "subagent", f"telegram:{USER}", "", "", 30, 12)
        # A sync model call inside a tool: the write is handed to the loop before the thread ends.
        await asyncio.to_thread(recorder.record, usage)
        await recorder.close()
        (mine,) = await ask(rig, USER, "/usage")
        assert "other: 42 · 42 · 42" in mine


# ---- end to end: the daemon, Telegram and the fake model ---------------------------------------------
@pytest.fixture
async def daemon(tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI) -> AsyncIterator[DaemonProcess]:
    cfg = telegram_config(tmp_path, tg, model)
    base = cfg["models"][0]
    cfg["models"].append({**base, "name": "other", "model": "other-model"})
    skills = tmp_path / "skills"
    (skills / "tables").mkdir(parents=True)
    (skills / "tables" / "SKILL.md").write_text(
        f"---\nname: tables\ndescription: Answer with tables.\n---\n{SKILL_BODY}\n", encoding="utf-8"
    )
    cfg["agent"]["skills"] = {"public_dir": str(skills), "custom_dir": str(tmp_path / "none")}
    cfg["agent"]["memory"] = {"enabled": False}
    cfg["profiles"] = {"desk": {"system_prompt": PERSONA, "chats": [f"telegram:{OWNER}"]}}
    cfg["usage"] = {"daily_tokens": 2000}
    async with started_daemon(tmp_path, cfg) as d:
        yield d


def usage_rows(d: DaemonProcess) -> list[tuple[Any, ...]]:
    return daemon_rows(
        d.config["storage"],
        "SELECT user, conversation, model, purpose, prompt_tokens, completion_tokens FROM token_usage"
        " ORDER BY model",
    )


async def test_e2e_model_persona_skill_usage_and_budget(
    daemon: DaemonProcess, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    def command(name: str, args: str = "") -> dict[str, Any]:
        return tg.inject_command(OWNER, OWNER, name, args, chat_type="private", at=None)

    def request_for(text: str) -> dict[str, Any]:
        return next(r for r in reversed(model.requests) if last_user_text(r) == text)

    model.script(Reply(text="first answer", usage=(700, 10)))
    await answered(tg, OWNER, tg.inject_message(OWNER, OWNER, "first question"), "first answer")
    first = request_for("first question")
    assert first["model"] == "fake-model" and system_text(first).startswith(PERSONA)

    await answered(tg, OWNER, command("model", "other"), "now uses other (other-model)")
    model.script(Reply(text="second answer", usage=(700, 10)))
    await answered(tg, OWNER, tg.inject_message(OWNER, OWNER, "second question"), "second answer")
    second = request_for("second question")
    assert second["model"] == "other-model"
    assert user_texts(second) == ["first question", "second question"], "the history continued"

    await answered(tg, OWNER, command("tables", "list the planets"), "echo: /tables list the planets")
    assert SKILL_BODY in system_text(request_for("/tables list the planets"))
    status = await answered(tg, OWNER, command("status"), "Model: other-model (other)")
    assert "Profile: desk" in status.text

    async def rows() -> list[tuple[Any, ...]] | None:
        found = usage_rows(daemon)
        return found if sum(r[4] + r[5] for r in found) >= 1420 else None

    deadline = asyncio.get_running_loop().time() + 10
    while (found := await rows()) is None:
        assert asyncio.get_running_loop().time() < deadline, usage_rows(daemon)
        await asyncio.sleep(0.1)
    user, conversation = f"telegram:{OWNER}", f"telegram:{OWNER}"
    assert (user, conversation, "default", "lead", 700, 10) in found
    assert any(r[:4] == (user, conversation, "other", "lead") and r[4] >= 700 for r in found)
    _, metrics = await daemon.get("/metrics")
    assert 'chital_model_tokens_total{kind="prompt",model="other"}' in metrics

    # 1,420 + the skill turn's tokens are under 2,000: one more big turn spends the budget.
    model.script(Reply(text="third answer", usage=(600, 10)))
    await answered(tg, OWNER, tg.inject_message(OWNER, OWNER, "third question"), "third answer")
    calls = len(model.requests)
    refused = tg.inject_message(OWNER, OWNER, "fourth question")
    note = await answered(tg, OWNER, refused, "You have used your token budget for today")
    assert "of 2,000 tokens" in note.text
    await asyncio.sleep(0.3)
    assert len(model.requests) == calls, "no model call for a message over the budget"
    usage = await answered(tg, OWNER, command("usage"), "Your tokens")
    assert "Daily budget:" in usage.text and "0 left" in usage.text


async def test_e2e_titles_and_memory_are_counted_for_the_user(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    cfg = telegram_config(tmp_path, tg, model)
    cfg["agent"]["context"] = {"title": "model"}
    cfg["agent"]["memory"] = {"enabled": True, "debounce_seconds": 0.3}
    d = DaemonProcess(tmp_path, cfg)
    await d.start()
    try:
        await answered(
            tg, OWNER, tg.inject_message(OWNER, OWNER, "I am Ann and I like tea"), "echo: I am Ann"
        )
        deadline = asyncio.get_running_loop().time() + 15
        while {r[3] for r in usage_rows(d)} != {"lead", "title", "memory"}:
            assert asyncio.get_running_loop().time() < deadline, usage_rows(d)
            await asyncio.sleep(0.1)
        for user, conversation, name, _, prompt, completion in usage_rows(d):
            assert (user, conversation, name) == (f"telegram:{OWNER}", f"telegram:{OWNER}", "default")
            assert prompt > 0 and completion > 0
    finally:
        await d.close()


# ---- the same commands through the real Slack and Discord adapters ---------------------------------
async def test_model_and_skill_commands_through_slack_and_discord(tmp_path: Path) -> None:
    import discord.gateway
    import discord.http

    from channels.discord import DiscordChannel
    from channels.slack import SlackChannel
    from gateway.daemon.gateway import Gateway
    from gateway.ops.metrics import Metrics
    from tests.fakes.discord_server import FakeDiscord
    from tests.fakes.fake_harness import FakeHarness
    from tests.fakes.gateway_rig import running
    from tests.fakes.slack_server import FakeSlack

    alice, dm, bob = "U_ALICE", "D_ALICE", "900000000000000042"
    cfg = config(tmp_path, access={"allow_users": [f"slack:{alice}", f"discord:{bob}"]})
    store = await store_at(tmp_path / "gateway.sqlite")
    harness = FakeHarness()
    gateway = Gateway(cfg, store, harness, Metrics())
    endpoints = discord.http.Route.BASE, discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY
    try:
        async with FakeSlack() as slack, FakeDiscord(heartbeat_interval=0.5) as fake_discord:
            slack_channel = SlackChannel(slack.bot_token, slack.app_token, api_base_url=slack.api_base_url)
            discord_channel = DiscordChannel(
                fake_discord.token,
                api_base_url=fake_discord.api_base_url,
                gateway_url=fake_discord.gateway_url,
            )
            async with running(slack_channel, gateway), running(discord_channel, gateway):
                # Slack's message box keeps a leading "/" for its own commands: a space first.
                await slack.inject_dm(dm, alice, " /model other")
                await slack.wait_for(
                    lambda: [t for t in slack.texts(dm) if "now uses other" in t], timeout=10
                )
                await slack.inject_dm(dm, alice, "hello from slack")
                await slack.wait_for(lambda: [t for t in slack.texts(dm) if "echo: hello" in t], timeout=10)
                assert harness.calls[-1].options.model == "other"

                await fake_discord.inject_dm(bob, "/pdf_report the findings")
                await until(
                    lambda: [
                        m for m in fake_discord.bot_messages() if "echo: /pdf_report" in (m.content or "")
                    ],
                    timeout=10,
                )
                assert harness.calls[-1].options.skill == "pdf-report"
                assert harness.calls[-1].options.model is None, "the Slack DM's choice stays there"
                await fake_discord.inject_dm(bob, "/skills")
                await until(
                    lambda: [
                        m
                        for m in fake_discord.bot_messages()
                        if "/pdf_report — `Turn findings" in (m.content or "")
                    ],
                    timeout=10,
                )
    finally:
        discord.http.Route.BASE, discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = endpoints
        await gateway.close(0.5)
        await store.close()
