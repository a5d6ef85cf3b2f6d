"""Fixtures shared by the end-to-end tests: the fake model and the fake Telegram server."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram_server import FakeTelegram


@pytest.fixture
async def model() -> AsyncIterator[FakeOpenAI]:
    """An instant fake model answering ``echo: <text>``, plus the demo rules (LONG, SLOW, FAIL429)."""
    fake = FakeOpenAI()
    fake.add_demo_rules()
    await fake.start()
    yield fake
    await fake.aclose()


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegram]:
    fake = FakeTelegram()
    await fake.start()
    yield fake
    await fake.stop()
