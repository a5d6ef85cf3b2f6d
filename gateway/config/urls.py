"""Database URLs: which engine a URL names, the passwords it carries, and how to show it.

In config (the bottom layer) because both the config's secret collection (the log redactor) and
the store need them, and config must not import the store.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, unquote, urlsplit


def is_postgres_url(url: str) -> bool:
    return url.startswith(("postgresql://", "postgres://"))


_URL_SECRET_PARAMS = ("password", "sslpassword")
_QUERY_SECRET = re.compile(r"(?i)((?:^|[?&])(?:ssl)?password=)[^&#]*")


def url_passwords(url: str | None) -> list[str]:
    """The passwords a PostgreSQL URL carries, as written and decoded: its ``user:password`` part
    and libpq's ``?password=`` (and ``sslpassword``) parameters. For the log redactor."""
    if not url:
        return []
    parts = urlsplit(url)
    creds = parts.netloc.rpartition("@")[0]
    found = [creds.partition(":")[2]] if ":" in creds else []
    found += [m.group(0).split("=", 1)[1] for m in _QUERY_SECRET.finditer(parts.query)]
    found += [v for k, v in parse_qsl(parts.query) if k.lower() in _URL_SECRET_PARAMS]
    return [s for s in {*found, *map(unquote, found)} if s]


def mask_url_query(url: str) -> str:
    """``url`` with its ``?password=`` (and ``sslpassword``) parameters masked."""
    head, sep, query = url.partition("?")
    return head + sep + _QUERY_SECRET.sub(r"\1***", query) if sep else url


def database_label(url: str) -> str:
    """Where a PostgreSQL URL points, fit to show: hosts, ports and database only (no user, no
    password, no query: libpq takes ``?password=`` there too)."""
    parts = urlsplit(url)
    return parts.netloc.rpartition("@")[2] + parts.path
