"""The ``console:`` section: the operator console on the HTTP listener (docs/console.md). Off unless an
admin token is set, in the config or in ``$CHITAL_CONSOLE_TOKEN``."""

from __future__ import annotations

import os

from pydantic import Field, SecretStr, field_validator

from gateway.config.sections import Strict

TOKEN_ENV = "CHITAL_CONSOLE_TOKEN"
MIN_TOKEN_CHARS = 16


class ConsoleConfig(Strict):
    """The operator console at ``/console`` (docs/console.md): pages over the daemon's state and
    the admin actions of the chat commands, behind a login with the admin token."""

    token: SecretStr | None = None
    """The admin token exchanged for a session at ``/console/login`` (16 characters or more; write
    ``${CHITAL_CONSOLE_TOKEN}`` here, or leave it out and set that variable). Unset: no console."""
    session_ttl: float = Field(8 * 3600, gt=0, le=30 * 86400)
    """Seconds a console session lasts after its login (then the browser logs in again)."""
    secure_cookie: bool = False
    """Mark the session cookie ``Secure`` (sent over HTTPS only). Turn it on when a TLS proxy is in
    front of the listener; a request that arrived over TLS gets it regardless."""
    login_attempts: int = Field(5, ge=1, le=1000)
    """Failed logins one client address may make per ``login_window`` before every login from it
    (even with the right token) is refused until the window passes."""
    login_attempts_total: int = Field(50, ge=1, le=100_000)
    """Failed logins from all addresses together per ``login_window``: past it, every login is
    refused (a spread-out guessing attack)."""
    login_window: float = Field(900, gt=0, le=86400)
    """Seconds over which failed logins are counted."""
    origins: list[str] = Field(default_factory=list)
    """Extra origins (``https://ops.example.com``) a state-changing request may come from, for a
    console behind a proxy under another name; the listener's own ``Host`` is always accepted."""

    @field_validator("token")
    @classmethod
    def _long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and 0 < len(value.get_secret_value()) < MIN_TOKEN_CHARS:
            raise ValueError(f"the console token must be at least {MIN_TOKEN_CHARS} characters")
        return value

    def admin_token(self) -> str | None:
        """The token from the config, else from ``$CHITAL_CONSOLE_TOKEN``; None: the console is off."""
        value = self.token.get_secret_value() if self.token is not None else ""
        value = value or os.environ.get(TOKEN_ENV, "")
        return value if len(value) >= MIN_TOKEN_CHARS else None
