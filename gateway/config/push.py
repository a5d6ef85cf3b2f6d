"""``push:``: named notification targets (Bark, ntfy) for ``chital send`` and schedules (docs/push.md).

A push target is outbound only: the daemon posts to it and reads nothing back, so it never starts
an agent turn. Its credentials (the Bark device key, the ntfy topic, token and password) are
``SecretStr``: the config's redactor (gateway/config/secrets.py) masks them in logs, errors,
status output and in the text of every message, pushes included.
"""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator

from gateway.config.sections import Strict

PUSH_PLATFORM = "push"
"""The journal's platform for pushes: ``push:NAME`` in ``chital send`` (chat = the target's name)."""
PUSH_TITLE = "chital_push_title"
"""A push entry's extra: the title its sender gave (else the target's default)."""
PUSH_ERROR = "chital_push_error"
"""A failed push entry's extra: why, in words for the operator (``chital send --wait`` prints it)."""
TARGET_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")
"""How a target is named in ``push:NAME``: short, lower case, nothing a shell or a URL minds."""


class PushTarget(Strict):
    """One push target: where notifications go and how they look there."""

    kind: Literal["bark", "ntfy"]
    """``bark`` (iOS, through a Bark server) or ``ntfy`` (a topic on an ntfy server)."""
    server: str
    """The server's base URL, ``https://api.day.app`` or ``https://ntfy.sh`` or your own
    (``http://`` only for a server on this host or your LAN). The daemon connects to it as
    configured: it is the operator's choice, never a user's or the model's (docs/push.md)."""
    device_key: SecretStr | None = None
    """Bark: the device key the Bark app shows (``$BARK_DEVICE_KEY`` to keep it out of the file)."""
    topic: SecretStr | None = None
    """ntfy: the topic. On a public server anyone who knows it can read it, so it is a secret."""
    token: SecretStr | None = None
    """ntfy: an access token (``tk_...``), sent as ``Authorization: Bearer``; ``$NTFY_TOKEN``."""
    username: str | None = None
    """ntfy: a user for basic auth (with ``password``), instead of a token."""
    password: SecretStr | None = None
    """ntfy: the basic-auth password."""
    title: str = Field("Chital", max_length=200)
    """The notification's title when the sender gives none."""
    priority: int = Field(3, ge=1, le=5)
    """ntfy: 1 (min) to 5 (max), 3 is ntfy's default."""
    tags: list[str] = Field(default_factory=list, max_length=10)
    """ntfy: tags (emoji short codes such as ``warning`` show as emoji)."""
    markdown: bool = False
    """ntfy: render the message as Markdown. Off: the text is shown as written (plain)."""
    level: Literal["active", "timeSensitive", "passive"] | None = None
    """Bark: the interruption level; unset: the app's default (active)."""
    group: str | None = Field(None, max_length=64)
    """Bark: group notifications under this name in Notification Center."""
    url: str | None = None
    """Bark: a URL opened when the notification is tapped."""
    timeout: float = Field(15.0, gt=0, le=120)
    """Seconds for one request (connect and answer)."""
    schedules_from: list[str] = Field(default_factory=list)
    """Conversations (``telegram:-1001234567890``, ``slack:C0123ABCD``: platform and chat id)
    whose scheduled runs also push their answer here. Empty: no schedule pushes here. The
    operator's list, not the agent's: no prompt can route a schedule's output to your phone."""

    @field_validator("server")
    @classmethod
    def _server_url(cls, value: str) -> str:
        parts = urlsplit(value.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("server: an http(s) URL such as https://ntfy.sh")
        if parts.username or parts.password or parts.query or parts.fragment:
            raise ValueError("server: no user, password, query or fragment in the URL (use token/password)")
        return value.strip().rstrip("/")

    @field_validator("tags")
    @classmethod
    def _plain_tags(cls, value: list[str]) -> list[str]:
        for tag in value:
            if not re.fullmatch(r"[A-Za-z0-9_+-]{1,32}", tag):
                raise ValueError(f"tags: {tag[:40]!r} is not a tag (letters, digits, _ + -)")
        return value

    @model_validator(mode="after")
    def _credentials(self) -> PushTarget:
        if self.kind == "bark":
            if self.device_key is None or not self.device_key.get_secret_value().strip():
                raise ValueError("a bark target needs device_key")
            if self.topic or self.token or self.username or self.password:
                raise ValueError("topic, token, username and password are for ntfy targets")
        else:
            topic = self.topic.get_secret_value() if self.topic else ""
            if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", topic):
                raise ValueError("an ntfy target needs topic: 1 to 64 letters, digits, _ or -")
            if self.device_key or self.level or self.group or self.url:
                raise ValueError("device_key, level, group and url are for bark targets")
            if self.token and (self.username or self.password):
                raise ValueError("give either token or username and password, not both")
            if bool(self.username) != bool(self.password):
                raise ValueError("basic auth needs both username and password")
        for conversation in self.schedules_from:
            if not re.fullmatch(r"[a-z]+:[^:\s]{1,128}", conversation):
                raise ValueError(f"schedules_from: {conversation[:60]!r} is not PLATFORM:CHAT")
        return self


def check_target_names(targets: dict[str, PushTarget]) -> None:
    """Names are what ``push:NAME`` addresses: refused when they could not be typed there."""
    for name in targets:
        if not TARGET_NAME.fullmatch(name):
            raise ValueError(f"push: {name[:40]!r} is not a target name (a-z, 0-9, _ and -, at most 32)")
