"""Standing permissions in process, at the moments the e2e test cannot put a daemon in on cue
(docs/approvals.md, "Standing permissions"): a call after untrusted content, forged and stale
presses, the setting that turns them off, a listing of hostile names. Real Gateway, Approvals and
Store; a FakeChannel with buttons and a scripted FakeHarness."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

from agent.events import AgentEvent, ApprovalRequested, ToolProgress
from agent.provenance import TOOL, WEB_PAGE, Source
from channels.base import Action
from tests.approvals_support import CALL, OTHER, buttoned, config
from tests.fakes.fake_channel import FakeChannel, Message
from tests.fakes.fake_harness import Call
from tests.fakes.gateway_rig import ADMIN, USER, Rig, fake_rig, make_config, until


def asked(channel: FakeChannel) -> list[Message]:
    """Every request posted with buttons (pressed or not)."""
    return [m for m in channel.sent if m.offered]


def asking(event: ApprovalRequested) -> object:
    async def script(call: Call) -> AsyncIterator[AgentEvent]:
        yield ToolProgress(event.tool, "start")
        yield dataclasses.replace(event, id=f"intr-{call.message_id}")

    return script


async def allow_here(rig: Rig) -> str:
    """USER asks once and answers Allow here; the conversation's key."""
    ch = rig.channel
    rig.harness.on("first", asking(CALL))  # type: ignore[arg-type]
    first = ch.message(USER, "first", name="Alice")
    await ch.deliver(first)
    request = await until(lambda: buttoned(ch), what="the buttons")
    answer = await ch.press(request.message_id, "Allow here", USER, "Alice")
    assert not answer.refused and "without asking" in answer.text
    await until(lambda: ch.replies_to(first.message_id)[:1] == ["resumed: approved"], what="resumed")
    return first.conversation


async def test_a_permission_never_covers_a_call_after_content_others_wrote(tmp_path: Path) -> None:
    async with fake_rig(tmp_path, config(), channel=FakeChannel(buttons=True)) as rig:
        ch = rig.channel
        await allow_here(rig)
        # Only the gated tool's own output came before: covered, no one asked.
        own = dataclasses.replace(
            CALL, untrusted="the output of the tool execute", sources=(Source(TOOL, "execute"),)
        )
        rig.harness.on("again", asking(own))  # type: ignore[arg-type]
        again = ch.message(USER, "again", name="Alice")
        await ch.deliver(again)
        await until(lambda: ch.replies_to(again.message_id)[:1] == ["resumed: approved"], what="ran")
        assert len(asked(ch)) == 1, "asked only the first time"
        # A web page came before: asked, with Approve / Deny only.
        page = dataclasses.replace(
            CALL,
            untrusted="the web page https://evil.example",
            sources=(Source(WEB_PAGE, "https://evil.example"),),
        )
        rig.harness.on("after the page", asking(page))  # type: ignore[arg-type]
        await ch.deliver(ch.message(USER, "after the page", name="Alice"))
        await until(lambda: len(asked(ch)) == 2, what="asked")
        request = asked(ch)[-1]
        assert [b.label for b in request.buttons] == ["✅ Approve", "❌ Deny"]
        assert "content you did not write" in request.text and "allow " not in request.text
        # Sources said but not given (the state was unreadable): asked too.
        vague = dataclasses.replace(CALL, untrusted="something", sources=())
        rig.harness.on("vague", asking(vague))  # type: ignore[arg-type]
        await ch.deliver(ch.message(USER, "vague", name="Alice"))
        await until(lambda: len(asked(ch)) == 3, what="asked again")


async def test_another_persons_call_in_the_same_chat_still_asks(tmp_path: Path) -> None:
    """Allow here covers the person who gave it: in a group, another member's call asks."""
    cfg = make_config(
        access={"admins": [str(ADMIN)], "allow_users": [str(USER), str(OTHER)], "group_policy": "mention"},
        delivery={"first_edit_delay": 0.0},
        agent={"approvals": {"tools": ["execute"], "timeout": 600}},
    )
    async with fake_rig(tmp_path, cfg, channel=FakeChannel(buttons=True)) as rig:
        ch = rig.channel
        rig.harness.on("run", asking(CALL))  # type: ignore[arg-type]
        await ch.deliver(ch.message(USER, "run", chat="-42", addressed=True, name="Alice"))
        request = await until(lambda: buttoned(ch), what="asked")
        await ch.press(request.message_id, "Allow here", USER, "Alice")
        await until(lambda: rig.harness.resumed, what="resumed")
        await ch.deliver(ch.message(OTHER, "run", chat="-42", addressed=True, name="Bob"))
        await until(lambda: len(asked(ch)) == 2, what="Bob is asked")
        await ch.deliver(ch.message(USER, "run", chat="-42", addressed=True, name="Alice"))
        await until(lambda: len(rig.harness.resumed) == 2, what="Alice's runs")
        assert len(asked(ch)) == 2


async def test_forged_and_stale_presses_change_nothing(tmp_path: Path) -> None:
    async with fake_rig(tmp_path, config(), channel=FakeChannel(buttons=True)) as rig:
        ch = rig.channel
        rig.harness.on("run", asking(CALL))  # type: ignore[arg-type]
        asked = ch.message(USER, "run", name="Alice")
        await ch.deliver(asked)
        request = await until(lambda: buttoned(ch), what="asked")
        code = request.buttons[0].value.split(":")[2]

        async def press(value: str, user: int | str = USER) -> str:
            answer = await ch.hand_action(
                Action(ch.name, str(USER), str(user), value, request.message_id, "X")
            )
            assert answer.refused, (value, answer.text)
            return answer.text

        assert "not mine" in await press(f"appr:forever:{code}")
        assert "not mine" in await press(f"appr:here:{code}:extra")
        assert "no longer exists" in await press("appr:always:ZZZZZZZZ")
        assert "Not yours" in await press(f"appr:here:{code}", OTHER)
        assert "Only an admin" in await press(f"appr:always:{code}")
        assert not await rig.store.grants_visible(ch.name, asked.conversation, 10)
        await ch.press(request.message_id, "Deny", USER, "Alice")
        assert "Already settled" in await press(f"appr:here:{code}")
        assert "Already settled" in await press(f"appr:always:{code}", ADMIN)
        assert not await rig.store.grants_visible(ch.name, asked.conversation, 10), (
            "a stale press grants nothing"
        )


async def test_standing_off_offers_approve_and_deny_only(tmp_path: Path) -> None:
    cfg = config()
    cfg.agent.approvals.standing = False
    async with fake_rig(tmp_path, cfg, channel=FakeChannel(buttons=True)) as rig:
        ch = rig.channel
        rig.harness.on("run", asking(CALL))  # type: ignore[arg-type]
        await ch.deliver(ch.message(USER, "run", name="Alice"))
        request = await until(lambda: buttoned(ch), what="asked")
        assert [b.label for b in request.buttons] == ["✅ Approve", "❌ Deny"]
        code = request.buttons[0].value.split(":")[2]
        action = Action(ch.name, str(USER), str(ADMIN), f"appr:always:{code}", request.message_id, "Ann")
        answer = await ch.hand_action(action)
        assert answer.refused and "off on this bot" in answer.text


async def test_the_listing_shows_hostile_names_inert(tmp_path: Path) -> None:
    async with fake_rig(tmp_path, config(), channel=FakeChannel(buttons=True)) as rig:
        ch = rig.channel
        conversation = await allow_here(rig)
        hostile = "Eve\u202e <@U1> [x](https://evil.example) `"
        await rig.store.grant_add("execute", ch.name, "", "", f"{ch.name}:{ADMIN}", hostile, "")
        listing = ch.message(USER, "/approvals")
        await ch.deliver(listing)
        (text,) = await until(lambda: ch.replies_to(listing.message_id), what="the listing")
        assert "#1" in text and conversation
        line = next(ln for ln in text.splitlines() if ln.startswith("#2"))
        assert "everyone, everywhere" in line and "\u202e" not in text
        assert "by `Eve" in line and "<@U1>" in line.split("by `", 1)[1], "the name in a code span, inert"
        revoke = ch.message(USER, "/approvals revoke 2")
        await ch.deliver(revoke)
        (refused,) = await until(lambda: ch.replies_to(revoke.message_id), what="refused")
        assert "Not yours" in refused
