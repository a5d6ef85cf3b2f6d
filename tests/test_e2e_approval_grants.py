"""Standing permissions end to end (docs/approvals.md, "Standing permissions"): `chital run` with the
fake model calling ``execute`` (gated), on the fake Telegram. Asserted is what people see: the four
buttons, a non-admin's Always refused with nothing recorded, Allow here letting that person's next
call in that chat run without asking (across a restart) while another chat still asks, an admin's
Always covering everyone, ``/approvals`` listing and revoking (only by whom it may), and asking
again once revoked. The decision log holds each decision under the presser's verified id."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.approvals_support import BUTTONS, tg_answer, tg_buttons
from tests.daemon import DaemonProcess
from tests.fakes.gateway_rig import daemon_rows, turns_settled
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall
from tests.fakes.telegram_server import FakeTelegram
from tests.telegram_daemon import OTHER, OWNER, answered, telegram_config

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]
GROUP = -100888


def runs(word: str) -> list[Reply]:
    """One turn: the model runs ``echo WORD`` (gated), then answers with what it printed."""
    return [Reply(tool_calls=[ToolCall("execute", {"command": f"echo {word}"})]), Reply(text=f"Ran: {word}.")]


def buttoned(tg: FakeTelegram, chat: int) -> list[Any]:
    return [m for m in tg.bot_messages(chat) if tg.buttons(chat, m.message_id)]


def log_rows(daemon: DaemonProcess) -> list[tuple[Any, ...]]:
    sql = "SELECT action, by_user, tool, grant_id FROM approval_log ORDER BY id"
    return daemon_rows(daemon.config["storage"], sql)


async def command(tg: FakeTelegram, chat: int, user: int, text: str, needle: str) -> str:
    update = tg.inject_message(chat, user, text)
    return str((await answered(tg, chat, update, needle, timeout=20)).text)


async def test_allow_here_always_and_revoke(tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI) -> None:
    cfg = telegram_config(tmp_path, tg, model)
    cfg["agent"]["approvals"] = {"tools": ["execute"], "timeout": 600}
    cfg["access"]["admins"] = [str(OWNER)]
    cfg["agent"]["memory"] = {"enabled": False}  # every model call is one the test scripted
    daemon = DaemonProcess(tmp_path, cfg)
    await daemon.start()
    try:
        # OTHER (not an admin) is asked; their Always is refused and changes nothing.
        model.script(*runs("one"))
        first = tg.inject_message(OTHER, OTHER, "run one", first_name="Olga")
        request = await tg_buttons(tg, OTHER)
        assert tg.buttons(OTHER, request.message_id) == BUTTONS
        assert "allow " in request.text and "always " in request.text  # typed answers too
        refused = await tg_answer(
            tg, tg.press_button(OTHER, request.message_id, OTHER, "Always", first_name="Olga")
        )
        assert refused.get("show_alert") is True and "Only an admin" in refused["text"]
        assert tg.buttons(OTHER, request.message_id) == BUTTONS, "still waiting for an answer"
        assert daemon_rows(cfg["storage"], "SELECT COUNT(*) FROM approval_grants")[0][0] == 0

        # Allow here: approved now, and from now on for OTHER in this chat.
        allowed = await tg_answer(
            tg, tg.press_button(OTHER, request.message_id, OTHER, "Allow here", first_name="Olga")
        )
        assert not allowed.get("show_alert") and "without asking" in allowed["text"]
        await answered(tg, OTHER, first, "Ran: one.", timeout=30)
        shown = await tg.wait_for(
            lambda: (
                tg.message(OTHER, request.message_id).text
                if not tg.buttons(OTHER, request.message_id)
                else None
            ),
            what="the decision shown",
        )
        assert "Approved by Olga" in shown and "allowed here from now on" in shown
        await turns_settled(cfg["storage"])

        await daemon.close()  # the permission outlives a restart
        await daemon.start()
        model.script(*runs("two"))
        asked_before = len(buttoned(tg, OTHER))
        second = tg.inject_message(OTHER, OTHER, "run two")
        await answered(tg, OTHER, second, "Ran: two.", timeout=30)
        assert len(buttoned(tg, OTHER)) == asked_before == 0, "no one was asked"
        assert any(
            "two" in str(m.get("content")) for m in model.requests[-1]["messages"] if m.get("role") == "tool"
        )

        # Another conversation (OTHER in a group) is not covered: asked there.
        model.script(*runs("three"))
        tg.inject_mention(GROUP, OTHER, "run three", first_name="Olga")
        in_group = await tg_buttons(tg, GROUP)
        # The admin answers Always: everyone's calls on Telegram from now on.
        always = await tg_answer(
            tg, tg.press_button(GROUP, in_group.message_id, OWNER, "Always", first_name="Ann")
        )
        assert "everywhere" in always["text"], always
        await tg.wait_for(
            lambda: any("Ran: three." in m.text for m in tg.bot_messages(GROUP)) or None, timeout=30
        )
        await turns_settled(cfg["storage"])

        listing = await command(tg, OTHER, OTHER, "/approvals", "Standing permissions")
        assert "#1 execute for telegram:1002 here" in listing and "#2 execute for everyone" in listing
        refusal = await command(tg, OTHER, OTHER, "/approvals revoke 2", "revoke")
        assert "Not yours to revoke" in refusal
        assert "Revoked #1" in await command(tg, OTHER, OTHER, "/approvals revoke 1", "Revoked")
        assert "Revoked #2" in await command(tg, OWNER, OWNER, "/approvals revoke #2", "Revoked")

        model.script(*runs("four"))
        tg.inject_message(OTHER, OTHER, "run four")
        await tg.wait_for(lambda: len(buttoned(tg, OTHER)) == 1 or None, timeout=20, what="asked again")

        log = await command(tg, OWNER, OWNER, "/approvals log", "decisions")
        assert "revoke" in log and "always" in log
        assert "decision log is for admins" in await command(tg, OTHER, OTHER, "/approvals log", "admins")
        actions = [(a, u) for a, u, _, _ in log_rows(daemon)]
        assert ("refused always", f"telegram:{OTHER}") in actions
        assert ("here", f"telegram:{OTHER}") in actions and ("always", f"telegram:{OWNER}") in actions
        assert ("run under permission", f"telegram:{OTHER}") in actions
        assert ("revoke", f"telegram:{OTHER}") in actions and ("revoke", f"telegram:{OWNER}") in actions
    finally:
        await daemon.close()
