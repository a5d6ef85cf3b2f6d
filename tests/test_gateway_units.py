"""Unit tests of the gateway's pure parts: config, store, access, commands, splitting, pacing."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from channels.base import Capabilities, Inbound, RetryAfter, TransientSendError
from channels.textsplit import split_markdown
from gateway.commands.builtin import parse_command
from gateway.config.schema import ConfigError, load_config, parse_config
from gateway.config.sections import AccessPolicy
from gateway.delivery.pacing import ChatPacer
from gateway.intake.access import Verdict, decide
from gateway.ops.logs import RedactingFilter
from tests.fakes.gateway_rig import store_at


def msg(
    text: str = "hi",
    *,
    direct: bool = True,
    addressed: bool = True,
    sender: str = "42",
    mid: str = "1",
    chat: str = "42",
    thread: str | None = None,
) -> Inbound:
    return Inbound(
        platform="telegram",
        chat_id=chat,
        message_id=mid,
        sender_id=sender,
        text=text,
        is_direct=direct,
        addressed=addressed,
        thread_id=thread,
    )


# -- config ----------------------------------------------------------------------------------------
def test_config_errors_name_the_field(tmp_path: Path) -> None:
    p = tmp_path / "config.yaml"
    p.write_text("concurrency:\n  max_turns: zero\nchannels:\n  telegram:\n    tokn: abc\n")
    with pytest.raises(ConfigError) as err:
        load_config(p)
    text = str(err.value)
    assert "concurrency.max_turns" in text and "channels.telegram.tokn" in text
    assert "abc" not in text, "values (maybe secrets) are never echoed"


def test_config_yaml_syntax_error_names_the_line(tmp_path: Path) -> None:
    p = tmp_path / "config.yaml"
    p.write_text("models:\n  - name: a\n   use: broken\n")
    with pytest.raises(ConfigError, match="line 3"):
        load_config(p)


def test_env_references(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TG_TOKEN_X", "123:abc")
    monkeypatch.delenv("TG_BASE_UNSET", raising=False)
    cfg = parse_config({"channels": {"telegram": {"token": "$TG_TOKEN_X", "base_url": "$TG_BASE_UNSET"}}})
    assert cfg.channels.telegram.token is not None
    assert cfg.channels.telegram.token.get_secret_value() == "123:abc"
    assert cfg.channels.telegram.base_url == "https://api.telegram.org/bot", "unset → default"
    with pytest.raises(ConfigError, match="models\\[0\\].base_url: environment variable NOPE_X"):
        parse_config({"models": [{"name": "default", "base_url": "http://${NOPE_X}/v1"}]})


def test_agent_model_must_exist() -> None:
    with pytest.raises(ConfigError, match="agent.model"):
        parse_config({"agent": {"model": "missing"}})


def test_shipped_config_is_valid() -> None:
    cfg = load_config(Path(__file__).parent.parent / "config.yaml")
    assert cfg.access.pairing is True and cfg.access.allow_users == []


def test_redaction_masks_secrets() -> None:
    import logging

    record = logging.LogRecord(
        "x", logging.INFO, __file__, 1, "url /bot%s/getMe failed", ("123:SECRETTOKEN",), None
    )
    RedactingFilter(["123:SECRETTOKEN"]).filter(record)
    assert "SECRETTOKEN" not in record.getMessage() and "***" in record.getMessage()


# -- store -----------------------------------------------------------------------------------------
async def test_journal_dedupes_and_survives_reopen(tmp_path: Path) -> None:
    store = await store_at(tmp_path / "g.sqlite")
    assert await store.journal_add(msg("a"), "turn") is True
    assert await store.journal_add(msg("a again, same id"), "turn") is False
    await store.journal_set("telegram:42:1", "running")
    await store.outbox_put("telegram:42:1", 0, "900")
    await store.close()
    store = await store_at(tmp_path / "g.sqlite")
    (entry,) = await store.journal_open()
    assert entry.inbound.text == "a" and entry.state == "running" and entry.attempts == 1
    assert await store.outbox_get("telegram:42:1") == {0: "900"}
    await store.journal_set(entry.key, "done")
    assert await store.journal_open() == []
    await store.close()


async def test_threads_and_pairing(tmp_path: Path) -> None:
    store = await store_at(tmp_path / "g.sqlite")
    t1 = await store.thread_for("telegram:42")
    assert await store.thread_for("telegram:42") == t1
    t2 = await store.new_thread("telegram:42")
    assert t2 != t1 and await store.thread_for("telegram:42") == t2
    code, new = await store.pairing_code_for("telegram:7", "Eve")
    assert new and len(code) == 8
    assert await store.pairing_code_for("telegram:7", "Eve") == (code, False)
    assert await store.pairing_approve("WRONG") is None
    assert await store.pairing_approve(code.lower()) == "telegram:7"
    assert await store.is_approved("telegram:7")
    assert await store.revoke("telegram:7") and not await store.is_approved("telegram:7")
    await store.close()


# -- access ----------------------------------------------------------------------------------------
async def test_access_deny_by_default(tmp_path: Path) -> None:
    store = await store_at(tmp_path / "g.sqlite")
    policy = AccessPolicy(allow_users=["1"], allow_chats=[], group_policy="mention")
    assert (await decide(msg(sender="1"), policy, store, False)).verdict is Verdict.ALLOW
    assert (await decide(msg(sender="2"), policy, store, False)).verdict is Verdict.PAIR
    no_pair = AccessPolicy(pairing=False)
    assert (await decide(msg(sender="2"), no_pair, store, False)).verdict is Verdict.DENY
    group = msg(sender="1", direct=False, addressed=False, chat="-5")
    assert (await decide(group, policy, store, False)).verdict is Verdict.IGNORE
    assert (await decide(group, policy, store, True)).verdict is Verdict.ALLOW, "engaged thread"
    stranger = msg(sender="9", direct=False, addressed=True, chat="-5")
    assert (await decide(stranger, policy, store, False)).verdict is Verdict.DENY
    open_chat = AccessPolicy(allow_chats=["-5"])
    assert (await decide(stranger, open_chat, store, False)).verdict is Verdict.ALLOW
    free = AccessPolicy(allow_users=["1"], free_response_chats=["telegram:-5"])
    assert (await decide(group, free, store, False)).verdict is Verdict.ALLOW
    off = AccessPolicy(allow_users=["1"], group_policy="off")
    assert (
        await decide(msg(sender="1", direct=False, chat="-5"), off, store, False)
    ).verdict is Verdict.IGNORE
    await store.close()


# -- commands --------------------------------------------------------------------------------------
def test_parse_command() -> None:
    assert parse_command("/new").name == "new"  # type: ignore[union-attr]
    c = parse_command("/Status@chital_bot  now")
    assert c is not None and c.name == "status" and c.args == "now" and c.known
    assert parse_command("/usr/bin/env python?") is None
    assert parse_command("hello /new") is None
    unknown = parse_command("/frob x")
    assert unknown is not None and not unknown.known


# -- splitting -------------------------------------------------------------------------------------
def test_split_markdown_keeps_code_blocks_balanced() -> None:
    code = "\n".join(f"    line_{i} = {i} * 2  # comment" for i in range(300))
    text = "Intro paragraph.\n\n```python\n" + code + "\n```\n\nOutro " + "word " * 600
    parts = split_markdown(text, 2000)
    assert len(parts) > 3
    for part in parts:
        assert len(part) <= 2000
        assert part.count("```") % 2 == 0, part[:80]
    assert parts[1].startswith("```python"), "a cut block re-opens with its language"
    assert split_markdown("   ", 2000) == []
    assert split_markdown("short", 2000) == ["short"]
    assert all(len(p) <= 100 for p in split_markdown("y" * 1000, 100))


# -- pacing ----------------------------------------------------------------------------------------
async def test_pacer_obeys_retry_after_and_retries_transient() -> None:
    hits: list[int] = []
    pacer = ChatPacer(
        Capabilities(max_message_len=100, edit_interval=0.0), on_rate_limited=lambda: hits.append(1)
    )
    calls = 0

    async def op() -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RetryAfter(0.2)
        if calls == 2:
            raise TransientSendError("502")
        return "ok"

    loop = asyncio.get_running_loop()
    t0 = loop.time()
    assert await pacer.call(op, is_send=True) == "ok"
    assert loop.time() - t0 >= 0.2 and calls == 3 and hits == [1]


def test_backoff_is_capped_jittered_and_resets() -> None:
    from gateway.ops.supervisor import Backoff

    b = Backoff(base=1.0, cap=8.0, stable_after=60.0)
    delays = [b.next_delay(ran_for=0.1) for _ in range(8)]
    assert 0.5 <= delays[0] <= 1.0 and 1.0 <= delays[1] <= 2.0
    assert all(d <= 8.0 for d in delays) and delays[-1] >= 4.0, "capped at 8 s, equal jitter"
    assert b.next_delay(ran_for=120.0) <= 1.0, "a stable run starts the backoff over"


def test_per_channel_access_overrides_the_default(tmp_path: Path) -> None:
    cfg = parse_config(
        {
            "access": {"allow_users": ["1"]},
            "channels": {"slack": {"access": {"allow_users": ["U9"], "group_policy": "free"}}},
        }
    )
    assert cfg.access_for("telegram").allow_users == ["1"]
    assert cfg.access_for("slack").allow_users == ["U9"] and cfg.access_for("slack").group_policy == "free"


def test_relative_paths_are_beside_the_config_file(tmp_path: Path) -> None:
    p = tmp_path / "conf" / "config.yaml"
    p.parent.mkdir()
    p.write_text("storage:\n  path: state\nagent:\n  skills:\n    custom_dir: my-skills\n")
    cfg = load_config(p)
    assert cfg.storage.path == (p.parent / "state").resolve()
    assert cfg.agent.skills.custom_dir == (p.parent / "my-skills").resolve()
