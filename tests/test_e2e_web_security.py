"""End to end through `chital run` and Telegram: the model asks ``web_fetch`` for loopback and
metadata addresses spelled with Unicode digits and dots (the bug class of the IDNA-folded hosts),
and nothing on this host answers.

A canary server on 127.0.0.1 (and ::1) plays the daemon's /metrics, a model server or a platform
API; the daemon's own /metrics port is aimed at too. The fake model's recorded requests show what
the tool told the model.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon import DaemonProcess, started_daemon
from tests.fakes.canary_server import Canary
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall
from tests.fakes.telegram_server import FakeTelegram
from tests.telegram_daemon import OWNER, answered, telegram_config

ASK = "WEBSEC: read those status pages for me"
ANSWER = "I could not read those pages: they are on private addresses."


@pytest.fixture
async def daemon(tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI) -> AsyncIterator[DaemonProcess]:
    cfg = telegram_config(tmp_path, tg, model)
    cfg["agent"]["memory"] = {"enabled": False}  # no background model calls in the recording
    # An allowlist that opens other internal hosts must not open these.
    cfg["agent"]["web"] = {"allow_hosts": ["wiki.internal", "10.1.2.3", "192.168.50.0/24"]}
    async with started_daemon(tmp_path, cfg) as d:
        yield d


def tool_results(body: dict[str, Any]) -> dict[str, str]:
    return {m["tool_call_id"]: str(m["content"]) for m in body.get("messages", []) if m.get("role") == "tool"}


async def test_unicode_spelled_private_urls_are_refused_by_the_daemon(
    daemon: DaemonProcess, tg: FakeTelegram, model: FakeOpenAI, canary: Canary
) -> None:
    targets = {
        "fullwidth": f"http://１２７.０.０.１:{canary.port}/metrics",
        "ideographic-dots": f"http://127。0。0。1:{canary.port}/metrics",
        "circled": f"http://①②⑦.⓪.⓪.①:{canary.port}/metrics",
        "math-bold": f"http://𝟏𝟐𝟕.𝟎.𝟎.𝟏:{canary.port}/metrics",
        "mapped-v6": f"http://[::ffff:127.0.0.1]:{canary.port}/metrics",
        "decimal": f"http://2130706433:{canary.port}/metrics",
        "unspecified": f"http://0.0.0.0:{canary.port}/metrics",
        "daemon-metrics": f"http://１２７．０．０．１:{daemon.port}/metrics",
        "metadata": "http://①⑥⑨。②⑤④。①⑥⑨。②⑤④/latest/meta-data/iam/security-credentials/",
    }

    def reply(body: dict[str, Any]) -> Reply:
        if tool_results(body):
            return Reply(text=ANSWER)
        return Reply(
            tool_calls=[ToolCall("web_fetch", {"url": url}, id=name) for name, url in targets.items()]
        )

    model.add_rule(lambda text: text.startswith("WEBSEC"), reply)
    up = tg.inject_message(OWNER, OWNER, ASK)
    await answered(tg, OWNER, up, ANSWER, timeout=30)

    assert canary.connections == 0 and canary.requests == [], "a refused fetch reached the canary"
    final = next(r for r in reversed(model.requests) if tool_results(r))
    results = tool_results(final)
    assert set(results) == set(targets)
    for name, text in results.items():
        assert text.startswith("refused:") or "refused:" in text, f"{name}: {text}"
        assert "private, loopback, link-local or reserved" in text, f"{name}: {text}"
    assert "169.254.169.254" in results["metadata"]
    assert "127.0.0.1" in results["fullwidth"] and "127.0.0.1" in results["daemon-metrics"]
    recorded = json.dumps(model.requests, ensure_ascii=False)
    assert "chital_secret_metric" not in recorded and "# HELP" not in recorded and "# TYPE" not in recorded
