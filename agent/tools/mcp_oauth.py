"""OAuth for HTTP MCP servers (the MCP authorization spec), through the MCP SDK's own client.

A daemon has no browser, so there are two grants:

- **client credentials** (machine to machine, the default): the admin registers Chital as a
  client at the authorization server and configures ``oauth.client_id``, ``oauth.client_secret``
  (a secret) and ``oauth.issuer``;
- **authorization code** (``grant: authorization_code``): an operator runs ``chital mcp login
  NAME`` once (agent/tools/mcp_login.py: it prints the authorization URL and receives the code on
  a loopback redirect); the daemon then uses and refreshes the stored tokens, and when the refresh
  token is refused (revoked) it raises :class:`LoginRequired` instead of opening a browser.

For client credentials, the SDK's
:class:`~mcp.client.auth.extensions.client_credentials.ClientCredentialsOAuthProvider` (an
``httpx.Auth``) does the rest on the server's first 401: protected resource metadata (RFC 9728),
authorization server metadata (RFC 8414, whose ``issuer`` must be the configured one: the secret is
never sent to a server the MCP server merely points at), the token request, the bearer header on
every request, and a refresh with the refresh token (if the server issued one) once the access
token expires, falling back to a new client-credentials grant when the refresh is refused.

Chital adds:

- :class:`FileTokenStorage`: the tokens in the data directory (``mcp-oauth/``, 0700; one file per
  server, 0600, written atomically, with the client registration of the authorization code
  grant), so a restart does not fetch new ones; keyed by the server's URL, grant, issuer and
  client id so a changed config never reuses another's tokens.
- :func:`oauth_error`: the token endpoint's refusal (``invalid_client``, ``invalid_grant``: a
  revoked or wrong client) or a needed login in Chital's words, *not worth retrying*: the catalog marks the
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
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
from mcp.client.auth import (
    OAuthClientProvider,
    OAuthFlowError,
    OAuthRegistrationError,
    OAuthTokenError,
    TokenStorage,
)
from mcp.client.auth.extensions.client_credentials import ClientCredentialsOAuthProvider
from mcp.shared.auth import OAuthClientInformationFull, OAuthClientMetadata, OAuthToken
from pydantic import AnyUrl

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


class FileTokenStorage(TokenStorage):
    """The SDK's ``TokenStorage`` in one JSON file (0600, in a 0700 directory, replaced atomically).

    Read at each use, so tokens ``chital mcp login`` stored are what the daemon's next session
    (after ``/mcp reload``) finds. An unreadable or malformed file counts as empty."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _write(self, **values: Any) -> None:
        data = self._read()
        data.update(values)
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            os.chmod(self.path.parent, 0o700)
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f)
        os.chmod(tmp, 0o600)
        os.replace(tmp, self.path)

    async def get_tokens(self) -> OAuthToken | None:
        data = self._read()
        try:
            tokens = OAuthToken.model_validate(data["tokens"]) if data.get("tokens") else None
        except ValueError:
            return None
        expires_at = data.get("expires_at")
        if tokens is not None and isinstance(expires_at, int | float) and expires_at <= time.time() + 30:
            # The SDK's provider only knows the expiry of tokens it fetched in this process: handed
            # a stored one, it would send it and, on the 401, start a full authorization (for the
            # authorization code grant: a login the daemon cannot do). Without its access token,
            # an expired token is refreshed first (or, with no refresh token, fetched anew).
            return tokens.model_copy(update={"access_token": "", "expires_in": None})
        return tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        expires_at = time.time() + tokens.expires_in if tokens.expires_in is not None else None
        self._write(tokens=tokens.model_dump(mode="json", exclude_none=True), expires_at=expires_at)

    def forget_tokens(self) -> None:
        """Drop the stored tokens (a login authorizes anew), keeping the client registration."""
        if self.path.exists():
            self._write(tokens=None, expires_at=None)

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        raw = self._read().get("client")
        try:
            return OAuthClientInformationFull.model_validate(raw) if raw else None
        except ValueError:
            return None

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self._write(client=client_info.model_dump(mode="json", exclude_none=True))


class LoginRequired(OAuthFlowError):
    """An ``authorization_code`` server needs an operator's ``chital mcp login NAME``: no tokens
    yet, or its refresh token was refused (revoked). The daemon cannot open a browser."""

    def __init__(self, name: str) -> None:
        super().__init__(f"authorization revoked or missing: run chital mcp login {name}")


def token_path(token_dir: Path, name: str, config: McpServer) -> Path:
    """The token file of server ``name``: its name (made safe) and a digest of what the tokens
    belong to, so a server pointed elsewhere or given another client starts afresh."""
    oauth = config.oauth
    assert oauth is not None
    key = "\n".join([config.url or "", oauth.grant, oauth.issuer or "", oauth.client_id or ""])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return token_dir / f"{_SAFE.sub('_', name)[:64]}-{digest}.json"


def redirect_uri(config: McpServer) -> str:
    assert config.oauth is not None
    return f"http://127.0.0.1:{config.oauth.redirect_port}/callback"


def storage_for(name: str, config: McpServer, token_dir: Path | None) -> TokenStorage:
    return FileTokenStorage(token_path(token_dir, name, config)) if token_dir else MemoryTokenStorage()


async def has_tokens(storage: TokenStorage) -> bool:
    return await storage.get_tokens() is not None


def build_auth(
    name: str,
    config: McpServer,
    storage: TokenStorage,
    *,
    redirect: Callable[[str], Awaitable[None]] | None = None,
    callback: Callable[[], Awaitable[tuple[str, str | None]]] | None = None,
) -> httpx.Auth:
    """The SDK's OAuth provider for server ``name``: client credentials, or the authorization code
    grant whose ``redirect``/``callback`` (``chital mcp login``'s) default to raising
    :class:`LoginRequired` (the daemon's)."""
    oauth = config.oauth
    assert oauth is not None and config.url is not None
    _QuietSdkLog.install()
    secret = oauth.client_secret.get_secret_value() if oauth.client_secret else None
    if oauth.grant == "client_credentials":
        assert oauth.client_id and secret and oauth.issuer
        return ClientCredentialsOAuthProvider(
            server_url=config.url,
            storage=storage,
            client_id=oauth.client_id,
            client_secret=secret,
            token_endpoint_auth_method=oauth.token_endpoint_auth_method,
            scopes=oauth.scopes,
            issuer=oauth.issuer,
        )

    async def no_browser(*_: Any) -> Any:
        raise LoginRequired(name)

    method = oauth.token_endpoint_auth_method if secret else "none"
    metadata = OAuthClientMetadata(
        redirect_uris=[AnyUrl(redirect_uri(config))],
        grant_types=["authorization_code", "refresh_token"],
        response_types=["code"],
        token_endpoint_auth_method=method,
        client_name="Chital",
        scope=oauth.scopes,
    )
    provider = OAuthClientProvider(
        server_url=config.url,
        client_metadata=metadata,
        storage=_Preregistered(storage, config) if oauth.client_id else storage,
        redirect_handler=redirect or no_browser,
        callback_handler=callback or no_browser,
    )
    return provider


class _Preregistered(TokenStorage):
    """A storage whose client is the configured one (no dynamic registration)."""

    def __init__(self, inner: TokenStorage, config: McpServer) -> None:
        oauth = config.oauth
        assert oauth is not None and oauth.client_id
        self._inner = inner
        self._client = OAuthClientInformationFull(
            client_id=oauth.client_id,
            client_secret=oauth.client_secret.get_secret_value() if oauth.client_secret else None,
            redirect_uris=[AnyUrl(redirect_uri(config))],
            grant_types=["authorization_code", "refresh_token"],
            token_endpoint_auth_method=oauth.token_endpoint_auth_method if oauth.client_secret else "none",
            scope=oauth.scopes,
            issuer=oauth.issuer,
        )

    async def get_tokens(self) -> OAuthToken | None:
        return await self._inner.get_tokens()

    async def set_tokens(self, tokens: OAuthToken) -> None:
        await self._inner.set_tokens(tokens)

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self._client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        return None


def oauth_error(exc: BaseException) -> tuple[str, bool] | None:
    """(reason, worth retrying) for an OAuth failure of the SDK's flow, else None.

    The token endpoint refusing the client or its grant (revoked, wrong secret) is not retried:
    retrying would only hit the token endpoint again with the same refused credentials."""
    if isinstance(exc, LoginRequired):
        return str(exc), False
    if isinstance(exc, OAuthTokenError | OAuthRegistrationError):
        return (
            "authorization refused or revoked by its authorization server: check its oauth "
            "client_id/client_secret, then /mcp reload",
            False,
        )
    if isinstance(exc, OAuthFlowError):
        return "OAuth discovery failed (no authorization server metadata matching oauth.issuer)", True
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
