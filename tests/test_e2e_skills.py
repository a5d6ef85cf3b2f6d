"""Skills that grow, through the real daemon on the Telegram and Slack fakes and through the CLI:
an admin installs a skill by sending its archive with ``/skills install``; a non-admin is refused;
a malicious archive is refused with nothing written; ``/skills`` shows source, state and installer
with the untrusted text escaped; the installed skill is usable at once (the fake model receives its
body); ``chital skills install|list|remove`` act on the same folder and a running daemon picks the
change up without a restart."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon import DaemonProcess, chat_config, run_chital, started_daemon
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall
from tests.fakes.slack_server import FakeSlack
from tests.fakes.telegram_server import FakeTelegram
from tests.skill_archives import Entry, good_entries, make_tar_gz, make_zip, skill_md

ADMIN, USER = 7001, 7002
SLACK_ADMIN, SLACK_USER, SLACK_DM, SLACK_DM2 = "U_ADMIN", "U_USER", "D_ADMIN", "D_USER"
BODY = "HOUSE-STYLE-BODY-MARKER: write in short sentences."


def config(tmp_path: Path, model: FakeOpenAI, *fakes: Any) -> dict[str, Any]:
    cfg = chat_config(
        tmp_path,
        model.base_url,
        *fakes,
        allow=[f"telegram:{ADMIN}", f"telegram:{USER}", f"slack:{SLACK_ADMIN}", f"slack:{SLACK_USER}"],
        access={"admins": [f"telegram:{ADMIN}", f"slack:{SLACK_ADMIN}"]},
    )
    cfg["agent"]["skills"] = {"custom_dir": str(tmp_path / "custom"), "reload_seconds": 0}
    return cfg


def custom(tmp_path: Path) -> list[str]:
    root = tmp_path / "custom"
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


async def tg_answer(tg: FakeTelegram, chat: int, update: dict[str, Any], needle: str) -> str:
    mid = update["message"]["message_id"]

    def check() -> str | None:
        return next((m.text for m in tg.bot_messages(chat) if m.reply_to == mid and needle in m.text), None)

    return await tg.wait_for(check, timeout=30, what=f"a reply with {needle!r}")


@pytest.fixture
async def tg_daemon(tmp_path: Path, model: FakeOpenAI, tg: FakeTelegram) -> AsyncIterator[DaemonProcess]:
    async with started_daemon(tmp_path, config(tmp_path, model, tg)) as d:
        yield d


async def test_telegram_admin_installs_from_a_file_and_everyone_can_use_it(
    tmp_path: Path, model: FakeOpenAI, tg: FakeTelegram, tg_daemon: DaemonProcess
) -> None:
    good = make_zip(
        [
            Entry("house-style/SKILL.md", skill_md("house-style", "Write in the house style.", BODY)),
            Entry("house-style/scripts/lint.sh", b"#!/bin/sh\n", mode=0o755),
        ]
    )
    # A non-admin's archive is refused, and nothing is written.
    up = tg.inject_message(USER, USER, "/skills install", document=tg.add_file(good, file_name="h.zip"))
    assert "only an admin" in await tg_answer(tg, USER, up, "admin")
    assert custom(tmp_path) == []
    # A malicious archive from the admin: refused with the reason, nothing written.
    evil = make_zip([Entry("SKILL.md", skill_md("evil")), Entry("../../escape.sh", b"x")])
    up = tg.inject_message(ADMIN, ADMIN, "/skills install", document=tg.add_file(evil, file_name="e.zip"))
    assert "'..'" in await tg_answer(tg, ADMIN, up, "⚠️")
    assert custom(tmp_path) == []
    # No file at all: a clear answer.
    up = tg.inject_message(ADMIN, ADMIN, "/skills install")
    assert "caption /skills install" in await tg_answer(tg, ADMIN, up, "archive")
    # The good one: installed, its script listed for review.
    up = tg.inject_message(
        ADMIN, ADMIN, "/skills install", first_name="Ann", document=tg.add_file(good, file_name="h.zip")
    )
    reply = await tg_answer(tg, ADMIN, up, "Installed")
    # (Telegram shows the code spans as code entities: the text has no backticks.)
    assert "the skill house-style" in reply and "scripts/lint.sh" in reply and "/house_style" in reply
    assert custom(tmp_path) == ["house-style"]
    # Everyone sees it, with its source, state and installer.
    up = tg.inject_message(USER, USER, "/skills")
    listing = await tg_answer(tg, USER, up, "Skills")
    assert (
        f"/house_style — Write in the house style. · custom, active, installed by telegram:{ADMIN} (Ann)"
        in listing
    )
    assert "/deep_research — " in listing and "· public, active" in listing
    # ...and can use it at once: the model gets its body.
    up = tg.inject_message(USER, USER, "/house_style draft the memo")
    await tg_answer(tg, USER, up, "")
    assert any(BODY in str(r) for r in model.requests), "the skill's body reached the model"
    # A non-admin cannot remove it; the admin can.
    up = tg.inject_message(USER, USER, "/skills remove house-style")
    assert "only an admin" in await tg_answer(tg, USER, up, "admin")
    up = tg.inject_message(ADMIN, ADMIN, "/skills remove house-style")
    assert "Removed the custom skill house-style" in await tg_answer(tg, ADMIN, up, "Removed")
    assert custom(tmp_path) == []


async def test_slack_admin_installs_and_untrusted_text_is_escaped(
    tmp_path: Path, model: FakeOpenAI, slack: FakeSlack
) -> None:
    description = "Ping <!channel> [click](https://evil.example) \u202eexe.txt"
    archive = make_tar_gz(
        [Entry("SKILL.md", skill_md("team-notes", description, "NOTES-BODY")), Entry("run.py", b"print(1)")]
    )
    async with started_daemon(tmp_path, config(tmp_path, model, slack), slack):
        await slack.inject_dm(SLACK_DM2, SLACK_USER, "/skills install",
                              files=[slack.add_file("n.tar.gz", archive, "application/gzip")])  # fmt: skip
        await slack.wait_for(lambda: [t for t in slack.texts(SLACK_DM2) if "only an admin" in t], timeout=30)
        assert custom(tmp_path) == []
        await slack.inject_dm(SLACK_DM, SLACK_ADMIN, "/skills install",
                              files=[slack.add_file("n.tar.gz", archive, "application/gzip")])  # fmt: skip
        reply = await slack.wait_for(
            lambda: next((t for t in slack.texts(SLACK_DM) if "Installed" in t), None), timeout=30
        )
        assert "`run.py`" in reply  # code by its suffix is listed for review
        assert custom(tmp_path) == ["team-notes"]
        await slack.inject_dm(SLACK_DM2, SLACK_USER, "/skills")
        listing = await slack.wait_for(
            lambda: next((t for t in slack.texts(SLACK_DM2) if "team_notes" in t), None), timeout=30
        )
        line = next(t for t in listing.splitlines() if "team_notes" in t)
        assert "\u202e" not in line  # no bidi override reaches the chat
        assert "<!channel>" not in line  # no @channel ping in the bot's voice
        assert "`Ping " in line  # the description is one code span: no live link either
        assert f"installed by `slack:{SLACK_ADMIN}" in line


async def test_cli_install_is_picked_up_by_a_running_daemon(
    tmp_path: Path, model: FakeOpenAI, tg: FakeTelegram, tg_daemon: DaemonProcess
) -> None:
    archive = tmp_path / "house.zip"
    entries = good_entries()
    entries[0] = Entry("house-style/SKILL.md", skill_md("house-style", "House.", BODY))
    archive.write_bytes(make_zip(entries))
    cfg = str(tg_daemon.config_path)
    done = await run_chital("skills", "install", str(archive), "-c", cfg)
    assert done.code == 0, done.out
    assert "installed house-style" in done.out and "scripts/run.sh" in done.out and "tool.bin" in done.out
    again = await run_chital("skills", "install", str(archive), "-c", cfg)
    assert again.code == 1 and "installed already" in again.out
    listed = await run_chital("skills", "list", "-c", cfg)
    assert "house-style  [custom, active] by cli:" in listed.out
    assert "deep-research  [public, active]" in listed.out
    # The daemon, started before, offers it without a restart.
    up = tg.inject_message(USER, USER, "/house_style go")
    await tg_answer(tg, USER, up, "")
    assert any(BODY in str(r) for r in model.requests)
    gone = await run_chital("skills", "remove", "house-style", "-c", cfg)
    assert gone.code == 0 and "removed the custom skill house-style" in gone.out
    up = tg.inject_message(USER, USER, "/skills")
    assert "house_style" not in await tg_answer(tg, USER, up, "Skills")
    refused = await run_chital("skills", "remove", "deep-research", "-c", cfg)
    assert refused.code == 1 and "skills.disabled" in refused.out


async def test_cli_refuses_a_malicious_archive_and_an_internal_url(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text(f"agent:\n  skills:\n    custom_dir: {tmp_path / 'custom'}\n")
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(
        make_tar_gz([Entry("SKILL.md", skill_md("x")), Entry("link", kind="symlink", target="/etc")])
    )
    cfg = str(tmp_path / "config.yaml")
    done = await run_chital("skills", "install", str(bad), "-c", cfg)
    assert done.code == 1 and "only regular files and folders" in done.out
    url = await run_chital("skills", "install", "http://user:s3cret@127.0.0.1:9/x.zip", "-c", cfg)
    assert url.code == 1 and "refused" in url.out and "s3cret" not in url.out
    assert not (tmp_path / "custom").exists() or custom(tmp_path) == []


async def test_a_drafted_skill_waits_for_an_admin(
    tmp_path: Path, model: FakeOpenAI, tg: FakeTelegram, tg_daemon: DaemonProcess
) -> None:
    body = "DRAFT-BODY-MARKER: 1. fetch the numbers 2. chart them"
    model.script(
        Reply(
            tool_calls=[
                ToolCall(
                    "draft_skill", {"name": "weekly-chart", "description": "Weekly chart.", "body": body}
                )
            ]
        ),
        Reply(text="I drafted it; an admin must approve it."),
    )
    up = tg.inject_message(USER, USER, "remember how we did this as a skill")
    await tg_answer(tg, USER, up, "approve")
    tool_result = str(model.requests[-1])
    assert "NOT usable yet" in tool_result
    assert custom(tmp_path) == [".drafts"]  # not among the skills the catalog reads
    # Not offered to the model, not usable as /weekly_chart.
    up = tg.inject_message(USER, USER, "hello")
    await tg_answer(tg, USER, up, "")
    system = str(model.requests[-1]["messages"][0]["content"])
    assert "deep-research" in system and "weekly-chart" not in system  # not in the skills listing
    up = tg.inject_message(USER, USER, "/skills")
    listing = await tg_answer(tg, USER, up, "Skills")
    assert "weekly-chart — Weekly chart. · drafted, awaiting approval" in listing
    assert "the agent (asked by telegram:" in listing
    # A user cannot approve it (nor read it through /skills show); the admin reads the full text, then approves.
    up = tg.inject_message(USER, USER, "/skills approve weekly-chart")
    assert "only an admin" in await tg_answer(tg, USER, up, "admin")
    up = tg.inject_message(ADMIN, ADMIN, "/skills show weekly-chart")
    shown = await tg_answer(tg, ADMIN, up, "Draft")
    assert body in shown and "/skills approve weekly-chart" in shown
    # Approve / Reject buttons, as for a tool's approval: a non-admin's press and a replay are refused.
    buttons = await tg.wait_for(
        lambda: next((m for m in tg.bot_messages(ADMIN) if "Approve the draft skill" in m.text), None),
        timeout=30,
        what="the approval buttons",
    )
    press = tg.press_button(ADMIN, buttons.message_id, USER, "Approve")
    qid = press["callback_query"]["id"]
    answer = await tg.wait_for(lambda: tg.answered_queries.get(qid), timeout=30, what="the refusal")
    assert "Only an admin" in str(answer)
    assert custom(tmp_path) == [".drafts"]
    press = tg.press_button(ADMIN, buttons.message_id, ADMIN, "Approve")
    qid = press["callback_query"]["id"]
    answer = await tg.wait_for(lambda: tg.answered_queries.get(qid), timeout=30, what="the approval")
    assert "everyone can use it" in str(answer)
    await tg.wait_for(
        lambda: (
            any(
                m.message_id == buttons.message_id and "everyone can use it" in m.text
                for m in tg.bot_messages(ADMIN)
            )
            or None
        ),
        timeout=30,
        what="the closed buttons",
    )
    assert "weekly-chart" in custom(tmp_path)
    stale = dict(press["callback_query"], id="Q-stale", data="skl:no:weekly-chart")  # an old client's press
    tg.push_update({"callback_query": stale})
    qid = "Q-stale"
    answer = await tg.wait_for(lambda: tg.answered_queries.get(qid), timeout=30, what="the replay's answer")
    assert "already approved or rejected" in str(answer)
    assert "weekly-chart" in custom(tmp_path)
    up = tg.inject_message(USER, USER, "/weekly_chart this week")
    await tg_answer(tg, USER, up, "")
    assert "**weekly-chart**" in str(model.requests[-1]["messages"][0]["content"])
    assert str(model.requests[-1]).count(body) >= 2  # the body, loaded for the turn, besides the old call


async def test_slack_draft_approved_with_the_button_by_an_admin_only(
    tmp_path: Path, model: FakeOpenAI, slack: FakeSlack
) -> None:
    model.script(
        Reply(tool_calls=[ToolCall("draft_skill", {"name": "standup", "description": "Standup <!here> notes.",
                                                   "body": "STANDUP-BODY [login](https://evil.example)"})]),
        Reply(text="Drafted; an admin must approve it."),
    )  # fmt: skip
    async with started_daemon(tmp_path, config(tmp_path, model, slack), slack):
        await slack.inject_dm(SLACK_DM2, SLACK_USER, "remember this as a skill")
        await slack.wait_for(
            lambda: [t for t in slack.texts(SLACK_DM2) if "admin must approve" in t], timeout=30
        )
        await slack.inject_dm(SLACK_DM, SLACK_ADMIN, "/skills show standup")
        shown = await slack.wait_for(
            lambda: next((t for t in slack.texts(SLACK_DM) if "STANDUP-BODY" in t), None), timeout=30
        )
        assert "```" in shown and "<!here>" not in shown  # one fenced block, no @here
        post = await slack.wait_for(
            lambda: next((p for p in slack.posts if p.buttons() and p.channel == SLACK_DM), None), timeout=30
        )  # (the draft's notice to the admin has buttons too: tests/test_e2e_skill_drafts.py)
        assert post.buttons() == ["✅ Approve", "🗑 Reject"]
        stranger = await slack.press_button(SLACK_DM, post.ts, SLACK_USER, "Approve", name="mallory")
        await slack.wait_for(lambda: slack.is_acked(stranger) or None, timeout=10)
        note = await slack.wait_for(lambda: next(iter(slack.ephemerals), None), timeout=10)
        assert "Only an admin" in note["text"] and custom(tmp_path) == [".drafts"]
        press = await slack.press_button(SLACK_DM, post.ts, SLACK_ADMIN, "Approve", name="boss")
        await slack.wait_for(lambda: slack.is_acked(press) or None, timeout=10)
        await slack.wait_for(
            lambda: (not post.buttons() and "everyone can use it" in post.text) or None, timeout=10
        )
        assert "by `boss`" in post.text or "boss" in post.text
        assert "standup" in custom(tmp_path)
        again = await slack.press_button(
            SLACK_DM, post.ts, SLACK_ADMIN, "Reject", name="boss"
        )  # a stale client
        await slack.wait_for(lambda: slack.is_acked(again) or None, timeout=10)
        await slack.wait_for(lambda: len(slack.ephemerals) >= 2 or None, timeout=10)
        assert "already approved or rejected" in slack.ephemerals[-1]["text"]
        assert "standup" in custom(tmp_path)
        await slack.inject_dm(SLACK_DM2, SLACK_USER, "/skills")
        listing = await slack.wait_for(
            lambda: next((t for t in slack.texts(SLACK_DM2) if "/standup" in t), None), timeout=30
        )
        assert "drafted, active" in listing


async def test_telegram_install_as_a_reply_to_the_archive(
    tmp_path: Path, model: FakeOpenAI, tg: FakeTelegram, tg_daemon: DaemonProcess
) -> None:
    """``/skills install`` replying to the message that carries the archive (Telegram's reply event
    carries the replied-to file): installed for an admin with the file's sender on record; refused
    for a non-admin, for a file a bot sent, and for a malicious archive (nothing written)."""
    good = make_zip([Entry("SKILL.md", skill_md("replied-skill", "From a reply.", BODY))])
    sent = tg.inject_message(USER, USER, "", document=tg.add_file(good, file_name="r.zip"))
    up = tg.inject_message(USER, USER, "/skills install", reply_to_message_id=sent["message"]["message_id"])
    assert "only an admin" in await tg_answer(tg, USER, up, "admin")
    # A file a bot sent (the agent's own output, or another bot's): drafted and reviewed, not installed.
    botfile = tg.inject_message(ADMIN, 4242, "", document=tg.add_file(good, file_name="b.zip"), from_bot=True)
    up = tg.inject_message(
        ADMIN, ADMIN, "/skills install", reply_to_message_id=botfile["message"]["message_id"]
    )
    assert "sent by a bot" in await tg_answer(tg, ADMIN, up, "⚠️")
    evil = make_zip([Entry("SKILL.md", skill_md("evil")), Entry("/etc/cron.d/x", b"x")])
    bad = tg.inject_message(ADMIN, ADMIN, "", document=tg.add_file(evil, file_name="e.zip"))
    up = tg.inject_message(ADMIN, ADMIN, "/skills install", reply_to_message_id=bad["message"]["message_id"])
    assert "absolute" in await tg_answer(tg, ADMIN, up, "⚠️")
    assert custom(tmp_path) == []
    # The admin replies to the archive they (or anyone in the chat) sent: installed.
    doc = tg.inject_message(ADMIN, ADMIN, "", document=tg.add_file(good, file_name="r.zip"))
    up = tg.inject_message(ADMIN, ADMIN, "/skills install", reply_to_message_id=doc["message"]["message_id"])
    assert "Installed the skill replied-skill" in await tg_answer(tg, ADMIN, up, "Installed")
    assert custom(tmp_path) == ["replied-skill"]
    origin = (tmp_path / "custom" / "replied-skill" / ".chital-install.json").read_text()
    assert f"replied to; sent by telegram:{ADMIN}" in origin and "r.zip" in origin
