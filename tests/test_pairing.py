"""Pairing and admin commands through the real Gateway and Store (in process), and `/new` resumed
after a crash. The platform side is a recording Channel; the agent a tiny fake harness."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from gateway.commands import builtin as commands
from gateway.intake import access
from gateway.intake.access import GUESS_SPACE
from gateway.store.access import PAIRING_ALPHABET, PAIRING_CODE_LEN
from gateway.store.entries import JournalEntry, JournalKind
from tests.fakes.gateway_rig import (
    FakeHarness,
    close_gateway,
    dm,
    make_config,
    make_gateway,
    quiet,
    store_at,
    until,
)

ADMIN = 100
MEMBER = 200  # allowed, not an admin
STRANGER = 7
CODE = re.compile(r"pairing code is ([A-Z0-9]{8})")


def team_config(**access_extra: object):  # type: ignore[no-untyped-def]
    return make_config(
        access={"admins": [str(ADMIN)], "allow_users": [str(MEMBER)], "pairing": True, **access_extra}
    )


def code_in(text: str) -> str:
    m = CODE.search(text)
    assert m, text
    return m.group(1)


def test_guess_space_is_2_to_the_40() -> None:
    assert len(PAIRING_ALPHABET) == 32 and PAIRING_CODE_LEN == 8
    assert GUESS_SPACE == 2**40
    assert not set("01IO") & set(PAIRING_ALPHABET), "no look-alike symbols"


async def test_code_expires_and_a_new_request_gets_a_new_code(tmp_path: Path) -> None:
    gw, ch, harness = await make_gateway(tmp_path, team_config(pairing_code_ttl=0.5))
    try:
        first = dm(STRANGER, "hello?")
        await gw.accept(first)
        text = (await until(lambda: ch.replies_to(first.message_id), what="code"))[0]
        code1 = code_in(text)
        assert "valid for 1 second" in text and f"/approve {code1}" in text  # 0.5 s, not "1 minute"

        # Same code while it lives; the reminder is throttled (nothing sent for the second message).
        again = dm(STRANGER, "hello again")
        await gw.accept(again)
        await quiet(0.1)
        assert ch.replies_to(again.message_id) == []
        (pending,) = await gw.store.pairing_list()
        assert pending.code == code1 and pending.chat_id == str(STRANGER)

        await asyncio.sleep(0.6)  # the code lapses
        assert await gw.store.pairing_approve(code1) is None, "a lapsed code approves nobody"
        late = dm(STRANGER, "anyone?")
        await gw.accept(late)
        code2 = code_in((await until(lambda: ch.replies_to(late.message_id), what="new code"))[0])
        assert code2 != code1
        assert [r.code for r in await gw.store.pairing_list()] == [code2], "one code per stranger"
        assert harness.turns == [], "a stranger never reaches the agent"
    finally:
        await close_gateway(gw)


async def test_pending_codes_are_bounded_oldest_dropped_first(tmp_path: Path) -> None:
    store = await store_at(tmp_path / "g.sqlite")
    try:
        codes = []
        for user in range(10):
            code, new = await store.pairing_code_for(f"telegram:{user}", "x", str(user), max_pending=3)
            assert new
            codes.append(code)
        left = await store.pairing_list()
        assert [r.code for r in left] == codes[-3:], "the three newest are kept"
        assert await store.pairing_approve(codes[0]) is None, "an evicted code is gone"
    finally:
        await store.close()


async def test_admin_is_told_and_approves_from_chat(tmp_path: Path) -> None:
    gw, ch, harness = await make_gateway(tmp_path, team_config())
    try:
        ask = dm(STRANGER, "let me in", name="Eve")
        await gw.accept(ask)
        code = code_in((await until(lambda: ch.replies_to(ask.message_id), what="code"))[0])

        # Announced in the admin's DM (Telegram: the user id is the DM chat id), not as a reply.
        (note,) = await until(lambda: ch.in_chat(str(ADMIN)), what="announcement")
        assert f"/approve {code}" in note and "`Eve` (`telegram:7`)" in note
        assert all(s.target.reply_to is None for s in ch.sent if s.target.chat_id == str(ADMIN))

        approve = dm(ADMIN, f"/approve {code.lower()}")
        await gw.accept(approve)
        reply = (await until(lambda: ch.replies_to(approve.message_id), what="approve reply"))[0]
        assert reply.startswith("✅ Approved `Eve` (`telegram:7`)")
        told = await until(lambda: [t for t in ch.in_chat(str(STRANGER)) if "approved you" in t])
        assert len(told) == 1

        talk = dm(STRANGER, "now may I")
        await gw.accept(talk)
        await until(lambda: ch.replies_to(talk.message_id) == ["echo: now may I"], what="answer")
        assert [t for _, t in harness.turns] == ["now may I"]

        # The approval from chat is idempotent: the same code again reports, changes nothing.
        twice = dm(ADMIN, f"/approve {code}")
        await gw.accept(twice)
        assert "is approved" in (await until(lambda: ch.replies_to(twice.message_id)))[0]
    finally:
        await close_gateway(gw)


async def test_deny_blocks_new_codes_until_it_lapses(tmp_path: Path) -> None:
    gw, ch, _ = await make_gateway(tmp_path, team_config())
    try:
        ask = dm(STRANGER, "hi")
        await gw.accept(ask)
        code = code_in((await until(lambda: ch.replies_to(ask.message_id)))[0])
        deny = dm(ADMIN, f"/deny {code}")
        await gw.accept(deny)
        assert "Denied" in (await until(lambda: ch.replies_to(deny.message_id)))[0]
        await until(lambda: [t for t in ch.in_chat(str(STRANGER)) if "declined" in t], what="told")

        gw.throttles.reminders.reset(f"telegram:{STRANGER}")  # past the reminder interval
        again = dm(STRANGER, "please?")
        await gw.accept(again)
        text = (await until(lambda: ch.replies_to(again.message_id)))[0]
        assert "declined" in text and "pairing code" not in text
        (row,) = await gw.store.pairing_list()
        assert row.code == code and row.denied, "no new code (and no new announcement) while denied"
        assert len([t for t in ch.in_chat(str(ADMIN)) if "asks to use the bot" in t]) == 1
    finally:
        await close_gateway(gw)


async def test_revoke_from_chat(tmp_path: Path) -> None:
    gw, ch, harness = await make_gateway(tmp_path, team_config())
    try:
        code, _ = await gw.store.pairing_code_for(f"telegram:{STRANGER}", "Eve", str(STRANGER))
        assert await gw.store.pairing_approve(code) == f"telegram:{STRANGER}"
        revoke = dm(ADMIN, f"/revoke {STRANGER}")
        await gw.accept(revoke)
        assert "Revoked `telegram:7`" in (await until(lambda: ch.replies_to(revoke.message_id)))[0]
        assert not await gw.store.is_approved(f"telegram:{STRANGER}")
        back = dm(STRANGER, "still here?")
        await gw.accept(back)
        assert "pairing code" in (await until(lambda: ch.replies_to(back.message_id)))[0]
        assert harness.turns == []
        # Someone let in by config.yaml is named as such.
        member = dm(ADMIN, f"/revoke telegram:{MEMBER}")
        await gw.accept(member)
        assert "config.yaml" in (await until(lambda: ch.replies_to(member.message_id)))[0]
    finally:
        await close_gateway(gw)


async def test_non_admins_are_refused(tmp_path: Path) -> None:
    gw, ch, _ = await make_gateway(tmp_path, team_config())
    try:
        code, _ = await gw.store.pairing_code_for(f"telegram:{STRANGER}", "Eve", str(STRANGER))
        for text in (f"/approve {code}", f"/deny {code}", f"/revoke {STRANGER}", "/approve"):
            msg = dm(MEMBER, text)
            await gw.accept(msg)
            reply = (await until(lambda m=msg: ch.replies_to(m.message_id)))[0]
            assert reply.startswith("Sorry, only an admin"), reply
        assert not await gw.store.is_approved(f"telegram:{STRANGER}")
        (row,) = await gw.store.pairing_list()
        assert not row.denied
        help_ = dm(MEMBER, "/help")
        await gw.accept(help_)
        assert "/approve" not in (await until(lambda: ch.replies_to(help_.message_id)))[0]
    finally:
        await close_gateway(gw)


async def test_wrong_codes_are_limited(tmp_path: Path) -> None:
    gw, ch, _ = await make_gateway(tmp_path, team_config())
    try:
        code, _ = await gw.store.pairing_code_for(f"telegram:{STRANGER}", "Eve", str(STRANGER))
        wrong = [c for c in ("AAAAAAAA", "BBBBBBBB", "CCCCCCCC", "DDDDDDDD", "EEEEEEEE") if c != code]
        for guess in wrong[:5]:
            msg = dm(ADMIN, f"/approve {guess}")
            await gw.accept(msg)
            assert "No pending" in (await until(lambda m=msg: ch.replies_to(m.message_id)))[0]
        right = dm(ADMIN, f"/approve {code}")
        await gw.accept(right)
        assert "Too many unknown codes" in (await until(lambda: ch.replies_to(right.message_id)))[0]
        assert not await gw.store.is_approved(f"telegram:{STRANGER}")
    finally:
        await close_gateway(gw)


def test_admin_rights_are_per_platform() -> None:
    cfg = make_config(
        access={"admins": ["telegram:100"]},
        channels={"telegram": {"enabled": True}, "slack": {"enabled": True, "access": {"admins": ["U1"]}}},
    )
    tg_admin = dm(ADMIN, "/approve X")
    assert access.may_administer(cfg, tg_admin, "telegram")
    assert not access.may_administer(cfg, tg_admin, "slack"), "a Telegram admin decides Telegram users"
    assert not access.may_administer(cfg, tg_admin, "nosuchplatform")
    assert access.qualify_user("<@U123>", "slack") == "slack:U123"
    assert access.qualify_user("42", "telegram") == "telegram:42"
    assert access.qualify_user("a b", "telegram") is None


async def test_discord_admin_is_reached_in_the_dm_they_wrote_from(tmp_path: Path) -> None:
    store = await store_at(tmp_path / "g.sqlite")
    try:
        policy = make_config(access={"admins": ["discord:55", "*"], "admin_chats": ["discord:999"]}).access
        assert await access.admin_chats(policy, "discord", store) == ["999"], "DM unknown yet"
        await store.dm_chat_remember("discord:55", "4242")
        assert await access.admin_chats(policy, "discord", store) == ["4242", "999"]
        assert await access.admin_chats(policy, "telegram", store) == [], "other platforms' ids"
    finally:
        await store.close()


async def test_new_cut_off_by_a_crash_opens_one_thread(tmp_path: Path) -> None:
    """A `/new` whose thread row was written but whose reply never went out (the process died)
    is resumed twice over; the conversation ends up with the one thread the first run made."""
    config = team_config()
    gw, ch, _ = await make_gateway(tmp_path, config)
    first = dm(ADMIN, "hello")
    await gw.accept(first)
    await until(lambda: ch.replies_to(first.message_id), what="first answer")
    old_thread = await gw.store.thread_get(f"telegram:{ADMIN}")
    new = dm(ADMIN, "/new", mid="777")
    assert await gw.store.journal_add(new, "command")
    entry = JournalEntry.new(new, JournalKind.COMMAND)
    cmd = commands.parse_command(new.text)
    assert cmd is not None
    await commands.execute(gw.command_context(), entry, cmd)  # the effect happens ...
    made = await gw.store.thread_get(f"telegram:{ADMIN}")
    assert made and made != old_thread
    await close_gateway(gw)  # ... and the process is gone before the reply

    harness2 = FakeHarness()
    gw2, ch2, _ = await make_gateway(tmp_path, config, harness2)
    try:
        await asyncio.gather(gw2.resume("telegram"), gw2.resume("telegram"))
        reply = (await until(lambda: ch2.replies_to("777"), what="resumed /new reply"))[0]
        assert f"thread {made[:8]}" in reply
        await quiet(0.2)
        assert ch2.replies_to("777") == [reply], "one reply however often resume runs"
        assert await gw2.store.thread_get(f"telegram:{ADMIN}") == made
        for _ in range(200):  # the entry is finished (marked done just after the reply) ...
            if not await gw2.store.journal_open() and await gw2.store.command_result(new.key) is None:
                break
            await asyncio.sleep(0.01)
        assert await gw2.store.journal_open() == [] and await gw2.resume("telegram") == 0
        assert await gw2.store.command_result(new.key) is None, "... and its record dropped"
        after = dm(ADMIN, "on the new thread?")
        await gw2.accept(after)
        await until(lambda: ch2.replies_to(after.message_id), what="answer on the new thread")
        assert harness2.turns == [(made, "on the new thread?")]
    finally:
        await close_gateway(gw2)
