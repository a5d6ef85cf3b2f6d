"""Slash commands as Slack sends them over Socket Mode, for the fake Slack (tests/fakes/slack_server.py).

Slack only sends a command the app's manifest declares, in a ``slash_commands`` envelope whose
payload is the form Slack would POST to a request URL: ``token``, ``team_id``, ``team_domain``,
``channel_id``, ``channel_name``, ``user_id``, ``user_name``, ``command``, ``text``,
``api_app_id``, ``is_enterprise_install``, ``response_url``, ``trigger_id`` (all strings but the
flag). The app must ack within 3 s; the ack's payload is the response (``response_type``
``in_channel`` shows the invocation in the channel; ``ephemeral`` text only the user sees).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import yaml

MANIFEST = Path(__file__).resolve().parents[2] / "slack-app-manifest.yaml"


def declared_commands(manifest: Path = MANIFEST) -> list[str]:
    """The slash commands the app manifest declares (``/new``, ...), as Slack would know them."""
    data = yaml.safe_load(manifest.read_text(encoding="utf-8"))
    return [entry["command"] for entry in data["features"].get("slash_commands", [])]


def slash_envelope(
    *, n: int, port: int, team_id: str, channel: str, user: str, command: str, text: str, user_name: str
) -> dict[str, Any]:
    """A ``slash_commands`` envelope shaped as Slack's."""
    return {
        "envelope_id": f"env-{n:06d}-{uuid.uuid4().hex[:8]}",
        "type": "slash_commands",
        "accepts_response_payload": True,
        "payload": {
            "token": "verification-token",
            "team_id": team_id,
            "team_domain": "fake",
            "channel_id": channel,
            "channel_name": "directmessage" if channel.startswith("D") else channel.lower(),
            "user_id": user,
            "user_name": user_name,
            "command": command,
            "text": text,
            "api_app_id": "A_APP",
            "is_enterprise_install": "false",
            "response_url": f"http://127.0.0.1:{port}/commands/{n}",
            "trigger_id": f"{n}.{uuid.uuid4().int % 10**12}.{uuid.uuid4().hex[:16]}",
        },
    }
