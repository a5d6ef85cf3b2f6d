"""What the Telegram album tests share (tests/test_e2e_telegram_albums.py and their attacks):
the allowed user, a solid-colour JPEG, and a daemon config with a vision model and a set album wait."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from PIL import Image

from tests.daemon import chat_config
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram_server import FakeTelegram

USER = 1001


def picture(colour: tuple[int, int, int]) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 48), colour).save(out, "JPEG", quality=95)
    return out.getvalue()


def album_config(tmp_path: Path, model: FakeOpenAI, tg: FakeTelegram, album_wait: float) -> dict[str, Any]:
    """USER allowed, groups answer on a mention, a vision model taking up to 10 images, no tools
    and no memory (their model calls are not what these tests count)."""
    cfg = chat_config(
        tmp_path,
        model.base_url,
        tg,
        allow=[str(USER)],
        group_policy="mention",
        agent={"tools": False, "memory": {"enabled": False}, "vision": {"max_images": 10}},
    )
    cfg["models"][0]["vision"] = True
    cfg["channels"]["telegram"]["album_wait"] = album_wait
    return cfg
