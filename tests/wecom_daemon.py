"""What the end-to-end tests of a WeCom daemon share: the users the config allows, the chats, the
config itself (the fake long connection and the fake model), and how to wait for a reply."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.daemon import chat_config
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.wecom_server import FakeWeCom, Shown

OWNER = "owner"  # allowed by config
FRIEND = "friend"  # allowed too
STRANGER = "stranger"
GROUP = "wrgroupchat0001"


def wecom_config(
    tmp_path: Path, fake: FakeWeCom, model: FakeOpenAI, **sections: dict[str, Any]
) -> dict[str, Any]:
    cfg = chat_config(tmp_path, model.base_url, fake, allow=[f"wecom:{OWNER}", f"wecom:{FRIEND}"],
                      group_policy="mention", **sections)  # fmt: skip
    cfg["access"]["pairing"] = True
    return cfg


async def answered(fake: FakeWeCom, frame: dict[str, Any], needle: str, timeout: float = 15) -> Shown:
    """Wait until a reply to ``frame`` (its stream) shows ``needle`` and is finished."""

    def check() -> Shown | None:
        return next((m for m in fake.replies_to(frame) if needle in m.text and m.finished), None)

    return await fake.wait_for(check, timeout=timeout, what=f"finished reply containing {needle!r}")


async def sent_to(fake: FakeWeCom, chat: str, needle: str, timeout: float = 15) -> Shown:
    """Wait until any finished bot message in ``chat`` (a stream or a proactive one) shows ``needle``."""

    def check() -> Shown | None:
        return next((m for m in fake.bot_messages(chat) if needle in m.text and m.finished), None)

    return await fake.wait_for(check, timeout=timeout, what=f"message containing {needle!r} in {chat}")
