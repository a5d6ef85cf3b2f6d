"""Settings of the agent's features, in one light module.

``agent.config`` (and so ``gateway.config.schema`` and ``chital check``) needs these models but none of the
libraries the features themselves import (deepagents, the MCP SDK, BeautifulSoup...). Each feature
module re-exports its own settings from here.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator


class ContextSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    summarize_after_tokens: int | None = Field(60_000, ge=1)
    """Summarize older history once the request (messages, system prompt, tools) is this many
    tokens (approximate count); None turns summarization off."""
    summarize_after_messages: int | None = Field(120, ge=2)
    """...or once the model would see this many messages, however short: a long conversation then
    costs what a short one does (its state holds the summary and the messages since, and older
    checkpoints are pruned: agent/compaction.py). None: the token count alone decides. Only with
    ``summarize_after_tokens`` set."""
    keep_recent_messages: int = Field(20, ge=1)
    """Messages kept verbatim after a summary (tool calls stay with their results)."""
    summary_input_tokens: int | None = Field(8_000, ge=1)
    """Tokens of older history the summary call reads (its most recent part); None = all."""
    loop_warn_after: int = Field(3, ge=2)
    """The same tool with the same arguments this many times in a turn: warn the model."""
    loop_stop_after: int = Field(5, ge=2)
    """...this many times: the next model call must answer in text (no tools)."""
    title: Literal["model", "truncate", "off"] = "model"
    """Thread title: a short model call, the first message cut short, or none."""
    title_max_chars: int = Field(60, ge=10)
    title_timeout: float = Field(10.0, gt=0)
    guardrail_timeout: float = Field(10.0, gt=0)
    """Seconds a guardrail may take; a slow guardrail denies (fail-closed)."""
    tool_error_max_chars: int = Field(500, ge=50)

    @model_validator(mode="after")
    def _loop_order(self) -> ContextSettings:
        if self.loop_stop_after <= self.loop_warn_after:
            raise ValueError("loop_stop_after must be greater than loop_warn_after")
        return self


class ApprovalSettings(BaseModel):
    """Which tool calls need a person's yes before they run, and which never run (docs/approvals.md).

    Tool names may be patterns (``mcp_github_*``, fnmatch style). Empty lists: every tool runs."""

    model_config = ConfigDict(extra="forbid")

    tools: list[str] = Field(default_factory=list)
    """Tools whose every call waits for Approve / Deny in the chat (e.g. ``execute``,
    ``write_file``, ``web_fetch``)."""
    deny: list[str] = Field(default_factory=list)
    """Tools refused outright (the guardrail): the model is told they are blocked by policy."""
    timeout: float = Field(600.0, gt=0, le=86_400)
    """Seconds a request waits for an answer (at most a day); then it counts as denied."""
    approvers: Literal["requester", "admins"] = "requester"
    """Who may answer: the person whose message led to the call (and the channel's admins), or
    the admins (``access.admins``) only."""
    standing: bool = True
    """Offer "Allow here" (the requester's calls of that tool in that conversation) and, to admins,
    "Always" (everyone's, on that platform) beside Approve / Deny; ``/approvals`` lists and revokes
    them. A call made after the turn read content its user did not write always asks. Off: every
    call asks, and existing permissions are not used."""


class MemorySettings(BaseModel):
    """Long-term memory per user. The gateway embeds this in its agent settings."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    """Off: no injection and no extraction; ``list``/``forget`` still work on what is stored."""
    debounce_seconds: float = Field(20.0, ge=0)
    """Extraction waits this long after a user's last finished turn, so a burst is one model call."""
    max_delay_seconds: float = Field(300.0, ge=0)
    """A user who never pauses still gets extraction this long after the first pending turn."""
    placement: Literal["system", "message"] = "system"
    """Where the section goes: appended to the system prompt, or prepended to the current user
    message of the model call only (never stored). "message" keeps the prompt prefix stable, so a
    provider's prompt cache survives new facts and, in group chats, alternating senders."""
    token_budget: int = Field(400, ge=0)
    """Tokens (estimated as characters / 4) the injected section may take, header included."""
    retention_days: int | None = Field(None, ge=1)
    """Facts not created or updated for this long are pruned; None keeps them."""
    max_facts_per_user: int = Field(200, ge=1)
    """Beyond this, the least recently updated facts of the user are dropped."""
    db_path: Path | None = None
    """SQLite file of the memory store; None lets the gateway choose (next to the checkpoints)."""
    extraction_timeout: float = Field(120.0, gt=0)
    """Seconds one extraction call may take."""
    extraction_retries: int = Field(2, ge=0, le=10)
    """Retries of an extraction that failed on a transient model error (timeout, 429, 5xx)."""
    max_turns_per_extraction: int = Field(20, ge=1)
    """Pending turns one extraction call reads (oldest first); more go to the next call."""
    max_turn_chars: int = Field(2000, ge=100)
    """Each message of a turn is cut to this many characters before it goes to extraction."""


class SkillsSettings(BaseModel):
    """Which skills the agent sees. The gateway embeds this in ``AgentSettings``."""

    model_config = ConfigDict(extra="forbid")

    enabled: list[str] | None = None
    """Names of the skills to offer; ``None`` offers every skill found."""
    disabled: list[str] = Field(default_factory=list)
    """Names never offered (wins over ``enabled``)."""
    public_dir: Path | None = None
    """Skills shipped with Chital. Unset: those of this installation (``skills/public`` of the
    source tree Chital runs from, or beside the config file, as in the Docker image), wherever
    the config file lives."""
    custom_dir: Path = Path("skills/custom")
    """The operator's skills; one here replaces the public skill of the same name. ``chital skills
    install`` and an admin's ``/skills install`` put skills here."""
    drafting: bool = True
    """Give the agent the ``draft_skill`` tool: it can write a new skill from a conversation, which
    waits in ``custom_dir/.drafts`` until an admin approves it (never offered before)."""
    reload_seconds: float = Field(2.0, ge=0)
    """How often, at most, the skill folders are looked at for changes (a few ``stat`` calls when a
    model call or a ``/skill`` message needs the list); a change is loaded without a restart."""

    def public(self) -> Path:
        """``public_dir``, or the shipped skills when it is unset."""
        return self.public_dir if self.public_dir is not None else shipped_skills_dir()


def shipped_skills_dir() -> Path:
    """``skills/public`` of the source tree the ``agent`` package was loaded from (a checkout, or
    the editable install ``scripts/setup.sh`` makes); it may be missing in a wheel install."""
    return Path(__file__).resolve().parent.parent / "skills" / "public"


class SubagentSettings(BaseModel):
    """Limits of the ``task`` tool. The lead's ``AgentSettings`` embeds this as ``subagents``."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    max_concurrent: int = Field(3, ge=1, le=16)
    """Sub-agents one turn may run at once; further ``task`` calls are refused."""
    timeout_seconds: float = Field(900.0, gt=0)
    """Wall-clock limit of one sub-agent run; it is then cancelled and reported as timed out."""
    max_steps: int = Field(20, ge=1)
    """Model calls one sub-agent run may make; the last one must answer in text."""


class McpOAuth(BaseModel):
    """OAuth of an HTTP MCP server that asks for it (docs/tools-and-mcp.md). A daemon has no
    browser: ``client_credentials`` (machine to machine, the default) needs ``client_id``,
    ``client_secret`` and ``issuer``; ``authorization_code`` is authorized once by an operator
    with ``chital mcp login NAME`` and then refreshed by the daemon."""

    model_config = ConfigDict(extra="forbid")

    grant: Literal["client_credentials", "authorization_code"] = "client_credentials"
    """``client_credentials``, or ``authorization_code`` (one-time ``chital mcp login NAME``)."""
    client_id: str | None = Field(None, min_length=1)
    """The client id the authorization server issued to Chital (``authorization_code``: optional,
    else Chital registers itself, RFC 7591)."""
    client_secret: SecretStr | None = None
    """The client's secret (``${VAR}`` is expanded); never logged."""
    issuer: str | None = Field(None, pattern=r"^https?://")
    """The authorization server's issuer URL (required for ``client_credentials``): the secret is
    only ever sent to the server whose RFC 8414 metadata names exactly this issuer, whatever the
    MCP server advertises."""
    scopes: str | None = None
    """Space-separated scopes to ask for (default: none requested)."""
    token_endpoint_auth_method: Literal["client_secret_basic", "client_secret_post"] = "client_secret_basic"
    """How the secret is presented at the token endpoint."""
    redirect_port: int = Field(33418, ge=1024, le=65535)
    """``authorization_code``: the loopback port ``chital mcp login`` receives the code on
    (``http://127.0.0.1:PORT/callback``, the redirect URI registered with the server)."""

    @model_validator(mode="after")
    def _check(self) -> McpOAuth:
        if self.grant == "client_credentials" and not (self.client_id and self.client_secret and self.issuer):
            raise ValueError("the client_credentials grant needs client_id, client_secret and issuer")
        return self


class McpServer(BaseModel):
    """One MCP server: ``command``/``args``/``env`` for stdio, ``url``/``headers`` for HTTP."""

    model_config = ConfigDict(extra="forbid")

    transport: Literal["stdio", "streamable_http", "sse"] = "stdio"
    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, SecretStr] | None = None
    """Extra environment of a stdio server (values may be secrets; ``${VAR}`` is expanded)."""
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, SecretStr] | None = None
    """HTTP headers (e.g. Authorization); kept as secrets, never logged."""
    oauth: McpOAuth | None = None
    """OAuth client credentials (HTTP transports): tokens are fetched, stored in the data directory
    (0600) and refreshed by the MCP SDK's OAuth client."""
    timeout: float = Field(30.0, gt=0)
    """Seconds the server may take to start and list its tools."""
    call_timeout: float = Field(300.0, gt=0)
    """Seconds one tool call may take; the model then gets a tool error naming the server."""
    enabled: bool = True

    @model_validator(mode="after")
    def _check(self) -> McpServer:
        if self.transport == "stdio" and not self.command:
            raise ValueError("a stdio MCP server needs 'command'")
        if self.transport != "stdio" and not self.url:
            raise ValueError(f"a {self.transport} MCP server needs 'url'")
        if self.oauth is not None and self.transport == "stdio":
            raise ValueError("'oauth' is for streamable_http and sse servers")
        if self.oauth is not None and any(k.lower() == "authorization" for k in self.headers or {}):
            raise ValueError("give a server either 'oauth' or an Authorization header, not both")
        return self

    def connection(self) -> dict[str, Any]:
        """The adapter's connection dict (secrets revealed here only)."""
        if self.transport == "stdio":
            conn: dict[str, Any] = {"transport": "stdio", "command": self.command, "args": list(self.args)}
            if self.env is not None:
                conn["env"] = {k: v.get_secret_value() for k, v in self.env.items()}
            if self.cwd:
                conn["cwd"] = self.cwd
            return conn
        conn = {"transport": self.transport, "url": self.url}
        if self.headers:
            conn["headers"] = {k: v.get_secret_value() for k, v in self.headers.items()}
        return conn

    def secrets(self) -> list[str]:
        values = [*(self.env or {}).values(), *(self.headers or {}).values()]
        if self.oauth is not None and self.oauth.client_secret is not None:
            values.append(self.oauth.client_secret)
        return [v.get_secret_value() for v in values if len(v.get_secret_value()) >= 6]


class McpSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    servers: dict[str, McpServer] = Field(default_factory=dict)
    tool_name_prefix: bool = False
    """Name tools ``<server>_<tool>``: set it when two servers offer tools of the same name."""
    max_response_bytes: int = Field(16 * 1024 * 1024, ge=1024)
    """Bytes one HTTP response of an MCP server may have; reading stops past it and the call gets
    a tool error (what reaches the model is cut further by the tool output cap)."""
    reconnect_backoff: float = Field(2.0, gt=0)
    """Seconds before the first retry of a failed server; doubled each time, up to 5 minutes."""
    max_schema_chars: int = Field(10_000, ge=500, le=200_000)
    """Characters of a tool's input schema (as JSON) at most: a larger tool is left out when the
    server's tools are listed (noted in ``/mcp`` and the log), since a schema cannot be cut and
    stay valid, and it would land in every request that binds the tool."""
    max_tools_per_server: int = Field(1000, ge=1, le=10_000)
    """Tools taken from one server at most; the rest are left out (noted in ``/mcp`` and the log)."""

    def secrets(self) -> list[str]:
        """Configured secret values, for redaction of tool error texts."""
        return [s for server in self.servers.values() for s in server.secrets()]


class ToolSearchSettings(BaseModel):
    """Deferred tools (docs/tools-and-mcp.md): only the core tools are bound to every model call;
    the others (MCP tools first) are found with ``tool_search`` and callable once found."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    """Off: every tool, MCP ones included, is bound to every model call (and no ``tool_search``)."""
    core: list[str] = Field(default_factory=lambda: ["@builtin"])
    """Tools always bound: names or fnmatch patterns (``mcp_github_*``); ``@builtin`` stands for
    every tool that is not from an MCP server. Without ``@builtin``, built-in tools not listed are
    deferred too."""
    remember: Literal["turn", "thread"] = "turn"
    """How long a found tool stays callable: the rest of the turn, or the whole conversation (kept
    in the thread's checkpoint)."""
    max_results: int = Field(5, ge=1, le=20)
    """Tools one search returns (and makes callable)."""
    description_chars: int = Field(200, ge=40, le=1000)
    """Characters of a tool's description a search result shows (the text comes from the server)."""
    max_loaded: int = Field(20, ge=1, le=100)
    """Found tools bound to a model call at most: past it, the ones found longest ago are
    unloaded (a search finds them again), so searches cannot grow the request without end."""


class WebSettings(BaseModel):
    """Web tools. ``web_search`` works with no key (DuckDuckGo's HTML page); ``search_provider``
    picks another provider, "none" keeps ``web_search`` answering that it is off (docs/search.md)."""

    model_config = ConfigDict(extra="forbid")

    search_provider: Literal["duckduckgo", "brave", "searxng", "exa", "tavily", "jina", "none"] = "duckduckgo"
    """Who answers ``web_search``: ``duckduckgo`` needs no key; ``brave``, ``exa``, ``tavily`` and
    ``jina`` need ``api_key``; ``searxng`` needs ``base_url`` (your instance)."""
    api_key: SecretStr | None = None
    """The key of a keyed provider (Brave: X-Subscription-Token, Exa: x-api-key, Tavily and Jina:
    a Bearer token). Sent only to that provider; never logged, shown or given to the model."""
    base_url: str | None = None
    """The provider's address, overriding its public one (SearXNG: the instance URL, required;
    others: a proxy or a test fake). Provider requests may reach this host even when it is not
    public; ``web_fetch`` may not, unless ``allow_hosts`` lists it."""
    max_results: int = Field(5, ge=1, le=20)
    search_timeout: float = Field(15.0, gt=0)
    """Seconds one provider request may take in total."""
    max_search_bytes: int = Field(2 * 1024 * 1024, ge=16 * 1024)
    """Bytes of a provider's answer read at most; a larger answer is an error (a search answer
    is a few KB: more is a broken or hostile endpoint), and is never read whole."""
    search_cache_ttl: float = Field(300.0, ge=0)
    """Seconds a provider's answer to a query is reused (per provider and query); 0: no cache."""
    search_cache_size: int = Field(256, ge=1)
    """Queries kept in the search cache; the least recently used goes first."""
    fetch_timeout: float = Field(20.0, gt=0)
    """Seconds one ``web_fetch`` may take in total, redirects included."""
    max_fetch_bytes: int = Field(2_000_000, ge=1024)
    """Body bytes read per page; the rest is dropped (and the result says so)."""
    max_chars: int = Field(40_000, ge=1000)
    """Characters of Markdown handed to the model."""
    max_redirects: int = Field(5, ge=0, le=20)
    user_agent: str = "Mozilla/5.0 (compatible; Chital/0.1; +web_fetch)"
    allow_hosts: list[str] = Field(default_factory=list)
    """Internal hosts ``web_fetch`` may reach although they are not public: exact names
    (``wiki.internal``, only for URLs naming that host), ``*.corp.example`` (any name under it),
    IP addresses (``10.1.2.3``) and networks (``10.0.0.0/8``, ``fd00::/8``). Empty: public only."""

    @field_validator("base_url")
    @classmethod
    def _check_base_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        from urllib.parse import urlsplit

        parts = urlsplit(value.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("base_url is not an http(s) URL with a host")
        if parts.username or parts.password:
            raise ValueError("base_url must not carry credentials: put the key in api_key")
        return value.strip()

    @field_validator("allow_hosts")
    @classmethod
    def _check_allow_hosts(cls, value: list[str]) -> list[str]:
        out = []
        for raw in value:
            entry = raw.strip()
            try:
                ipaddress.ip_network(entry.strip("[]"), strict=False)
            except ValueError:
                name = entry.removeprefix("*.")
                if not name or any(c in name for c in "/:@*?#[]% \t"):
                    raise ValueError(
                        f"allow_hosts entry {raw!r} is neither a host name, '*.suffix', an IP nor a network"
                    ) from None
            out.append(entry)
        return out

    def secrets(self) -> list[str]:
        """Configured secret values, for redaction of tool error texts."""
        return [self.api_key.get_secret_value()] if self.api_key is not None else []
