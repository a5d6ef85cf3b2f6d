"""Hostile-user attacks on Telegram albums (channels/telegram/albums.py), end to end: ``chital run``
against the wire-level fake Telegram and the fake vision model. What the model got is read from the
fake model's requests; what the user saw from the fake Telegram.
"""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any

from PIL import Image

from tests.daemon import chat_config, started_daemon
from tests.fakes.openai_server import FakeOpenAI, Reply, last_user_text
from tests.fakes.telegram_server import FakeTelegram

USER, STRANGER, GROUP = 1001, 2002, -100700800
COLOURS = [(220, 30, 30), (30, 200, 30), (30, 30, 220)]


def picture(colour: tuple[int, int, int]) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 48), colour).save(out, "JPEG", quality=95)
    return out.getvalue()


def images_in(body: dict[str, Any]) -> int:
    content = body["messages"][-1].get("content")
    return sum(1 for p in content if p.get("type") == "image_url") if isinstance(content, list) else 0


def config(tmp_path: Path, model: FakeOpenAI, tg: FakeTelegram, album_wait: float = 2.0) -> dict[str, Any]:
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


def answer(body: dict[str, Any]) -> Reply:
    return Reply(text=f"[{last_user_text(body)[-40:]}] with {images_in(body)} picture(s)")


def user_turns(model: FakeOpenAI) -> list[dict[str, Any]]:
    """The model requests that began a turn (their last message is the user's)."""
    return [b for b in model.requests if b["messages"][-1].get("role") == "user"]


async def test_a_message_sent_right_after_an_album_is_answered_after_it(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    """Order per conversation (class 9, faults at the worst moment: a message in the album's wait).
    The user sends an album and at once a follow-up question and a command. The album is held for
    its wait; the follow-ups must not overtake it: the model gets the album first, then the
    question, and the question's turn sees the album in its history."""
    model.add_rule(lambda _t: True, answer)
    async with started_daemon(tmp_path, config(tmp_path, model, tg)):
        items = [{"photo": tg.add_photo(picture(c))} for c in COLOURS]
        tg.inject_album(USER, USER, items, caption="three shirts")
        tg.inject_message(USER, USER, "which one is cheapest?")
        await tg.wait_for(lambda: len(user_turns(model)) >= 2, timeout=40, what="both turns")
        await asyncio.sleep(3)  # past the album's wait: nothing more comes
        turns = user_turns(model)
        assert len(turns) == 2, [last_user_text(t) for t in turns]
        assert images_in(turns[0]) == 3 and "three shirts" in last_user_text(turns[0]), last_user_text(
            turns[0]
        )
        assert "which one is cheapest?" in last_user_text(turns[1])
        assert "three shirts" in str(turns[1]["messages"][:-1]), "the question's turn sees the album"
