"""What the end-to-end tests of a Telegram daemon share: the users the config allows, the config
itself (the fake Telegram and the fake model), and how to wait for the reply a user would see."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.daemon import chat_config
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram_server import FakeTelegram

OWNER = 1001  # allowed by config
OTHER = 1002  # allowed too
STRANGER = 6666
GROUP = -100200300


def telegram_config(tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI) -> dict[str, Any]:
    cfg = chat_config(
        tmp_path, model.base_url, tg, allow=[str(OWNER), f"telegram:{OTHER}"], group_policy="mention"
    )
    cfg["access"]["pairing"] = True
    return cfg


def drafted(tg: FakeTelegram, chat: int) -> list[str]:
    """Texts of the draft previews streamed into ``chat`` so far."""
    return [text for c, _, text in tg.drafts if c == chat]


def replies_to(tg: FakeTelegram, chat: int, user_msg: int) -> list[Any]:
    return [m for m in tg.bot_messages(chat) if m.reply_to == user_msg]


async def answered(
    tg: FakeTelegram, chat: int, update: dict[str, Any], needle: str, timeout: float = 15
) -> Any:
    """Wait until the reply to ``update`` shows ``needle``; return that reply message."""
    mid = update["message"]["message_id"]

    def check() -> Any:
        for m in replies_to(tg, chat, mid):
            if needle in m.text:
                return m
        return None

    return await tg.wait_for(check, timeout=timeout, what=f"reply containing {needle!r}")
