"""End to end: `chital run` as a subprocess, its WhatsApp channel talking to a fake Graph API and
taking webhook deliveries the fake signs and posts as Meta does (tests/fakes/whatsapp_server.py).

What is asserted is what a WhatsApp user would get (the messages the Graph API was asked to send),
what the webhook caller was answered (Meta redelivers on non-2xx), and /readyz, /metrics and the
logs for the operator.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.daemon import DaemonProcess, clean_env, run_chital, started_daemon
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall, last_user_text
from tests.fakes.whatsapp_server import BUSINESS_WA_ID, GROUP, FakeWhatsApp, graph_error
from tests.whatsapp_daemon import OWNER, STRANGER, answered, whatsapp_config


@pytest.fixture
async def daemon(tmp_path: Path, whatsapp: FakeWhatsApp, model: FakeOpenAI) -> AsyncIterator[DaemonProcess]:
    async with started_daemon(tmp_path, whatsapp_config(tmp_path, whatsapp, model)) as d:
        await d.wait_channel_state("whatsapp", "connected")
        yield d


async def test_dm_is_answered_as_a_reply(daemon: DaemonProcess, whatsapp: FakeWhatsApp) -> None:
    up = await whatsapp.inject_text(OWNER, "hello there")
    reply = await answered(whatsapp, up, "echo: hello there")
    assert reply.to == OWNER and reply.kind == "text"
    metrics = await daemon.metrics()
    assert 'chital_messages_in_total{channel="whatsapp"} 1.0' in metrics
    assert 'chital_channel_up{channel="whatsapp"} 1.0' in metrics
    logs = daemon.logs()
    assert whatsapp.token not in logs and whatsapp.app_secret not in logs
    assert "/channels/whatsapp/webhook" in logs, "the operator is told where the webhook is"


async def test_verification_handshake(daemon: DaemonProcess, whatsapp: FakeWhatsApp) -> None:
    assert await whatsapp.verify(whatsapp.verify_token, "8675309") == (200, "8675309")
    status, text = await whatsapp.verify("wrong-token", "8675309")
    assert status == 403 and "8675309" not in text
    status, text = await whatsapp.verify(whatsapp.verify_token, "8675309", mode="unsubscribe")
    assert status == 403 and "8675309" not in text
    status, _ = await whatsapp.verify(whatsapp.verify_token[:-1], "1")
    assert status == 403


async def test_stranger_gets_the_pairing_path_only(
    daemon: DaemonProcess, whatsapp: FakeWhatsApp, model: FakeOpenAI
) -> None:
    up = await whatsapp.inject_text(STRANGER, "hello bot, secret question")
    reply = await answered(whatsapp, up, "pairing code")
    assert all("secret question" not in last_user_text(r) for r in model.requests)
    code = re.search(r"pairing code is ([A-Z0-9]{8})", reply.text).group(1)  # type: ignore[union-attr]
    rc, out = await daemon.cli("pairing", "approve", code)
    assert rc == 0 and f"whatsapp:{STRANGER}" in out, out
    await answered(whatsapp, await whatsapp.inject_text(STRANGER, "now may I"), "echo: now may I")


async def test_long_answer_is_one_final_message_split_at_4096(
    daemon: DaemonProcess, whatsapp: FakeWhatsApp
) -> None:
    """No edits on WhatsApp: nothing goes out before the answer is whole, then it goes in parts."""
    up = await whatsapp.inject_text(OWNER, "LONG please")
    parts = await whatsapp.wait_for(
        lambda: (p := whatsapp.replies_to(up["id"])) and len(p) >= 2 and p, what="2+ parts"
    )
    await asyncio.sleep(1)
    parts = whatsapp.to(OWNER)
    assert all(len(p.text) <= 4096 for p in parts) and len(parts) >= 2
    assert "```" in "".join(p.text for p in parts), "code kept as WhatsApp monospace"
    assert not any(p.text == "…" for p in parts), "no placeholder was posted"


async def test_redelivered_webhook_is_answered_once(daemon: DaemonProcess, whatsapp: FakeWhatsApp) -> None:
    up = await whatsapp.inject_text(OWNER, "only once")
    assert await whatsapp.redeliver(up) == 200, "a redelivery is acknowledged (else Meta retries)"
    await answered(whatsapp, up, "echo: only once")
    assert await whatsapp.redeliver(up) == 200
    await answered(whatsapp, await whatsapp.inject_text(OWNER, "next one"), "echo: next one")
    assert len(whatsapp.replies_to(up["id"])) == 1
    assert 'reason="duplicate"' in await daemon.metrics()


@pytest.mark.parametrize("how", ["missing", "wrong secret", "other body", "sha1", "garbage"])
async def test_unsigned_or_badly_signed_delivery_is_refused_and_not_journaled(
    daemon: DaemonProcess, whatsapp: FakeWhatsApp, model: FakeOpenAI, how: str
) -> None:
    msg = whatsapp.message(OWNER, "text", text={"body": "forged order"})
    body = json.dumps(whatsapp.payload(msg)).encode()
    headers = {
        "missing": {},
        "wrong secret": {"X-Hub-Signature-256": whatsapp.sign(body, "not-the-app-secret")},
        "other body": {"X-Hub-Signature-256": whatsapp.sign(body + b" ")},
        "sha1": {"X-Hub-Signature-256": "sha1=" + whatsapp.sign(body)[7:]},
        "garbage": {"X-Hub-Signature-256": "sha256=zz not hex"},
    }[how]
    status, _ = await whatsapp.post(body, headers)
    assert status == (401 if how == "missing" else 403)
    await answered(whatsapp, await whatsapp.inject_text(OWNER, "real one"), "echo: real one")
    assert not whatsapp.replies_to(msg["id"])
    assert all("forged order" not in last_user_text(r) for r in model.requests)
    assert "refused a webhook delivery" in daemon.logs()


async def test_kill9_after_acknowledge_is_answered_once_after_restart(
    daemon: DaemonProcess, whatsapp: FakeWhatsApp, model: FakeOpenAI
) -> None:
    up = await whatsapp.inject_text(OWNER, "SLOW crash test")  # 200: journaled
    await whatsapp.wait_for(
        lambda: any("SLOW crash test" in last_user_text(r) for r in model.requests), what="the turn started"
    )
    daemon.kill9()
    await daemon.wait_exit()
    model.add_rule(lambda t: True, lambda body: Reply(text=f"resumed answer to {last_user_text(body)}"))
    model._rules.insert(0, model._rules.pop())
    await daemon.start()
    await answered(whatsapp, up, "resumed answer to SLOW crash test", timeout=30)
    assert await whatsapp.redeliver(up) == 200  # Meta had its 200 already; a stray repeat changes nothing
    later = await whatsapp.inject_text(OWNER, "after the restart")
    await answered(whatsapp, later, "resumed answer to after the restart")
    assert len(whatsapp.replies_to(up["id"])) == 1, [m.text for m in whatsapp.replies_to(up["id"])]


async def test_sigterm_exits_cleanly(daemon: DaemonProcess, whatsapp: FakeWhatsApp) -> None:
    await answered(whatsapp, await whatsapp.inject_text(OWNER, "hi"), "echo: hi")
    rc = await daemon.terminate()
    assert rc == 0, daemon.logs()
    assert "stopped cleanly" in daemon.logs()


async def test_reply_outside_the_24_hour_window_is_not_retried_and_the_operator_is_told(
    daemon: DaemonProcess, whatsapp: FakeWhatsApp
) -> None:
    whatsapp.outside_window.add(OWNER)
    up = await whatsapp.inject_text(OWNER, "late question")
    info = await daemon.wait_channel_state("whatsapp", "connected")
    for _ in range(200):
        _, body = await daemon.get("/readyz")
        info = body["channels"]["whatsapp"]
        if info.get("notice"):
            break
        await asyncio.sleep(0.05)
    assert "24 hours" in (info.get("notice") or ""), info
    tried = len(whatsapp.refused)
    await asyncio.sleep(3)
    # the answer, and at most the failure notice after it: each refused once, never again
    assert len(whatsapp.refused) == tried <= 2, ("a refused reply is not retried", whatsapp.refused)
    assert "24-hour customer-service window" in daemon.logs()
    code, status = await daemon.cli("status")
    assert code == 0 and "NOTE: " in status and "24 hours ago" in status, status
    assert not whatsapp.replies_to(up["id"])
    assert info["state"] == "connected", "other users are still answered"


async def test_failed_status_131047_is_reported(daemon: DaemonProcess, whatsapp: FakeWhatsApp) -> None:
    """Meta may accept a message and report the window later, as a ``failed`` status."""
    status = {"id": "wamid.HBgLBOT1", "status": "failed", "timestamp": "1", "recipient_id": OWNER,
              "errors": [{"code": 131047, "title": "Re-engagement message"}]}  # fmt: skip
    assert await whatsapp.deliver(whatsapp.payload(statuses=[status])) == 200
    for _ in range(100):
        _, body = await daemon.get("/readyz")
        if body["channels"]["whatsapp"].get("notice"):
            break
        await asyncio.sleep(0.05)
    assert "24 hours" in body["channels"]["whatsapp"]["notice"]


async def test_revoked_token_is_fatal_in_readyz_and_not_retried(
    daemon: DaemonProcess, whatsapp: FakeWhatsApp
) -> None:
    whatsapp.revoke_token()
    await whatsapp.inject_text(OWNER, "are you there")
    info = await daemon.wait_channel_state("whatsapp", "failed", timeout=30)
    assert "access token" in (info.get("reason") or "")
    calls = len(whatsapp.calls)
    await asyncio.sleep(3)
    assert len(whatsapp.calls) == calls, ("a revoked token is not retried", whatsapp.calls)
    msg = whatsapp.message(OWNER, "text", text={"body": "while failed"})
    assert await whatsapp.deliver(whatsapp.payload(msg)) == 503, "Meta keeps it and redelivers later"
    status, body = await daemon.get("/readyz")
    assert status == 503 and whatsapp.token not in str(body)
    assert 'chital_channel_up{channel="whatsapp"} 0.0' in await daemon.metrics()
    assert whatsapp.token not in daemon.logs()


async def test_malformed_unknown_and_oversized_deliveries_are_skipped_and_counted(
    daemon: DaemonProcess, whatsapp: FakeWhatsApp
) -> None:
    bad_text = whatsapp.message(OWNER, "text", text={"body": 12345})
    for payload in (
        b"not json at all",
        b"[1, 2",
        {"object": "whatsapp_business_account", "entry": "nope"},
        {"entry": [{"changes": [{"field": "messages", "value": "x"}]}]},
        whatsapp.payload(
            "a string",
            None,
            {"type": "text"},
            bad_text,
            whatsapp.message(OWNER, "image", image={"caption": "no id"}),
            {**whatsapp.message(OWNER), "id": "w" * 600},
        ),
        whatsapp.payload(whatsapp.message(OWNER, "reaction", reaction={"message_id": "x", "emoji": "👍"})),
        whatsapp.payload(statuses=[{"id": "wamid.X", "status": "read", "recipient_id": OWNER}]),
        whatsapp.payload(whatsapp.message(OWNER, "text", text={"body": "other number"}), number="999"),
    ):
        assert await whatsapp.deliver(payload) == 200, payload  # skipped, never redelivered forever
    status, _ = await whatsapp.post(b"{" + b" " * 4_000_000 + b"}", {"X-Hub-Signature-256": "sha256=00"})
    assert status == 413
    sticker = whatsapp.message(OWNER, "sticker", sticker={"id": "123", "mime_type": "image/webp"})
    assert await whatsapp.deliver(whatsapp.payload(sticker)) == 200
    await answered(whatsapp, sticker, "can't use stickers")
    await answered(whatsapp, bad_text, "couldn't read that message")
    await answered(whatsapp, await whatsapp.inject_text(OWNER, "still fine"), "echo: still fine")
    assert not any("other number" in m.text for m in whatsapp.sent), "another number's message is not ours"
    metrics = await daemon.metrics()
    assert 'chital_malformed_events_total{kind="message",platform="whatsapp"}' in metrics, metrics
    assert 'chital_malformed_events_total{kind="envelope",platform="whatsapp"}' in metrics, metrics
    assert "12345" not in daemon.logs(), "the unreadable payload is not logged"
    _, body = await daemon.get("/readyz")
    assert body["channels"]["whatsapp"]["state"] == "connected"


async def test_graph_5xx_and_rate_limit_on_send_are_retried(
    daemon: DaemonProcess, whatsapp: FakeWhatsApp
) -> None:
    whatsapp.fail_next("messages", graph_error(500, 2, "Service temporarily unavailable", "OAuthException"))
    whatsapp.fail_next("messages", graph_error(400, 130429, "Rate limit hit", "OAuthException"))
    up = await whatsapp.inject_text(OWNER, "despite limits")
    await answered(whatsapp, up, "echo: despite limits", timeout=30)
    assert len(whatsapp.replies_to(up["id"])) == 1


async def test_secrets_never_reach_the_chat(
    daemon: DaemonProcess, whatsapp: FakeWhatsApp, model: FakeOpenAI
) -> None:
    model.add_rule(
        lambda t: "leak" in t,
        Reply(text=f"token {whatsapp.token} secret {whatsapp.app_secret} key sk-test-key-never-logged"),
    )
    model._rules.insert(0, model._rules.pop())
    reply = await answered(whatsapp, await whatsapp.inject_text(OWNER, "leak please"), "token")
    sent = str([m.body for m in whatsapp.sent])
    for secret in (whatsapp.token, whatsapp.app_secret, "sk-test-key-never-logged"):
        assert secret not in sent
    assert "***" in reply.text


async def test_init_writes_whatsapp_settings_and_check_online_reads_the_number(
    tmp_path: Path, whatsapp: FakeWhatsApp, model: FakeOpenAI
) -> None:
    settings = whatsapp.channel_settings()
    env = clean_env() | {"OPENAI_API_KEY": "sk-from-env", "WHATSAPP_PHONE_NUMBER_ID": settings["phone_number_id"],
                         "WHATSAPP_ACCESS_TOKEN": whatsapp.token, "WHATSAPP_APP_SECRET": whatsapp.app_secret,
                         "WHATSAPP_VERIFY_TOKEN": whatsapp.verify_token}  # fmt: skip
    done = await run_chital(
        "init", "--yes", "--channel", "whatsapp", "--model", "fake-model", "--base-url", model.base_url,
        cwd=tmp_path, env=env,
    )  # fmt: skip
    assert done.code == 0, done.out
    config = (tmp_path / "config.yaml").read_text()
    assert "whatsapp:\n    enabled: true" in config and "access_token: $WHATSAPP_ACCESS_TOKEN" in config
    for secret in (whatsapp.token, whatsapp.app_secret, whatsapp.verify_token):
        assert secret not in config and secret not in done.out
    assert f"WHATSAPP_APP_SECRET='{whatsapp.app_secret}'" in (tmp_path / ".env").read_text()
    text = config.replace(
        "whatsapp:\n    enabled: true", f"whatsapp:\n    enabled: true\n    graph_url: {whatsapp.base_url}"
    )
    (tmp_path / "config.yaml").write_text(text)
    done = await run_chital("check", "--online", "-c", str(tmp_path / "config.yaml"), cwd=tmp_path, env=env)
    assert "phone number: +1 555 010 0000" in done.out, done.out
    whatsapp.revoke_token()
    done = await run_chital("check", "--online", "-c", str(tmp_path / "config.yaml"), cwd=tmp_path, env=env)
    assert "Graph error 190" in done.out and whatsapp.token not in done.out, done.out


async def test_file_in_is_downloaded_through_the_media_url(
    daemon: DaemonProcess, whatsapp: FakeWhatsApp, model: FakeOpenAI
) -> None:
    media_id = whatsapp.add_media(b"name,score\nada,3\n", "text/csv")
    up = whatsapp.message(OWNER, "document", document={"id": media_id, "filename": "scores.csv",
                                                        "mime_type": "text/csv", "caption": "look"})  # fmt: skip
    assert await whatsapp.deliver(whatsapp.payload(up)) == 200
    await answered(whatsapp, up, "echo:")
    assert ("GET", f"/media-blob/{media_id}") in whatsapp.calls
    uploaded = list(daemon.sandbox_root.glob("**/uploads/scores.csv"))
    assert uploaded and uploaded[0].read_bytes() == b"name,score\nada,3\n"
    assert any("scores.csv" in last_user_text(r) for r in model.requests), "the agent was told"


async def test_a_hostile_graph_error_text_never_reaches_the_chat(
    daemon: DaemonProcess, whatsapp: FakeWhatsApp
) -> None:
    """A faulty Graph answers the media lookup with an error whose text carries a link, a mention
    and a bidi override: the user is told the file could not be fetched and why in the adapter's
    own words (the Graph code), never Graph's text."""
    media_id = whatsapp.add_media(b"name,score\n")
    hostile = "[Verify your account](https://evil.example/login) @everyone \u202eexe.txt"
    whatsapp.fail_next("media_url", graph_error(400, 100, hostile, "GraphMethodException"))
    up = whatsapp.message(OWNER, "document", document={"id": media_id, "filename": "scores.csv"})
    assert await whatsapp.deliver(whatsapp.payload(up)) == 200
    note = await answered(whatsapp, up, "could not fetch")
    for m in whatsapp.to(OWNER):
        assert "evil.example" not in m.text and "\u202e" not in m.text and "@everyone" not in m.text, m.text
    assert "Graph error 100" in note.text


async def test_oversized_file_is_refused_before_download(
    daemon: DaemonProcess, whatsapp: FakeWhatsApp
) -> None:
    """Graph announces the size with the media URL: it is checked before the bytes are fetched."""
    media_id = whatsapp.add_media(b"x" * 1024)
    whatsapp.lie_about_size[media_id] = 10**10
    up = whatsapp.message(OWNER, "document", document={"id": media_id, "filename": "big.bin"})
    assert await whatsapp.deliver(whatsapp.payload(up)) == 200
    await answered(whatsapp, up, "big.bin")
    assert ("GET", f"/media-blob/{media_id}") not in whatsapp.calls


async def test_file_out_is_uploaded_then_sent_as_a_document(
    daemon: DaemonProcess, whatsapp: FakeWhatsApp, model: FakeOpenAI
) -> None:
    report = "/mnt/user-data/outputs/report.txt"
    model.script(
        Reply(tool_calls=[ToolCall("write_file", {"file_path": report, "content": "all good\n"})]),
        Reply(tool_calls=[ToolCall("present_files", {"paths": [report], "caption": "the report"})]),
        Reply(text="Here it is."),
    )
    up = await whatsapp.inject_text(OWNER, "make the report")
    await answered(whatsapp, up, "Here it is.", timeout=30)
    doc = await whatsapp.wait_for(lambda: next((m for m in whatsapp.to(OWNER) if m.kind == "document"), None))
    media_id = doc.body["document"]["id"]
    assert whatsapp.uploads[media_id][0] == b"all good\n" and doc.body["document"]["filename"] == "report.txt"


async def test_group_answers_replies_commands_and_mentions_only(
    daemon: DaemonProcess, whatsapp: FakeWhatsApp
) -> None:
    """Groups API: a message with ``group_id`` is in the group; the reply goes to the group."""

    async def say(text: str, **fields: object) -> dict[str, object]:
        msg = whatsapp.message(OWNER, "text", text={"body": text}, group_id=GROUP, **fields)
        assert await whatsapp.deliver(whatsapp.payload(msg)) == 200
        return msg

    quiet = await say("just chatting with friends")
    loud = await say(f"@{BUSINESS_WA_ID} what is up")
    reply = await answered(whatsapp, loud, "echo: what is up")
    assert reply.to == GROUP and reply.body["recipient_type"] == "group"
    assert BUSINESS_WA_ID not in reply.text, "the address is stripped before the agent sees the text"
    follow = await say("and more", context={"from": BUSINESS_WA_ID, "id": reply.wamid})
    await answered(whatsapp, follow, "and more")
    await answered(whatsapp, await say("/status"), "")
    assert not whatsapp.replies_to(quiet["id"])
