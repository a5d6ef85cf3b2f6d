"""The browser the console's tests drive (tests/browser.py) reaches a running daemon.

Here so that a machine where headless Chromium cannot start fails (or skips, saying why) in one
small test, not in the middle of the console's walks."""

from __future__ import annotations

import json
from pathlib import Path

from tests.browser import Browser
from tests.daemon import base_config, free_port, started_daemon
from tests.fakes.openai_server import FakeOpenAI


async def test_headless_chromium_reads_the_daemons_health_document(
    tmp_path: Path, model: FakeOpenAI, browser: Browser
) -> None:
    cfg = base_config(tmp_path / "data", model.base_url, free_port())
    async with started_daemon(tmp_path, cfg) as d:
        code, expected = await d.get("/healthz")
        assert code == 200
        await browser.get(f"http://127.0.0.1:{d.port}/healthz")
        shown = json.loads(await browser.text())
        assert shown == expected and shown["status"] == "ok", shown
