"""What the end-to-end tests of a Feishu/Lark daemon share: the users and chats the fake Lark knows,
and how to wait for the reply a user would see. One home, so no test module imports another."""

from __future__ import annotations

from tests.fakes.lark_server import FakeLark, FakeMessage, Injected

FRIEND = "ou_friend"
STRANGER = "ou_stranger"
P2P = "oc_p2p_friend"
GROUP = "oc_group"


def replies(lark: FakeLark, inj: Injected) -> list[FakeMessage]:
    return [m for m in lark.bot_messages() if m.parent_id == inj.message_id]


async def answered(lark: FakeLark, inj: Injected, needle: str, timeout: float = 15) -> FakeMessage:
    def check(_: FakeLark) -> FakeMessage | None:
        return next((m for m in replies(lark, inj) if needle in m.text), None)

    return await lark.wait_for_async(check, timeout=timeout)
