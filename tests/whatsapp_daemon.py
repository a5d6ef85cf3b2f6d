"""What the end-to-end tests of a WhatsApp daemon share: the users the config allows, the config
(the fake Graph API, the fake model, the hooks listener the webhook is served on) and how to wait
for a reply."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.daemon import chat_config, free_port
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.whatsapp_server import FakeWhatsApp, Sent

OWNER = "15550001111"  # allowed by config
STRANGER = "15550009999"


def whatsapp_config(tmp_path: Path, wa: FakeWhatsApp, model: FakeOpenAI) -> dict[str, Any]:
    """The daemon's config; points the fake's webhook driver at the daemon's hooks listener."""
    port = free_port()
    wa.webhook_url = f"http://127.0.0.1:{port}/channels/whatsapp/webhook"
    cfg = chat_config(tmp_path, model.base_url, wa, allow=[OWNER], hooks={"host": "127.0.0.1", "port": port})
    cfg["access"]["pairing"] = True
    return cfg


async def answered(wa: FakeWhatsApp, message: dict[str, Any], needle: str, timeout: float = 15) -> Sent:
    """Wait until a reply to ``message`` shows ``needle``; return it."""

    def check() -> Sent | None:
        return next((m for m in wa.replies_to(message["id"]) if needle in m.text), None)

    return await wa.wait_for(check, timeout=timeout, what=f"reply containing {needle!r}")
