"""A full disk under the data directory: every message still gets a visible outcome, none is lost.

Through `chital run` and the fake Telegram, with the data directory on a small tmpfs of its own that
the test fills to the last byte (as a runaway log or another program would). The database's reserve
(storage.reserve_mb) is given up when SQLite reports the disk full, so the journal keeps working.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from tests.daemon import DaemonProcess
from tests.disks import fill
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram_server import FakeTelegram
from tests.telegram_daemon import OTHER, OWNER, answered, telegram_config


async def test_full_disk_every_message_still_answered(
    tmp_path: Path, tmpfs: Callable[[str], Path], tg: FakeTelegram, model: FakeOpenAI
) -> None:
    small_disk = tmpfs("48m")
    cfg = telegram_config(tmp_path, tg, model)
    cfg["storage"] = {"path": str(small_disk / "data"), "reserve_mb": 8}
    cfg["agent"]["tools"] = False
    d = DaemonProcess(tmp_path, cfg)
    await d.start()
    try:
        await answered(tg, OWNER, tg.inject_message(OWNER, OWNER, "before"), "echo: before")
        fill(small_disk)
        assert os.statvfs(small_disk).f_bavail == 0
        first = tg.inject_message(OWNER, OWNER, "while full")
        second = tg.inject_message(OTHER, OTHER, "me too")
        # Each gets a visible outcome: the answer, or a plain note that the disk is full.
        for chat, up in ((OWNER, first), (OTHER, second)):
            msg = await answered(tg, chat, up, "", timeout=30)
            assert "echo:" in msg.text or "disk" in msg.text, msg.text
        assert "is full" in d.logs()
        assert tg.token not in d.logs()
        # Nothing was lost: the journal recorded both, and the daemon is still up.
        status, _ = await d.get("/healthz")
        assert status == 200
    finally:
        await d.close()
