"""The versions each reach into a library's internals was verified against, and the check of them.

Chital reaches into a few libraries' private names (a private method overridden, a private module
imported, a checkpoint table written with our own SQL) where the public API costs too much or has
no hook. Each reach lives in one module per library (``compat/`` for the agent's libraries, the
adapter's own ``sdk`` module for a chat platform's SDK: :data:`VERIFIED` names it) and nowhere
else (tests/test_vendor_boundary.py). This table is the one statement of which releases those
reaches were verified on; pyproject.toml pins each distribution to the same set
(tests/test_vendor_boundary.py compares them).

Outside its set, a reach with a public fallback takes it (the module's :func:`usable` answers
False, so it skips an optimisation or imports the public equivalent) and the daemon says so in one
line at start-up; a reach with no public path makes the daemon refuse to start (one line, exit 1):
running on internals nobody checked could corrupt state or drop messages silently.

The table is data, not imports: ``compat`` imports none of gateway, channels and agent.
"""

from __future__ import annotations

import functools
import importlib.metadata
from collections.abc import Callable
from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

VersionOf = Callable[[str], str]
"""``importlib.metadata.version``'s shape: a distribution's installed version, or
``PackageNotFoundError``."""


@dataclass(frozen=True, slots=True)
class Verified:
    """One distribution Chital reaches into: the releases it was verified on and what happens
    outside them."""

    distribution: str
    specifier: str
    """A ``packaging`` SpecifierSet, the same as the pin in pyproject.toml."""
    module: str
    """Where the reaches live (the one module allowed to use the package's private names)."""
    fallback: str | None
    """What Chital does outside ``specifier`` (the public path), or None: refuse to start."""


VERIFIED: dict[str, Verified] = {
    v.distribution: v
    for v in (
        Verified(
            "openai",
            ">=3.57,<3.58",
            "compat/openai_client.py",
            "streamed chunks are parsed into the SDK's typed objects (slower)",
        ),
        Verified(
            "langchain-openai",
            ">=1.7,<1.8",
            "compat/langchain_openai.py",
            "requests go through the SDK's own transform, tool schemas are not memoised (slower)",
        ),
        Verified(
            "langchain-core",
            ">=1.8,<1.9",
            "compat/langchain_core.py",
            "the token tap is a plain callback handler, content block types are not memoised",
        ),
        Verified(
            "langchain",
            ">=1.4,<1.5",
            "compat/langchain.py",
            "retry delays use Chital's own backoff, model-call middleware is not merged and hooks keep"
            " LangSmith's wrapper (slower)",
        ),
        Verified(
            "langgraph-checkpoint-sqlite",
            ">=3.1,<3.2",
            "compat/langgraph.py",
            "the checkpointer reads every history from the database and writes a step's writes as"
            " SqliteSaver does (no in-memory history, row-by-row commits), and prunes no checkpoints",
        ),
        Verified(
            "langgraph-checkpoint-postgres",
            ">=3.2,<3.3",
            "compat/langgraph.py",
            "the PostgreSQL checkpointer hands each (de)serialisation to a worker thread and reads"
            " every history from the database (no in-memory history: slower)",
        ),
        Verified(
            "deepagents",
            ">=0.7,<0.8",
            "compat/deepagents.py",
            "every model call goes through deepagents' token count; a failed summary call fails the turn",
        ),
        Verified(
            "aiohttp",
            ">=3.14,<3.15",
            "compat/aiohttp.py",
            "web_fetch checks addresses at the socket only (allow_hosts name entries then refuse)",
        ),
        Verified(
            "docker",
            ">=7.1,<7.2",
            "compat/docker.py",
            "a shared engine's file operations read with no per-read socket timeout (the operation's"
            " deadline is checked between frames)",
        ),
        Verified(
            "kubernetes",
            ">=37,<38",
            "compat/kubernetes.py",
            "exec output is read through the client's public buffered reader (unbounded between"
            " reads, stopped by polling)",
        ),
        Verified(
            "websocket-client",
            ">=1.9,<1.10",
            "compat/kubernetes.py",
            "an exec websocket's frames are read whole, with no cap on one frame's size (the"
            " output's own cap applies after)",
        ),
        Verified(
            "python-telegram-bot",
            ">=22.8,<22.9",
            "channels/telegram/sdk.py",
            "raw Bot API calls go through the public Bot.do_api_request",
        ),
        Verified(
            "discord.py",
            ">=2.7,<2.8",
            "channels/discord/sdk.py",
            None,
        ),
        Verified(
            "lark-oapi",
            ">=1.7.5,<1.8",
            "channels/lark/_ws.py",
            None,
        ),
    )
}
"""Every distribution whose private names Chital uses, by distribution name."""


@dataclass(frozen=True, slots=True)
class Problem:
    """An installed distribution outside the releases its reaches were verified on."""

    verified: Verified
    installed: str

    @property
    def fatal(self) -> bool:
        """No public path: the daemon must not start on it."""
        return self.verified.fallback is None

    def line(self) -> str:
        """The one line the daemon logs and ``chital check`` prints."""
        v = self.verified
        then = (
            f"using the public path: {v.fallback}" if v.fallback else "no public fallback, refusing to start"
        )
        return (
            f"vendor internals: {v.distribution} {self.installed} is outside the verified"
            f" {v.specifier} ({v.module}); {then}"
        )


def _outside(v: Verified, version_of: VersionOf) -> str | None:
    """The installed version when it is outside ``v.specifier``; None inside it or not installed
    (an optional extra such as the PostgreSQL checkpointer: nothing of it runs)."""
    try:
        installed = version_of(v.distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    try:
        inside = Version(installed) in SpecifierSet(v.specifier)
    except InvalidVersion:
        inside = False
    return None if inside else installed


def check_all(version_of: VersionOf = importlib.metadata.version) -> list[Problem]:
    """Every distribution of :data:`VERIFIED` installed outside its verified set."""
    problems: list[Problem] = []
    for v in VERIFIED.values():
        installed = _outside(v, version_of)
        if installed is not None:
            problems.append(Problem(v, installed))
    return problems


@functools.cache
def usable(distribution: str) -> bool:
    """Whether the private reaches into ``distribution`` may be used: its installed release is one
    they were verified on. Read once per process (a library is not upgraded under a running one)."""
    return _outside(VERIFIED[distribution], importlib.metadata.version) is None
