"""``POST /hooks/<name>``: deliveries from outside (GitHub, GitLab, Alertmanager, CI) that start a
turn in a configured conversation (docs/hooks.md).

The order of checks is the order of cost, and every refusal says as little as possible:

1. an unknown name, or a hook switched off at start-up, is one 404 (no name listed or echoed);
2. a declared body over ``hooks.max_body_bytes`` is 413 before a byte is read, and an undeclared
   (chunked) one is read only up to the limit (aiohttp's ``client_max_size``);
3. the signature: HMAC-SHA256 of the raw body with the hook's secret, from GitHub's
   ``X-Hub-Signature-256`` or ``X-Chital-Signature`` (``sha256=<hex>``), compared in constant time;
   missing 401, wrong 403, both counted in ``chital_hook_deliveries{outcome}``;
4. a body that is not a JSON object or array (or nests deeper than 64 levels) is 400; a hook
   over its rate is 429;
5. the SHA-256 of the hook's name and the body (what the signature covers; never an unsigned
   delivery-id header) keys the turn's journal entry: journaled before the 202 goes out, so a
   kill -9 after it still runs the turn (the gateway resumes pending entries), and a replay finds
   the key taken (409, nothing run again).

The turn is built like a background task's (gateway/turns/background.py): marked started-by-the-bot,
journaled as a TURN, its sender the hook, its message the payload quoted as data with a webhook
source in its provenance (agent/provenance.py), so whatever it does that lasts is marked as made
after reading untrusted content.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web

from agent.provenance import WEBHOOK, Provenance, Source
from channels.base import Channel, Inbound
from channels.webroute import mount_path
from gateway.config.platforms import NEVER, is_direct, platform_named
from gateway.intake.access import HOOK_SENDER, STARTED_BY_BOT
from gateway.intake.provenance import PROVENANCE_EXTRA
from gateway.store.entries import JournalKind
from gateway.turns.hook_text import hook_text

if TYPE_CHECKING:
    from agent.redact import Redactor
    from gateway.config.hooks import HookSpec
    from gateway.config.schema import Config
    from gateway.ops.metrics import Metrics
    from gateway.store.journal import Store

log = logging.getLogger(__name__)

HOOK_MARK = "chital_hook"
"""In a hook turn's ``Inbound.extra``: the hook's name."""
EVENT_HEADERS = ("X-GitHub-Event", "X-Gitlab-Event", "X-Chital-Event")
SIGNATURE_HEADERS = ("X-Hub-Signature-256", "X-Chital-Signature")
MAX_DEPTH = 64
"""Deepest nesting of a payload accepted: the prompt shows it as indented JSON, and the encoder
recurses."""


class HookHost(Protocol):
    """What the hooks use of the daemon (the Gateway is one)."""

    store: Store

    @property
    def channels(self) -> Mapping[str, object]: ...

    async def start_turn(self, inbound: Inbound, note: str = ..., kind: JournalKind = ...) -> bool: ...


def sign(secret: str, body: bytes) -> str:
    """The signature header's value for ``body`` (what a sender computes; tests and docs use it)."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def target_allowed(config: Config, spec: HookSpec) -> bool:
    """The hook's chat is one the access policy lets the bot talk in: an allowed or admin chat, or
    the direct chat of an allowed user or admin, where a direct chat's id is its user's id (the
    registry's ``dm_names_user``: Telegram, WhatsApp, DingTalk, WeCom; WeCom's ids do not tell a
    user from a group, so the id listed as a user's is taken as that user's chat)."""
    policy = config.access_for(spec.platform)
    chat = spec.chat_id

    def listed(ids: list[str]) -> bool:  # exact: a wildcard never makes a chat a hook's target
        return chat in ids or f"{spec.platform}:{chat}" in ids

    if listed(policy.allow_chats) or listed(policy.admin_chats):
        return True
    row = platform_named(spec.platform)
    direct = (
        row is not None and row.dm_names_user and (row.direct_ids == NEVER or is_direct(spec.platform, chat))
    )
    return direct and listed(policy.allow_users + policy.admins)


def _depth(value: Any) -> int:
    """How deeply ``value`` nests (iteratively: a deep payload must not exhaust the stack here)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        node, depth = todo.pop()
        deepest = max(deepest, depth)
        if depth > MAX_DEPTH:
            break
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        todo.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return deepest


def _normal(given: str) -> bytes:
    """A signature header's value as :func:`sign` writes it: the scheme and hex digits in lower
    case (hex is case-free; some senders write upper case). Anything else stays as given and
    fails the comparison, e.g. a ``sha1=`` signature: only SHA-256 is accepted."""
    scheme, _, digits = given.strip().partition("=")
    return f"{scheme.lower()}={digits.lower()}".encode(errors="replace")


class _Bucket:
    """A token bucket: ``rate`` deliveries a minute, bursts of as many."""

    def __init__(self, rate: int) -> None:
        self.rate, self.tokens, self.at = rate, float(rate), time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(float(self.rate), self.tokens + (now - self.at) * self.rate / 60.0)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


class Hooks:
    """The hooks of one daemon: verifies, limits and journals deliveries (:meth:`app`)."""

    def __init__(self, host: HookHost, config: Config, metrics: Metrics, redact: Redactor) -> None:
        self.host, self.config, self.metrics, self.redact = host, config, metrics, redact
        self.hooks: dict[str, HookSpec] = {}
        for name, spec in config.hooks.hooks.items():
            if spec.platform not in host.channels:
                log.error("hook %s is off: channel %s is not running", name, spec.platform)
            elif target_allowed(config, spec):
                self.hooks[name] = spec
            else:
                log.error(
                    "hook %s is off: its chat %s:%s is not allowed by access (allow_chats, admin_chats "
                    "or an allowed user's direct chat)", name, spec.platform, spec.chat_id,
                )  # fmt: skip
        self._buckets = {name: _Bucket(spec.rate_per_minute) for name, spec in self.hooks.items()}

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.hooks.max_body_bytes)
        app.router.add_post("/hooks/{name}", self.receive)
        for channel in self.host.channels.values():
            if isinstance(channel, Channel):  # a platform Meta-style delivers to us (WhatsApp)
                for route in channel.web_routes():
                    app.router.add_route(route.method, mount_path(channel.name, route), route.handler)
        return app

    def _count(self, outcome: str) -> None:
        self.metrics.hook_deliveries.labels(outcome).inc()

    def _refuse(self, status: int, outcome: str, text: str) -> web.Response:
        self._count(outcome)
        return web.json_response({"error": text}, status=status)

    async def receive(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        spec = self.hooks.get(name)
        if spec is None:
            return self._refuse(404, "unknown", "not found")
        limit = self.config.hooks.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            return self._refuse(413, "too_large", "body too large")
        try:
            async with asyncio.timeout(self.config.hooks.read_seconds):
                body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return self._refuse(413, "too_large", "body too large")
        except TimeoutError:  # a slow-loris: aiohttp itself never times out a body read
            return self._refuse(408, "timeout", "the body was not sent in time")
        given = next((request.headers[h] for h in SIGNATURE_HEADERS if h in request.headers), None)
        if not given:
            return self._refuse(401, "unsigned", "signature required")
        if not hmac.compare_digest(_normal(given), sign(spec.secret.get_secret_value(), body).encode()):
            return self._refuse(403, "bad_signature", "forbidden")
        try:
            payload: Any = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            return self._refuse(400, "not_json", "the body must be JSON")
        except RecursionError:  # nested deeper than the decoder goes
            return self._refuse(400, "not_json", "the body is nested too deeply")
        if not isinstance(payload, dict | list):
            return self._refuse(400, "not_json", "the body must be a JSON object or array")
        if _depth(payload) > MAX_DEPTH:
            return self._refuse(400, "not_json", "the body is nested too deeply")
        inbound = self._inbound(name, spec, request, body, payload)
        store = self.host.store
        # A replay is refused before the rate is charged: whoever captured one signed delivery
        # must not be able to use up the hook's rate by resending it.
        if await store.journal_seen(inbound.key):
            return self._refuse(409, "replay", "already received")
        if not self._buckets[name].take():
            return self._refuse(429, "rate_limited", "too many deliveries; try again later")
        if not await self.host.start_turn(inbound, "", JournalKind.TURN):
            if await store.journal_seen(inbound.key):
                return self._refuse(409, "replay", "already received")
            return self._refuse(503, "unavailable", "not accepting deliveries now; retry later")
        self._count("accepted")
        log.info("hook %s: delivery accepted as %s", name, inbound.key)
        return web.json_response({"status": "accepted"}, status=202)

    def _inbound(self, name: str, spec: HookSpec, request: web.Request, body: bytes, payload: Any) -> Inbound:
        # Keyed on what the signature covers (the body), never on a header: a captured delivery
        # resent with a fresh X-GitHub-Delivery is the same delivery, so it is refused as a replay.
        key = hashlib.sha256(name.encode() + b"\0" + body).hexdigest()[:32]
        event = next((request.headers[h] for h in EVENT_HEADERS if request.headers.get(h)), "")
        text = hook_text(name, event, spec.prompt, payload, self.redact, self.config.hooks.payload_chars)
        provenance = Provenance((Source(WEBHOOK, name),))
        extra: dict[str, Any] = {
            STARTED_BY_BOT: True,
            HOOK_MARK: name,
            PROVENANCE_EXTRA: provenance.to_json(),
        }
        chat = spec.chat_id
        direct = is_direct(spec.platform, chat)
        return Inbound(spec.platform, chat, f"hook-{name}-{key}", HOOK_SENDER + name, text, direct, True,
                       None, f"webhook {name}", extra=extra)  # fmt: skip


async def serve(hooks: Hooks, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Start the hooks' own listener; returns its runner (to clean up) and the bound port. Raises
    OSError when the address is taken."""
    runner = web.AppRunner(hooks.app(), access_log=None, handle_signals=False)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError:
        await runner.cleanup()
        raise
    addresses = runner.addresses
    return runner, int(addresses[0][1]) if addresses else port
