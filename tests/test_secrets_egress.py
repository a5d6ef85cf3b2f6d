"""Secrets by value (docs/security.md): the daemon's own tokens, keys and passwords never leave it.

End to end on each platform: ``chital run`` against the platform's fake server, every kind of secret
configured (Telegram, Discord, Slack bot and app tokens, the Lark app secret, a model API key, a
URL password, a credential in the environment), and the fake model asking for a file named after a
secret, a shell command that prints them all (behind an approval, so the prompt shows them), then an
answer quoting them as-is, URL-quoted and inside base64. What the platform received (texts, edits,
drafts, buttons, button answers, file names and bytes), what the model received back (tool
results), the daemon's log, ``chital status``, ``/readyz`` and ``/metrics`` must hold none of them.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.daemon import DaemonProcess, base_config, free_port
from tests.fakes.dingtalk_server import FakeDingTalk
from tests.fakes.discord_server import FakeDiscord
from tests.fakes.lark_server import FakeLark
from tests.fakes.matrix_server import SERVER, FakeMatrix
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall
from tests.fakes.slack_server import FakeSlack
from tests.fakes.telegram_server import FakeTelegram
from tests.fakes.wecom_server import FakeWeCom
from tests.fakes.whatsapp_server import FakeWhatsApp

MODEL_KEY = "mdl-KEY-7Qp2Zr9xLw0pTe4s"
URL_PASSWORD = "urlpw-Zx81Qw5eRt"
ENV_TOKEN = "envtok-Hy72Pq01LmZ"
OPENAI_ENV_KEY = "oaienv-93jfk2LQ7v"
OTHERS = {
    "telegram": "987654321:AAFakeTelegramTokenValue_0123456789ab",
    "discord": "NzkyNzE1NDU0MTk2MDg4ODQy.X-hvzA.Ovy4MCQywSkoMRRclStW4xAYK7I",
    "slack_bot": "xoxb-other-bot-token-value",
    "slack_app": "xapp-1-other-app-token-value",
    "lark": "larkSecret0123456789abcdefABCDEF",
    "matrix": "syt_b3RoZXI_OtherMatrixTokenValue_1a2b3c",
    "whatsapp_token": "EAAOtherWhatsAppTokenValue0123456789",
    "whatsapp_secret": "otherWhatsAppAppSecret0123456789",
    "whatsapp_verify": "otherWhatsAppVerifyToken0123",
    "dingtalk": "OtherDingTalkClientSecret_9f8e7d6c5b4a",
    "wecom": "wecomOtherSecretValue0123456789abcdef",
}
"""Credentials of the platforms not under test: configured (disabled) so every kind is present."""
USER_TG, USER_SLACK, USER_DC, USER_LARK = 5150, "U_FRIEND", "424242424242424242", "ou_friend"
USER_MX = f"@friend:{SERVER}"
USER_WA = "15550004242"
USER_DT = "friend0042"
OUTPUTS = "/mnt/user-data/outputs"
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


@pytest.fixture(autouse=True)
def _environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("CHITAL_TEST_SERVICE_TOKEN", ENV_TOKEN)  # only in the environment
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_ENV_KEY)  # the config's key wins, but it is known


@dataclass
class Platform:
    """How the test reaches one platform's fake: send a DM, find and press the approval button,
    and everything the bot sent it, as one text."""

    name: str
    secrets: list[str]
    channel: dict[str, Any]
    access: str
    ask: Callable[[str], Awaitable[Any]]
    buttons: Callable[[], Awaitable[Any]]
    press: Callable[[Any], Awaitable[str]]
    """Presses Approve; returns the answer the presser got (toast, alert, ephemeral)."""
    sent: Callable[[], str]
    connected: Callable[[], Awaitable[None]]
    sections: dict[str, Any] = field(default_factory=dict)
    """Config sections the platform needs besides its channel (WhatsApp: the hooks listener)."""


def on_telegram(tg: FakeTelegram) -> Platform:
    async def ask(text: str) -> Any:
        return tg.inject_message(USER_TG, USER_TG, text, first_name="Olga")

    async def buttons() -> Any:
        return await tg.wait_for(
            lambda: next((m for m in tg.bot_messages(USER_TG) if tg.buttons(USER_TG, m.message_id)), None),
            timeout=30,
            what="the approval buttons",
        )

    async def press(message: Any) -> str:
        query = tg.press_button(USER_TG, message.message_id, USER_TG, "Approve", first_name="Olga")
        qid = query["callback_query"]["id"]
        answer = await tg.wait_for(lambda: tg.answered_queries.get(qid), timeout=15, what="the answer")
        return str(answer.get("text", ""))

    async def connected() -> None:
        return None

    return Platform(
        "telegram",
        [tg.token],
        tg.channel_settings(),
        f"telegram:{USER_TG}",
        ask,
        buttons,
        press,
        lambda: json.dumps([c.params for c in tg.calls], default=str, ensure_ascii=False),
        connected,
    )


def on_slack(fake: FakeSlack) -> Platform:
    dm = "D_FRIEND"

    async def ask(text: str) -> Any:
        return await fake.inject_dm(dm, USER_SLACK, text)

    async def buttons() -> Any:
        return await fake.wait_for(lambda: next((p for p in fake.posts if p.buttons()), None), timeout=30)

    async def press(post: Any) -> str:
        before = len(post.history)
        await fake.press_button(post.channel, post.ts, USER_SLACK, "Approve", name="Olga")
        await fake.wait_for(lambda: len(post.history) > before or None, timeout=15)  # the decision shown
        return post.text

    return Platform(
        "slack",
        [fake.bot_token, fake.app_token],
        {
            "bot_token": fake.bot_token,
            "app_token": fake.app_token,
            "api_base_url": fake.api_base_url,
            "ping_interval": 0.5,
        },
        f"slack:{USER_SLACK}",
        ask,
        buttons,
        press,
        lambda: json.dumps([c.params for c in fake.calls], default=str, ensure_ascii=False),
        fake.wait_connected,
    )


def on_discord(dc: FakeDiscord) -> Platform:
    async def ask(text: str) -> Any:
        return await dc.inject_dm(USER_DC, text)

    async def buttons() -> Any:
        return await dc.wait_for(lambda: next((m for m in dc.bot_messages() if dc.buttons(m.id)), None), 30)

    async def press(message: Any) -> str:
        iid = await dc.press_button(message.id, USER_DC, "Approve")
        answer = await dc.wait_for(lambda: dc.interaction_responses.get(iid), timeout=15)
        return json.dumps(answer)

    def sent() -> str:
        messages = [
            {
                # The message as the bot made it: not the user's message it quotes in its reference.
                "now": {k: v for k, v in dc.message(m.id).items() if k != "referenced_message"},
                "files": [(n, d.decode(errors="replace")) for n, d in m.files],
            }
            for m in dc.bot_messages()
        ]
        return json.dumps([messages, dc.interaction_responses], default=str, ensure_ascii=False)

    return Platform(
        "discord",
        [dc.token],
        {"token": dc.token, "api_base_url": dc.api_base_url, "gateway_url": dc.gateway_url},
        f"discord:{USER_DC}",
        ask,
        buttons,
        press,
        sent,
        dc.wait_connected,
    )


def on_lark(fake: FakeLark) -> Platform:
    p2p = "oc_p2p_friend"

    async def ask(text: str) -> Any:
        return fake.inject_message(p2p, USER_LARK, text, chat_type="p2p")

    async def buttons() -> Any:
        return await fake.wait_for_async(
            lambda f: next((m for m in f.bot_messages() if m.buttons()), None), timeout=30
        )

    async def press(message: Any) -> str:
        event = fake.press_button(message.message_id, USER_LARK, "Approve")
        return json.dumps(await fake.wait_for_async(lambda f: f.ack_data(event), timeout=15))

    def sent() -> str:
        messages = [[m.content, *m.history] for m in fake.bot_messages()]
        files = [(n, d.decode(errors="replace")) for n, d in fake.uploads.values()]
        return json.dumps([messages, files, [a.data for a in fake.acks]], default=str, ensure_ascii=False)

    async def connected() -> None:
        return None  # events injected before the bot connects wait for it

    return Platform(
        "lark",
        [fake.app_secret],
        {
            "app_id": fake.app_id,
            "app_secret": fake.app_secret,
            "domain": fake.base_url,
            "liveness_timeout": 6,
        },
        f"lark:{USER_LARK}",
        ask,
        buttons,
        press,
        sent,
        connected,
    )


def on_matrix(fake: FakeMatrix) -> Platform:
    """Matrix has no buttons: the prompt asks for ``approve CODE`` in words, and that is typed."""
    room = fake.room(f"!friend:{SERVER}", USER_MX)

    async def ask(text: str) -> Any:
        return fake.inject_text(room, USER_MX, text)

    async def buttons() -> Any:
        return await fake.wait_for(
            lambda: next((m for m in fake.bot_messages(room) if "`approve " in m.text), None),
            30,
            "the prompt",
        )

    async def press(prompt: Any) -> str:
        code = re.search(r"`approve ([A-Za-z0-9]+)`", prompt.text)
        assert code is not None, prompt.text
        typed = fake.inject_text(room, USER_MX, f"approve {code.group(1)}")
        answer = await fake.wait_for(lambda: fake.replies_to(room, typed["event_id"]), 15, "the answer")
        return answer[-1].text

    def sent() -> str:
        files = [(n, d.decode(errors="replace")) for n, d in fake.uploads]
        return json.dumps([[c for _, _, c in fake.sent], files], default=str, ensure_ascii=False)

    async def connected() -> None:
        await fake.wait_for(lambda: fake.syncs >= 2, 30, "the first long poll")

    settings = fake.channel_settings()
    settings.pop("enabled")
    return Platform(
        "matrix", [fake.token], settings, f"matrix:{USER_MX}", ask, buttons, press, sent, connected
    )


def on_whatsapp(fake: FakeWhatsApp) -> Platform:
    """Meta calls the daemon: each message is a signed webhook delivery; the approval is reply
    buttons, pressed by delivering the ``interactive`` reply WhatsApp would send."""
    port = free_port()
    fake.webhook_url = f"http://127.0.0.1:{port}/channels/whatsapp/webhook"

    async def ask(text: str) -> Any:
        return await fake.inject_text(USER_WA, text)

    async def buttons() -> Any:
        return await fake.wait_for(
            lambda: next((m for m in fake.to(USER_WA) if m.kind == "interactive"), None), 30, "the buttons"
        )

    async def press(prompt: Any) -> str:
        action = prompt.body["interactive"]["action"]
        if "buttons" in action:
            kind, choices = "button_reply", [b["reply"] for b in action["buttons"]]
        else:  # more than three choices: a list message
            kind, choices = "list_reply", action["sections"][0]["rows"]
        approve = next(c for c in choices if "Approve" in c["title"])
        picked = {"id": approve["id"], "title": approve["title"]}
        msg = fake.message(USER_WA, "interactive", context={"from": "15550100000", "id": prompt.wamid},
                           interactive={"type": kind, kind: picked})  # fmt: skip
        assert await fake.deliver(fake.payload(msg)) == 200
        answer = await fake.wait_for(lambda: fake.replies_to(msg["id"]), 15, "the answer")
        return answer[-1].text

    def sent() -> str:
        files = [(n, d.decode(errors="replace")) for d, _, n in fake.uploads.values()]
        return json.dumps([[m.body for m in fake.sent], files], default=str, ensure_ascii=False)

    async def connected() -> None:
        return None

    settings = fake.channel_settings()
    settings.pop("enabled")
    return Platform(
        "whatsapp", [fake.token, fake.app_secret, fake.verify_token], settings, f"whatsapp:{USER_WA}",
        ask, buttons, press, sent, connected, {"hooks": {"host": "127.0.0.1", "port": port}},
    )  # fmt: skip


def on_dingtalk(fake: FakeDingTalk) -> Platform:
    """DingTalk without a card template has no buttons: approvals are typed, as on Matrix."""

    async def ask(text: str) -> Any:
        return await fake.inject_text("", USER_DT, text)

    async def buttons() -> Any:
        return await fake.wait_for(
            lambda: next((m for m in fake.messages_to(USER_DT) if "`approve " in m.text), None),
            30,
            "the prompt",
        )

    async def press(prompt: Any) -> str:
        code = re.search(r"`approve ([A-Za-z0-9]+)`", prompt.text)
        assert code is not None, prompt.text
        before = len(fake.messages_to(USER_DT))
        await fake.inject_text("", USER_DT, f"approve {code.group(1)}")
        await fake.wait_for(lambda: len(fake.messages_to(USER_DT)) > before, 15, "the answer")
        return fake.messages_to(USER_DT)[before].text

    def sent() -> str:
        return json.dumps([[m.chat_id, m.key, m.param] for m in fake.sent], default=str, ensure_ascii=False)

    async def connected() -> None:
        await fake.wait_for(lambda: fake.ws is not None, 30, "the stream connection")

    settings = fake.channel_settings()
    settings.pop("enabled")
    return Platform(
        "dingtalk",
        [fake.client_secret],
        settings,
        f"dingtalk:{USER_DT}",
        ask,
        buttons,
        press,
        sent,
        connected,
    )


def on_wecom(fake: FakeWeCom) -> Platform:
    """WeCom: the approval is a template card (its long prompt goes first as markdown); the press
    is a ``template_card_event``; files go up through the chunked media upload, whose bytes count
    as sent (decoded: the frames carry them in base64)."""
    user = "friend"

    async def ask(text: str) -> Any:
        return fake.inject_text(user, text)

    async def buttons() -> Any:
        return await fake.wait_for(
            lambda: next((c for c in fake.cards_in(user) if c.card.get("button_list")), None), 30, "the card"
        )

    async def press(card: Any) -> str:
        key = next(b["key"] for b in card.card["button_list"] if "Approve" in b["text"])
        fake.inject_press(user, card, key)
        await fake.wait_for(lambda: not card.card.get("button_list"), 15, "the card closed")
        return str(card.text)

    def sent() -> str:
        files = [[data.decode(errors="replace"), name] for data, name, _ in fake.uploaded.values()]
        return json.dumps([fake.received, files], default=str, ensure_ascii=False)

    settings = fake.channel_settings()
    settings.pop("enabled")
    return Platform("wecom", [fake.secret], settings, f"wecom:{user}", ask, buttons, press, sent,
                    fake.wait_connected)  # fmt: skip


def config(tmp_path: Path, model: FakeOpenAI, platform: Platform) -> dict[str, Any]:
    cfg = base_config(tmp_path / "data", model.base_url, free_port())
    scheme, _, rest = model.base_url.partition("://")
    spec = cfg["models"][0]
    spec["api_key"] = MODEL_KEY
    spec["base_url"] = f"{scheme}://chital:{URL_PASSWORD}@{rest}"  # a URL password
    channels = cfg["channels"]
    channels["telegram"].update(token=OTHERS["telegram"])
    channels["discord"].update(token=OTHERS["discord"])
    channels["slack"].update(bot_token=OTHERS["slack_bot"], app_token=OTHERS["slack_app"])
    channels["lark"].update(app_id="cli_other", app_secret=OTHERS["lark"])
    channels["matrix"].update(
        homeserver="https://matrix.invalid", user_id="@x:invalid", access_token=OTHERS["matrix"]
    )
    channels["whatsapp"].update(phone_number_id="1", access_token=OTHERS["whatsapp_token"],
                                app_secret=OTHERS["whatsapp_secret"], verify_token=OTHERS["whatsapp_verify"])  # fmt: skip
    channels["dingtalk"].update(client_id="dingother", client_secret=OTHERS["dingtalk"])
    channels["wecom"].update(bot_id="aibOtherRobot", secret=OTHERS["wecom"])
    channels[platform.name] = {"enabled": True, **platform.channel}
    cfg.update(platform.sections)
    cfg["access"] = {"allow_users": [platform.access]}
    cfg["agent"]["approvals"] = {"tools": ["execute"], "timeout": 600}
    cfg["agent"]["memory"] = {"enabled": False}  # no model call of its own between the scripted ones
    return cfg


def all_secrets(platform: Platform) -> list[str]:
    others = [v for k, v in OTHERS.items() if not k.startswith(platform.name)]
    return [*platform.secrets, *others, MODEL_KEY, URL_PASSWORD, ENV_TOKEN, OPENAI_ENV_KEY]


def leaks(text: str, secrets: list[str]) -> list[str]:
    """The secrets ``text`` shows, as-is or URL-quoted."""
    return [s for s in secrets if s in text or quote(s, safe="") in text]


@pytest.fixture(params=["telegram", "slack", "discord", "lark", "matrix", "whatsapp", "dingtalk", "wecom"])
def platform(request: pytest.FixtureRequest) -> Platform:
    name = request.param
    fixture = {"telegram": "tg", "slack": "slack", "discord": "dc", "lark": "lark", "matrix": "matrix_hs",
               "whatsapp": "whatsapp", "dingtalk": "dingtalk", "wecom": "wecom"}[name]  # fmt: skip
    fake = request.getfixturevalue(fixture)
    makers = {
        "telegram": on_telegram,
        "slack": on_slack,
        "discord": on_discord,
        "lark": on_lark,
        "matrix": on_matrix,
        "whatsapp": on_whatsapp,
        "dingtalk": on_dingtalk,
        "wecom": on_wecom,
    }
    return makers[name](fake)


@pytest.mark.bwrap
@needs_bwrap
async def test_no_secret_leaves_the_daemon(tmp_path: Path, model: FakeOpenAI, platform: Platform) -> None:
    secrets = all_secrets(platform)
    joined = " ".join(secrets)
    basic = base64.b64encode(f"chital:{URL_PASSWORD}".encode()).decode()  # a Basic-auth header's value
    report = f"{OUTPUTS}/{MODEL_KEY}.txt"
    model.script(
        Reply(tool_calls=[ToolCall("write_file", {"file_path": report, "content": f"keys: {joined}\n"})]),
        Reply(tool_calls=[ToolCall("present_files", {"paths": [report], "caption": f"for {ENV_TOKEN}"})]),
        Reply(
            tool_calls=[
                ToolCall("execute", {"command": f"echo '{joined}'; printf %s '{secrets[0]}' | base64 -w0"})
            ]
        ),
        Reply(text=f"Done. {joined}\nquoted: {quote(secrets[0], safe='')}\nheader: Basic {basic}"),
    )
    daemon = DaemonProcess(tmp_path, config(tmp_path, model, platform))
    await daemon.start()
    try:
        await platform.connected()
        await platform.ask(f"make the report and show me the keys (mine is {MODEL_KEY})")
        prompt = await platform.buttons()
        toast = await platform.press(prompt)
        await until_text(platform, "Done.")
        await asyncio.sleep(1.0)  # the final edit after a draft or a streamed one

        sent = platform.sent()
        assert "execute" in sent and "***" in sent, "the approval prompt and the answer were delivered"
        assert not leaks(sent, secrets), f"{platform.name} received a secret"
        assert basic not in sent and base64.b64encode(secrets[0].encode()).decode()[:40] not in sent
        assert not leaks(toast, secrets)

        tool_results = [
            json.dumps(m.get("content")) for m in model.requests[-1]["messages"] if m["role"] == "tool"
        ]
        assert len(tool_results) == 3 and "***" in tool_results[-1], "the command ran; its output masked"
        # What the model provider got besides its own words: the user's message, tool results.
        given = [
            json.dumps(m) for body in model.requests for m in body["messages"] if m["role"] != "assistant"
        ]
        assert not leaks("\n".join(given), secrets), "a request to the model holds a secret"
        assert base64.b64encode(secrets[0].encode()).decode()[:40] not in "\n".join(tool_results)

        code, status = await daemon.cli("status", "--json")
        assert code == 0 and '"ready"' in status
        _, readyz = await daemon.get("/readyz")
        metrics = await daemon.metrics()
        assert not leaks(status + json.dumps(readyz) + metrics, secrets)
        log = "".join(p.read_text(errors="replace") for p in tmp_path.glob("daemon-*.log"))
        assert "tool" in log.lower() or "chital is running" in log
        assert not leaks(log, secrets)
    finally:
        await daemon.close()


async def until_text(platform: Platform, needle: str, timeout: float = 45) -> None:
    deadline = time.monotonic() + timeout
    while needle not in platform.sent():
        if time.monotonic() > deadline:
            raise AssertionError(f"{platform.name} never showed {needle!r}: {platform.sent()[-2000:]}")
        await asyncio.sleep(0.1)


# ---- the parts, in the test's process ------------------------------------------------------------
SECRET = "tg-Secret-Value-0123456789abcdef"


def test_every_kind_of_secret_is_known(monkeypatch: pytest.MonkeyPatch) -> None:
    """One source: config SecretStr fields, model keys, URL passwords (the database URL's too),
    the environment variables the platforms declare, OPENAI_API_KEY, any ``*_TOKEN``-named one."""
    from gateway.config.schema import builtin_defaults, parse_config
    from gateway.config.secrets import daemon_secrets

    env = {"TELEGRAM_BOT_TOKEN": "111111:AAenv-telegram-token", "SLACK_BOT_TOKEN": "xoxb-env-bot",
           "SLACK_APP_TOKEN": "xapp-env-app-tok", "DISCORD_BOT_TOKEN": "env-discord-token",
           "LARK_APP_ID": "cli_app_id_is_no_secret", "LARK_APP_SECRET": "env-lark-secret",
           "OPENAI_API_KEY": "env-openai-key", "MY_SERVICE_PASSWORD": "env-service-pw",
           "CHITAL_MODEL": "gpt-x", "OPENAI_BASE_URL": "https://u:env-url-pw@llm.example/v1",
           "MATRIX_ACCESS_TOKEN": "env-matrix-token", "MATRIX_USER_ID": "@bot:matrix.example",
           "WHATSAPP_ACCESS_TOKEN": "env-whatsapp-token", "WHATSAPP_APP_SECRET": "env-whatsapp-secret",
           "WHATSAPP_VERIFY_TOKEN": "env-whatsapp-verify", "WHATSAPP_PHONE_NUMBER_ID": "106540352242922",
           "DINGTALK_CLIENT_SECRET": "env-dingtalk-secret", "DINGTALK_CLIENT_ID": "dingappidnosecret",
           "WECOM_BOT_SECRET": "env-wecom-secret", "WECOM_BOT_ID": "aibEnvRobotId"}  # fmt: skip
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    found = daemon_secrets(parse_config(builtin_defaults(), "defaults"))
    plain = (
        "LARK_APP_ID",
        "CHITAL_MODEL",
        "OPENAI_BASE_URL",
        "MATRIX_USER_ID",
        "WHATSAPP_PHONE_NUMBER_ID",
        "DINGTALK_CLIENT_ID",
        "WECOM_BOT_ID",
    )
    expected = [v for k, v in env.items() if k not in plain]
    assert set(expected) <= set(found) and "env-url-pw" in found
    assert "@bot:matrix.example" not in found, "the bot's user id is no secret (it is in every message)"
    assert "cli_app_id_is_no_secret" not in found and "gpt-x" not in found
    assert "aibEnvRobotId" not in found, "the robot's id is no secret (it is what it is addressed by)"

    cfg = parse_config(
        {
            "models": [
                {
                    "name": "default",
                    "model": "x",
                    "api_key": "cfg-model-key",
                    "organization": "sk-plainorg-123",
                }
            ],
            "channels": {"discord": {"token": "cfg-discord-token"}, "slack": {"bot_token": "cfg-bot-token"}},
            "storage": {
                "url": "postgresql://chital:db%40pass-word@db.internal:5432/chital?sslpassword=ssl-pw-x"
            },
            "transcription": {"api_key": "cfg-whisper-key"},
            "agent": {"web": {"search_provider": "tavily", "api_key": "cfg-tavily-key"}},
        },
        "test",
    )
    found = daemon_secrets(cfg, environ={})
    for value in ("cfg-model-key", "sk-plainorg-123", "cfg-discord-token", "cfg-bot-token", "db@pass-word",
                  "db%40pass-word", "ssl-pw-x", "cfg-whisper-key", "cfg-tavily-key"):  # fmt: skip
        assert value in found, value


def test_the_redactor_knows_encodings_shapes_and_unfinished_text() -> None:
    from agent.redact import Redactor

    redact = Redactor([SECRET, "short"])
    blob = base64.b64encode(b"Authorization: Basic x" + SECRET.encode() + b"!").decode()
    for text in (SECRET, quote(SECRET, safe=""), json.dumps({"k": SECRET}), blob, f"a{SECRET}b"):
        assert SECRET not in redact(text) and "***" in redact(text), text
    for shift in range(3):  # base64 of the secret at each alignment inside a longer blob
        assert base64.b64encode(b"x" * shift + SECRET.encode()).decode()[4:20] not in redact(
            base64.b64encode(b"x" * shift + SECRET.encode()).decode()
        )
    assert redact("short words stay") == "short words stay", "values under six characters are not masked"
    telegram, discord = "7012345678:AA" + "b" * 33, "MTA1NjQ3ODkwMTIzNDU2Nzg5.GaBcDe." + "c" * 38
    assert redact(f"t {telegram} d {discord} k sk-{'d' * 24}") == "t *** d *** k ***"
    assert redact("task-" + "e" * 24) == "task-" + "e" * 24, "a word ending in sk- is no key"
    assert redact.stream(f"the token is {SECRET[:9]}") == "the token is ", "a secret being written"
    assert redact.stream("plain text") == "plain text"
    assert redact.data(f"x{SECRET}y".encode()) == b"x" + b"*" * len(SECRET) + b"y"


async def test_streamed_edits_files_buttons_and_answers_are_masked(tmp_path: Path) -> None:
    """A secret streamed in small chunks never shows, even half-written, in an edit or a draft; a
    file's name, caption and bytes, a button's label and value, a press's answer are masked."""
    from agent.events import AgentEvent, Final, TextDelta
    from channels.base import Action, ActionAnswer, Button, OutFile, Rendered
    from tests.fakes.fake_channel import FakeChannel
    from tests.fakes.fake_harness import Call
    from tests.fakes.gateway_rig import USER, fake_rig, make_config, until

    async def leaky(call: Call) -> AsyncIterator[AgentEvent]:
        text = f"here it is: {SECRET} and done"
        for i in range(0, len(text), 3):
            yield TextDelta(text[i : i + 3])
            await asyncio.sleep(0.03)
        yield Final(text)

    cfg = make_config(
        channels={"telegram": {"enabled": True, "token": SECRET}},
        access={"allow_users": [str(USER)]},
        delivery={"first_edit_delay": 0.05},
    )
    channel = FakeChannel(drafts=True, buttons=True)
    async with fake_rig(tmp_path, cfg, channel=channel) as rig:
        rig.harness.on("leak", leaky)
        msg = channel.message(USER, "leak")
        await channel.deliver(msg)
        await until(lambda: channel.replies_to(msg.message_id) == ["here it is: *** and done"], what="final")
        shown = [t for m in channel.sent for t in m.texts] + [p.text for p in channel.platform.previews]
        assert len(shown) > 2 and not [t for t in shown if SECRET[:6] in t], shown

        target = msg.target
        await channel.send_file(target, OutFile(f"{SECRET}.txt", f"k={SECRET}".encode()), f"c {SECRET}",
                                idempotency_key="f")  # fmt: skip
        sent_file = channel.files[-1]
        assert sent_file.file is not None and sent_file.file.name == "***.txt"
        assert SECRET.encode() not in sent_file.file.data and sent_file.text == "c ***"
        mid = await channel.send_buttons(
            target, Rendered(f"ok {SECRET}?"), [Button(f"yes {SECRET}", f"v:{SECRET}")], idempotency_key="b"
        )
        (button,) = channel.platform.messages[mid].buttons
        assert (button.label, button.value, channel.platform.messages[mid].text) == (
            "yes ***",
            "v:***",
            "ok ***?",
        )

        async def answer(action: Action) -> ActionAnswer:
            return ActionAnswer(f"done with {SECRET}")

        channel.on_action(answer)
        assert (await channel.hand_action(Action("telegram", "1", "2", "v"))).text == "done with ***"


async def test_readyz_metrics_and_the_status_socket_are_masked(tmp_path: Path) -> None:
    import aiohttp
    from aiohttp.test_utils import TestClient, TestServer

    from agent.redact import Redactor
    from gateway.cli.status import fetch_status
    from gateway.daemon.status import StatusServer
    from gateway.ops.http import build_app
    from gateway.ops.metrics import Metrics

    class Leaky:
        def readiness(self) -> dict[str, object]:
            return {"ready": False, "why": [f"channel x: failed (401 for /bot{SECRET}/getMe)"]}

    metrics = Metrics()
    metrics.tokens.labels(f"model-{SECRET}", "prompt").inc()
    async with TestClient(TestServer(build_app(Leaky(), metrics, Redactor([SECRET])))) as client:
        readyz = await (await client.get("/readyz")).text()
        scraped = await (await client.get("/metrics")).text()
    assert "***" in readyz and "***" in scraped and SECRET not in readyz + scraped

    async def snapshot() -> dict[str, object]:
        return {"errors": [{"message": f"boom {SECRET}"}], "why": [quote(SECRET, safe="")]}

    server = StatusServer(tmp_path / "status.sock", snapshot, Redactor([SECRET]))
    await server.start()
    try:
        body = await fetch_status(tmp_path / "status.sock", 10)
    finally:
        await server.close()
    assert "***" in json.dumps(body) and not leaks(json.dumps(body), [SECRET])
    assert aiohttp  # the client the CLI uses


async def test_sub_agent_tool_results_are_masked() -> None:
    """A sub-agent's tool results go to the model provider in its own requests: masked there too,
    a Command's messages included."""
    from langchain_core.messages import ToolMessage
    from langgraph.types import Command

    from agent.safety import RedactToolResults

    middleware = RedactToolResults([SECRET])
    plain = ToolMessage(f"out {SECRET}", tool_call_id="1")
    failed = ToolMessage(f"password: hunter22 {SECRET}", tool_call_id="2", status="error")
    command = Command(update={"messages": [ToolMessage(f"wrote {SECRET}", tool_call_id="3")], "files": {}})

    async def run(result: Any) -> Any:
        async def handler(_: Any) -> Any:
            return result

        return await middleware.awrap_tool_call(None, handler)  # type: ignore[arg-type]

    assert (await run(plain)).content == "out ***"
    assert (await run(failed)).content == "password: *** ***"
    masked = await run(command)
    assert masked.update["messages"][0].content == "wrote ***" and "files" in masked.update
