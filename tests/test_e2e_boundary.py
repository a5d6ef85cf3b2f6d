"""Attacks on the sandbox boundary through `chital run`, a real bubblewrap sandbox and Telegram.

The model is scripted the way a hostile user (or text that steers the model) would drive it: code in
the sandbox plants links and FIFOs where the daemon's own host-side code reads and writes. What the
user sees in the chat, and what exists on the host afterwards, is asserted; never the code path.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.daemon import DaemonProcess
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall, last_user_text
from tests.fakes.telegram_server import FakeTelegram
from tests.telegram_daemon import OWNER, answered, telegram_config

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]

OUT = "/mnt/user-data/outputs"
UP = "/mnt/user-data/uploads"


def _all_bytes_sent(tg: FakeTelegram) -> bytes:
    """Everything the bot put in the chat: texts, captions and the contents of every file."""
    out = b""
    for m in tg.bot_messages(OWNER):
        out += m.text.encode()
        if m.document:
            out += tg.file_bytes(m.document["file_id"])
        for size in m.photo or ():
            out += tg.file_bytes(size["file_id"])
    return out


async def test_presented_file_swapped_for_links_and_fifos_sends_no_host_data(
    telegram_daemon: DaemonProcess, tg: FakeTelegram, model: FakeOpenAI, tmp_path: Path
) -> None:
    """Attack 1: present files, then swap them (and a directory on their path) for links to the
    daemon's environment, its config, the host's shadow file, and for a FIFO that would block."""
    secret = tmp_path / "host-secret.txt"
    secret.write_text("HOST-ONLY-CANARY")
    secret.chmod(0o644)  # readable by anyone on the host: only the boundary can stop it
    names = ["environ.txt", "config.txt", "shadow.txt", "canary.txt", "rel.txt", "fifo.txt", "sub/deep.txt"]
    make = " && ".join(f"echo harmless > {OUT}/{n}" for n in names)
    swap = " && ".join(
        [
            f"cd {OUT}",
            "ln -sf /proc/self/environ environ.txt",
            f"ln -sf {telegram_daemon.config_path} config.txt",
            "ln -sf /etc/shadow shadow.txt",
            f"ln -sf {secret} canary.txt",
            "ln -sf ../../../../../../../../../../../.." + str(secret) + " rel.txt",
            "rm fifo.txt && mkfifo fifo.txt",
            # A directory on the path becomes a link to a host directory holding the canary.
            f"rm -r sub && ln -s {secret.parent} sub && cp /dev/null /dev/null",
        ]
    )
    model.script(
        Reply(tool_calls=[ToolCall("execute", {"command": f"mkdir -p {OUT}/sub && {make}"})]),
        Reply(tool_calls=[ToolCall("present_files", {"paths": [f"{OUT}/{n}" for n in names]})]),
        Reply(tool_calls=[ToolCall("execute", {"command": swap + " && ls -l"})]),
        Reply(text="All your files are on their way."),
    )
    up = tg.inject_message(OWNER, OWNER, "make me some reports")
    await answered(tg, OWNER, up, "on their way", timeout=40)
    note = await tg.wait_for(
        lambda: next((m for m in tg.bot_messages(OWNER) if "could not send" in m.text), None),
        timeout=15,
        what="the note naming the files that were not sent",
    )
    # The user is told plainly; each refused file is named (7 names, none sent).
    for n in ("environ.txt", "config.txt", "shadow.txt", "canary.txt", "rel.txt", "fifo.txt", "deep.txt"):
        assert n in note.text
    assert not [m for m in tg.bot_messages(OWNER) if m.document or m.photo]
    sent = _all_bytes_sent(tg)
    for leaked in (b"HOST-ONLY-CANARY", tg.token.encode(), b"sk-test-key-never-logged", b"root:"):
        assert leaked not in sent
    # The daemon is still healthy and answers the next message (the FIFO blocked nothing).
    model.script(Reply(text="still here"))
    again = tg.inject_message(OWNER, OWNER, "are you alive?")
    await answered(tg, OWNER, again, "still here", timeout=20)


async def test_file_replaced_after_present_sends_what_is_there_at_delivery(
    telegram_daemon: DaemonProcess, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    """A regular file rewritten after present_files is sent as it is when opened, once."""
    model.script(
        Reply(tool_calls=[ToolCall("execute", {"command": f"echo first > {OUT}/r.txt"})]),
        Reply(tool_calls=[ToolCall("present_files", {"paths": ["r.txt", "r.txt"]})]),
        Reply(tool_calls=[ToolCall("execute", {"command": f"echo second > {OUT}/r.txt"})]),
        Reply(text="sent r.txt"),
    )
    up = tg.inject_message(OWNER, OWNER, "report please")
    await answered(tg, OWNER, up, "sent r.txt", timeout=40)
    docs = await tg.wait_for(
        lambda: [m for m in tg.bot_messages(OWNER) if m.document], timeout=10, what="the document"
    )
    assert len(docs) == 1 and tg.file_bytes(docs[0].document["file_id"]) == b"second\n"


async def test_upload_onto_planted_links_never_writes_through_them(
    telegram_daemon: DaemonProcess, tg: FakeTelegram, model: FakeOpenAI, tmp_path: Path
) -> None:
    """Attack 2: the sandbox plants a dangling link, a link to an existing host file and a FIFO
    under the names of files the user then sends; the daemon must write none of them."""
    target_dir = tmp_path / "host-area"
    target_dir.mkdir()
    target_dir.chmod(0o777)  # even a world-writable host dir must stay untouched
    existing = target_dir / "existing.txt"
    existing.write_text("ORIGINAL")
    existing.chmod(0o666)
    plant = " && ".join(
        [
            f"ln -s {target_dir}/created.txt {UP}/notes.txt",
            f"ln -s {existing} {UP}/data.csv",
            f"mkfifo {UP}/pipe.txt",
        ]
    )
    model.script(
        Reply(tool_calls=[ToolCall("execute", {"command": plant + f" && ls -l {UP}"})]),
        Reply(text="prepared"),
    )
    first = tg.inject_message(OWNER, OWNER, "get ready for my files")
    await answered(tg, OWNER, first, "prepared", timeout=30)

    for name, body in (("notes.txt", b"user notes"), ("data.csv", b"a,b\n"), ("pipe.txt", b"piped")):
        model.script(Reply(text=f"got {name}"))
        doc = tg.add_file(body, file_name=name, mime_type="text/plain")
        up = tg.inject_message(OWNER, OWNER, f"here is {name}", document=doc)
        await answered(tg, OWNER, up, f"got {name}", timeout=20)
        told = last_user_text(model.requests[-1])
        stem, ext = name.rsplit(".", 1)
        # The file landed under a fresh name beside the planted entry, and the agent was told so.
        assert f"{UP}/{stem}-2.{ext}" in told
        host = telegram_daemon.sandbox_root / "threads"
        [thread] = list(host.iterdir())
        saved = thread / "uploads" / f"{stem}-2.{ext}"
        assert saved.read_bytes() == body and not saved.is_symlink()
    assert not (target_dir / "created.txt").exists()
    assert existing.read_text() == "ORIGINAL"
    assert sorted(p.name for p in target_dir.iterdir()) == ["existing.txt"]


async def test_upload_over_the_thread_quota_is_refused_with_a_clear_note(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    cfg = telegram_config(tmp_path, tg, model)
    cfg["agent"]["sandbox"]["limits"] = {"disk_mb": 1}
    d = DaemonProcess(tmp_path, cfg)
    await d.start()
    try:
        model.script(Reply(text="I see no file"))
        doc = tg.add_file(b"x" * (2 * 1024 * 1024), file_name="big.bin", mime_type="application/octet-stream")
        up = tg.inject_message(OWNER, OWNER, "store this", document=doc)
        msg = await answered(tg, OWNER, up, "I see no file", timeout=30)
        assert "could not store big.bin" in msg.text and "quota" in msg.text
        [thread] = list((d.sandbox_root / "threads").iterdir())
        assert not list((thread / "uploads").iterdir())
    finally:
        await d.close()


async def test_a_platforms_error_text_about_a_file_is_shown_inert(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    """Telegram's own words about a file (here a refused getFile whose description is hostile) reach
    the user only inside one code span: no link in the bot's voice, no bidi reordering."""
    hostile = "Bad Request: [verify your account](https://evil.example/login) \u202eexe.txt @everyone"
    d = DaemonProcess(tmp_path, telegram_config(tmp_path, tg, model))
    await d.start()
    try:
        model.script(Reply(text="I got no file"))
        doc = tg.add_file(b"a,b\n", file_name="sales.csv", mime_type="text/csv")
        tg.fail_next("getFile", 400, description=hostile)
        up = tg.inject_message(OWNER, OWNER, "read this", document=doc)
        msg = await answered(tg, OWNER, up, "I got no file", timeout=30)
        assert "could not fetch sales.csv" in msg.text, msg.text
        [reason] = [s for s in msg.spans("code") if "verify your account" in s]
        assert "evil.example" in reason and "\u202e" not in msg.text, msg.text
        links = [e for e in msg.entities if e["type"] in ("text_link", "url")]
        assert not links, msg.entities
    finally:
        await d.close()
