"""The daemon's secret values, from one place, and the one redactor built from them.

Every egress point masks with :func:`redactor_for` (docs/security.md, "Secrets by value"): the
channels' outbound calls (``Channel.egress``, set by :meth:`gateway.daemon.gateway.Gateway.attach`), the log
filter and the recent errors (gateway/ops/logs.py), ``/readyz``, ``/metrics`` and the status socket,
``chital status``, and the agent (:class:`agent.runtime.AgentRuntime` gets :func:`daemon_secrets`
for tool results and approval prompts).

What counts as a secret: every ``SecretStr`` of the config (channel tokens, model and service keys,
MCP headers and environments), the models' ``api_key`` arguments, token-prefixed plain strings, the
passwords of every URL in the config (``storage.url`` and ``$CHITAL_DATABASE_URL`` included) and
the values of the environment variables that hold credentials: those the platforms declare for their
secret fields (``TELEGRAM_BOT_TOKEN``, ``SLACK_BOT_TOKEN``…), ``OPENAI_API_KEY`` (the model SDK reads
it without the config), and any other whose name says it is one (``*_TOKEN``, ``*_SECRET``,
``*_PASSWORD``, ``*_API_KEY``…): the daemon's environment is the operator's, and a value there a
tool manages to print is one the operator never meant to share.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from urllib.parse import parse_qsl, unquote, urlsplit

from pydantic import BaseModel, SecretStr

from agent.redact import MIN_SECRET_CHARS, Redactor
from gateway.config.platforms import PLATFORMS
from gateway.config.schema import Config
from gateway.config.urls import url_passwords

ALWAYS_SECRET_ENV = ("OPENAI_API_KEY", "CHITAL_DATABASE_URL")
"""Read by the daemon (or its model SDK) straight from the environment, whatever the config says."""
SECRET_ENV_NAME = re.compile(
    r"(?i)(token|secret|passw(or)?d|passphrase|api_?key|access_?key|private_?key|credential|_key$|_pat$)"
)
"""Names of environment variables whose values are credentials."""
_TOKEN_PREFIXES = ("sk-", "xox", "xapp-", "ghp_", "github_pat_", "glpat-")
_URL_SECRET_PARAMS = re.compile(r"(?i)(pass|secret|token|key|sig|auth)")


def _url_secrets(text: str) -> list[str]:
    """The password of a URL's ``user:password@`` and its credential-named query values."""
    if "://" not in text:
        return []
    try:
        parts = urlsplit(text.strip())
        found = [parts.password] if parts.password else []
    except ValueError:
        return []
    found += [v for k, v in parse_qsl(parts.query) if _URL_SECRET_PARAMS.search(k)]
    return [*found, *map(unquote, found)]


def _walk(node: object, found: list[str]) -> None:
    if isinstance(node, SecretStr):
        value = node.get_secret_value()
        found += [value, *_url_secrets(value)]
    elif isinstance(node, BaseModel):
        for name in type(node).model_fields:
            _walk(getattr(node, name, None), found)
        for value in (getattr(node, "model_extra", None) or {}).values():
            _walk(value, found)
    elif isinstance(node, Mapping):
        for value in node.values():
            _walk(value, found)
    elif isinstance(node, list | tuple | set | frozenset):
        for item in node:
            _walk(item, found)
    elif isinstance(node, str):
        if node.startswith(_TOKEN_PREFIXES):
            found.append(node)
        found += _url_secrets(node)


def secret_env_names() -> set[str]:
    """The environment variables whose values the daemon treats as secrets (see the module)."""
    names = set(ALWAYS_SECRET_ENV)
    for platform in PLATFORMS:
        fields = platform.settings.model_fields
        for field, env in platform.settings.required.items():
            if fields[field].annotation is not None and "SecretStr" in str(fields[field].annotation):
                names.add(env)
    return names | {name for name in os.environ if SECRET_ENV_NAME.search(name)}


def daemon_secrets(cfg: Config, environ: Mapping[str, str] | None = None) -> list[str]:
    """Every secret value the daemon holds (config and environment), longest first."""
    env = os.environ if environ is None else environ
    found: list[str] = []
    _walk(cfg, found)
    for spec in cfg.models:
        for key in ("api_key", "openai_api_key"):
            value = spec.kwargs().get(key)
            _walk(value, found)
            if isinstance(value, str):
                found.append(value)
    found += url_passwords(cfg.storage.database_url)
    for name in secret_env_names():
        value = env.get(name, "")
        if value:
            found += [value, *_url_secrets(value)]
    return sorted({s for s in found if len(s) >= MIN_SECRET_CHARS}, key=len, reverse=True)


_CACHE: dict[int, tuple[Config, Redactor]] = {}


def redactor_for(cfg: Config, extra: Iterable[str] = ()) -> Redactor:
    """The redactor of ``cfg``'s secrets (plus ``extra``), built once per config object."""
    extra = tuple(extra)
    cached = _CACHE.get(id(cfg))
    if cached is not None and cached[0] is cfg and not extra:
        return cached[1]
    redactor = Redactor([*daemon_secrets(cfg), *extra])
    if not extra:
        _CACHE.clear()  # one daemon, one config: never a growing map
        _CACHE[id(cfg)] = (cfg, redactor)
    return redactor
