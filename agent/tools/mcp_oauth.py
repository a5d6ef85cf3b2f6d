"""OAuth for HTTP MCP servers (the MCP authorization spec), through the MCP SDK's own client.

A daemon has no browser, so the grant is OAuth 2.1 **client credentials** (machine to machine):
the admin registers Chital as a client at the authorization server and configures
``oauth.client_id``, ``oauth.client_secret`` (a secret) and ``oauth.issuer``. The SDK's
:class:`~mcp.client.auth.extensions.client_credentials.ClientCredentialsOAuthProvider` (an
``httpx.Auth``) does the rest on the server's first 401: protected resource metadata (RFC 9728),
authorization server metadata (RFC 8414, whose ``issuer`` must be the configured one: the secret is
never sent to a server the MCP server merely points at), the token request, the bearer header on
every request, and a refresh with the refresh token (if the server issued one) once the access
token expires, falling back to a new client-credentials grant when the refresh is refused.

Chital adds:

- :class:`FileTokenStorage`: the tokens in the data directory (``mcp-oauth/``, 0700; one file per
  server, 0600, written atomically), so a restart does not fetch new ones; keyed by the server's
  URL, issuer and client id so a changed config never reuses another's tokens.
- :func:`oauth_error`: the token endpoint's refusal (``invalid_client``, ``invalid_grant``: a
  revoked or wrong client) in Chital's words, and *not worth retrying*: the catalog marks the
  server failed once and waits for an admin's ``/mcp reload`` instead of hitting the token
  endpoint again on every backoff tick.
- :class:`_QuietSdkLog`: the SDK logs a failed flow with the exception, whose text quotes the
  token endpoint's response body; the filter keeps the record and drops that text.

The provider (one per configured server, kept across calls) holds the current tokens in memory;
they never reach a tool result, an error text, the model or the sandbox.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
from pathlib import Path

import httpx
from mcp.client.auth import OAuthFlowError, OAuthRegistrationError, OAuthTokenError, TokenStorage
from mcp.client.auth.extensions.client_credentials import ClientCredentialsOAuthProvider
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken

from agent.settings import McpServer

log = logging.getLogger(__name__)

_SAFE = re.compile(r"[^A-Za-z0-9_-]")


class MemoryTokenStorage(TokenStorage):
    """Tokens held in memory only (no data directory given: one-shot loading, tests)."""

    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client_info: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client_info

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client_info = client_info


class FileTokenStorage(MemoryTokenStorage):
    """The SDK's ``TokenStorage`` in one JSON file (0600, in a 0700 directory, replaced atomically).

    An unreadable or malformed file counts as no tokens (the provider then fetches new ones)."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self._loaded = False

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if isinstance(data, dict) and data.get("tokens"):
                self.tokens = OAuthToken.model_validate(data["tokens"])
        except (OSError, ValueError):
            self.tokens = None

    def _save(self) -> None:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            os.chmod(self.path.parent, 0o700)
        data = {"tokens": self.tokens.model_dump(mode="json") if self.tokens else None}
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f)
        os.chmod(tmp, 0o600)
        os.replace(tmp, self.path)

    async def get_tokens(self) -> OAuthToken | None:
        self._load()
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self._loaded = True
        self.tokens = tokens
        self._save()


def token_path(token_dir: Path, name: str, config: McpServer) -> Path:
    """The token file of server ``name``: its name (made safe) and a digest of what the tokens
    belong to, so a server pointed elsewhere or given another client starts afresh."""
    assert config.oauth is not None
    key = "\n".join([config.url or "", config.oauth.issuer, config.oauth.client_id])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return token_dir / f"{_SAFE.sub('_', name)[:64]}-{digest}.json"


def build_auth(name: str, config: McpServer, token_dir: Path | None) -> httpx.Auth:
    """The SDK's client-credentials provider for server ``name`` (its ``oauth`` section)."""
    oauth = config.oauth
    assert oauth is not None and config.url is not None
    storage = FileTokenStorage(token_path(token_dir, name, config)) if token_dir else MemoryTokenStorage()
    _QuietSdkLog.install()
    return ClientCredentialsOAuthProvider(
        server_url=config.url,
        storage=storage,
        client_id=oauth.client_id,
        client_secret=oauth.client_secret.get_secret_value(),
        token_endpoint_auth_method=oauth.token_endpoint_auth_method,
        scopes=oauth.scopes,
        issuer=oauth.issuer,
    )


def oauth_error(exc: BaseException) -> tuple[str, bool] | None:
    """(reason, worth retrying) for an OAuth failure of the SDK's flow, else None.

    The token endpoint refusing the client or its grant (revoked, wrong secret) is not retried:
    retrying would only hit the token endpoint again with the same refused credentials."""
    if isinstance(exc, OAuthTokenError | OAuthRegistrationError):
        return (
            "authorization refused or revoked by its authorization server: check its oauth "
            "client_id/client_secret, then /mcp reload",
            False,
        )
    if isinstance(exc, OAuthFlowError):
        return (
            "OAuth discovery failed (no authorization server metadata matching oauth.issuer)",
            True,
        )
    return None


class _QuietSdkLog(logging.Filter):
    """Keeps the SDK's OAuth log records but not the exception text they carry (the token
    endpoint's response body, which Chital does not control)."""

    _installed = False

    @classmethod
    def install(cls) -> None:
        if not cls._installed:
            cls._installed = True
            logging.getLogger("mcp.client.auth.oauth2").addFilter(cls())

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None:
            kind = type(record.exc_info[1]).__name__
            record.msg, record.args = f"{record.getMessage()} ({kind})", None
            record.exc_info, record.exc_text = None, None
        return True
