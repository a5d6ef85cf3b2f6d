"""The console's login: an admin token exchanged for a session cookie, CSRF tokens, the origin check
and the failed-login limit (docs/console.md, "Security model").

Sessions live in this process's memory: one daemon serves its console, a restart logs everyone out
(an operator logs in again with the token). In a cluster each daemon has its own sessions; the
pages read the shared database, so every daemon shows the same state.

Why each piece: the cookie is HttpOnly (a script that got in cannot read it), SameSite=Strict (a
link or a form on another site does not carry it) and scoped to ``/console``; the CSRF token (one
per session, in every form, compared in constant time) stops a forged request that somehow carries
the cookie; the Origin/Referer check refuses a state-changing request that names another site or
none; the failed-login limit (per client address and for all addresses together) turns guessing the
token into years. The token itself is never logged, echoed or put in a page.
"""

from __future__ import annotations

import collections
import hmac
import logging
import secrets
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from aiohttp import web

from gateway.config.console import ConsoleConfig
from gateway.config.durations import about

log = logging.getLogger(__name__)

COOKIE = "chital_console"
PATH = "/console"
ACTOR = "console:admin"
"""Who a console action is recorded as (the chat commands record the admin's ``platform:id``)."""
MAX_SESSIONS = 64
"""Live sessions kept; the oldest goes first (a login loop cannot grow the map)."""
MAX_ADDRESSES = 4096
"""Client addresses whose failed logins are counted; beyond it the oldest are forgotten (the
global limit still holds)."""
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


@dataclass(slots=True)
class Session:
    id: str
    csrf: str
    expires: float
    actor: str = ACTOR
    created: float = field(default_factory=time.time)
    notice: str | None = None
    """What the last action said, shown once on the next page."""


class Sessions:
    """Server-side sessions by a random id (256 bits), each with its CSRF token and expiry."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._by_id: dict[str, Session] = {}

    def create(self) -> Session:
        self._drop_expired()
        while len(self._by_id) >= MAX_SESSIONS:
            self._by_id.pop(next(iter(self._by_id)))
        session = Session(secrets.token_urlsafe(32), secrets.token_urlsafe(32), time.time() + self.ttl)
        self._by_id[session.id] = session
        return session

    def get(self, session_id: str | None) -> Session | None:
        if not session_id:
            return None
        session = self._by_id.get(session_id)
        if session is None:
            return None
        if session.expires <= time.time():
            self._by_id.pop(session_id, None)
            return None
        return session

    def end(self, session_id: str) -> None:
        self._by_id.pop(session_id, None)

    def _drop_expired(self) -> None:
        now = time.time()
        for sid in [s.id for s in self._by_id.values() if s.expires <= now]:
            del self._by_id[sid]


class LoginLimiter:
    """Failed logins in a sliding window, per client address and for all together. While either is
    full, every login is refused, the right token too: the answer must not tell a guesser that a
    guess was right."""

    def __init__(self, per_address: int, total: int, window: float) -> None:
        self.per_address, self.total, self.window = per_address, total, window
        self._by_address: collections.OrderedDict[str, collections.deque[float]] = collections.OrderedDict()
        self._all: collections.deque[float] = collections.deque()

    def _trim(self, times: collections.deque[float], now: float) -> None:
        while times and times[0] <= now - self.window:
            times.popleft()

    def wait(self, address: str) -> float:
        """Seconds until ``address`` may try again; 0 when it may now."""
        now = time.time()
        self._trim(self._all, now)
        waits = []
        if len(self._all) >= self.total:
            waits.append(self._all[len(self._all) - self.total] + self.window - now)
        mine = self._by_address.get(address)
        if mine is not None:
            self._trim(mine, now)
            if len(mine) >= self.per_address:
                waits.append(mine[len(mine) - self.per_address] + self.window - now)
        return max(waits, default=0.0)

    def failed(self, address: str) -> None:
        now = time.time()
        self._all.append(now)
        while len(self._all) > self.total:
            self._all.popleft()
        mine = self._by_address.pop(address, None) or collections.deque()
        mine.append(now)
        while len(mine) > self.per_address:
            mine.popleft()
        self._by_address[address] = mine
        while len(self._by_address) > MAX_ADDRESSES:
            self._by_address.popitem(last=False)


def token_matches(given: str, expected: str) -> bool:
    """Constant-time comparison of two secrets (their digests, so the length leaks nothing)."""
    return hmac.compare_digest(
        hmac.new(b"chital-console", given.encode("utf-8", "replace"), "sha256").digest(),
        hmac.new(b"chital-console", expected.encode("utf-8", "replace"), "sha256").digest(),
    )


def _origin_of(url: str) -> str | None:
    try:
        parts = urlsplit(url)
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return None
    return f"{parts.scheme}://{parts.netloc}".lower()


def same_origin(request: web.Request, extra: list[str]) -> bool:
    """The request's Origin (or, when a browser sends none, its Referer) names this listener (the
    ``Host`` it was sent to) or an origin the config lists. Neither header: refused (every browser
    that can log in sends one on a POST)."""
    claimed = request.headers.get("Origin")
    if claimed is None or claimed == "null":
        referer = request.headers.get("Referer")
        claimed = _origin_of(referer) if referer else None
    else:
        claimed = _origin_of(claimed)
    if claimed is None:
        return False
    ours = {f"{request.scheme}://{request.host}".lower(), *(o.rstrip("/").lower() for o in extra)}
    return claimed in ours


class Guard:
    """The console's gate: sessions, CSRF, origins and the login limit for one daemon."""

    def __init__(self, config: ConsoleConfig, token: str) -> None:
        self.config = config
        self._token = token
        self.sessions = Sessions(config.session_ttl)
        self.limiter = LoginLimiter(config.login_attempts, config.login_attempts_total, config.login_window)

    def session_of(self, request: web.Request) -> Session | None:
        return self.sessions.get(request.cookies.get(COOKIE))

    def csrf_ok(self, request: web.Request, session: Session, given: str | None) -> bool:
        sent = given or request.headers.get("X-CSRF-Token") or ""
        # surrogateescape: a header's bytes that are not UTF-8 are lone surrogates here, which a
        # strict encode refuses (a 500 for a wrong token); escaped back, they just do not match.
        return bool(sent) and hmac.compare_digest(
            sent.encode("utf-8", "surrogateescape"), session.csrf.encode()
        )

    def origin_ok(self, request: web.Request) -> bool:
        return same_origin(request, self.config.origins)

    def login(self, request: web.Request, given: str) -> Session | str:
        """A new session, or why not (the words the login page shows)."""
        address = request.remote or "?"
        wait = self.limiter.wait(address)
        if wait > 0:
            # Not a warning each: a guesser past the limit would flood the log at will.
            log.debug("console: login refused: too many failed logins (from %s)", address)
            return f"Too many failed logins. Try again in {about(wait)}."
        if not token_matches(given, self._token):
            self.limiter.failed(address)
            log.warning("console: failed login from %s", address)
            return "That is not the console token."
        log.info("console: %s logged in from %s", ACTOR, address)
        return self.sessions.create()

    def set_cookie(self, request: web.Request, response: web.StreamResponse, session: Session) -> None:
        response.set_cookie(
            COOKIE,
            session.id,
            max_age=int(self.config.session_ttl),
            path=PATH,
            httponly=True,
            samesite="Strict",
            secure=request.secure or self.config.secure_cookie,
        )

    def clear_cookie(self, response: web.StreamResponse) -> None:
        response.del_cookie(COOKIE, path=PATH)
