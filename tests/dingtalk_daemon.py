"""What the end-to-end tests of a DingTalk daemon share: the users the config allows, the group,
the config itself (the fake DingTalk and the fake model), and how to wait for a reply."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.daemon import chat_config
from tests.fakes.dingtalk_server import FakeDingTalk, Sent
from tests.fakes.openai_server import FakeOpenAI

OWNER = "owner01"  # staff ids; allowed by config
FRIEND = "friend02"
STRANGER = "stranger03"
GROUP = "cidFakeGroupConversation0001=="


def dingtalk_config(tmp_path: Path, fake: FakeDingTalk, model: FakeOpenAI) -> dict[str, Any]:
    cfg = chat_config(
        tmp_path, model.base_url, fake, allow=[OWNER, f"dingtalk:{FRIEND}"], group_policy="mention"
    )
    cfg["access"]["pairing"] = True
    return cfg


async def answered(fake: FakeDingTalk, chat: str, needle: str, timeout: float = 15) -> Sent:
    """Wait until a bot message in ``chat`` shows ``needle``; return it."""

    def check() -> Sent | None:
        return next((m for m in fake.messages_to(chat) if needle in m.text), None)

    return await fake.wait_for(check, timeout=timeout, what=f"a message containing {needle!r} in {chat}")
