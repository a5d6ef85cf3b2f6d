"""What a stranger who writes to the bot in a DM gets: the pairing path, never the agent.

Split out of the Gateway's intake so that the rule reads in one place: one pending code per person
(a new one once it lapsed), the code again at most once a minute, each new request logged and
announced to the channel's admins, with announcements throttled per platform so a flood of
strangers cannot flood the admins. The Gateway hands in how to post (``notice`` into the
stranger's chat, ``tell`` into an admin's); this module never reaches back into it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from channels.base import Inbound
from gateway.config.schema import Config
from gateway.intake import access
from gateway.intake.limits import Throttles
from gateway.ops.metrics import Metrics
from gateway.store.journal import Store

log = logging.getLogger("gateway.daemon.gateway")  # the name operators filter on since before the split

Notice = Callable[[Inbound, str], Awaitable[None]]
"""Post a journaled notice into the stranger's own chat."""
Tell = Callable[[str, str, str, str], Awaitable[None]]
"""``tell(platform, chat_id, tag, text)``: post once per tag into another chat (an admin's)."""


class Pairing:
    def __init__(
        self, config: Config, store: Store, throttles: Throttles, metrics: Metrics, notice: Notice, tell: Tell
    ) -> None:
        self.config = config
        self.store = store
        self.throttles = throttles
        self.metrics = metrics
        self._notice = notice
        self._tell = tell

    async def __call__(self, inbound: Inbound) -> None:
        """A stranger in a DM gets their one pending code (a new one once it lapsed), again at most
        once a minute; each new code is logged and announced to the channel's admins."""
        policy = self.config.access_for(inbound.platform)
        request, new = await self.store.pairing_request(
            inbound.user,
            inbound.sender_name,
            inbound.chat_id,
            ttl=policy.pairing_code_ttl,
            max_pending=policy.pairing_max_pending,
        )
        reminders = self.throttles.reminders
        if new:
            reminders.reset(inbound.user)
        if reminders.hit(inbound.user):
            self.metrics.messages_ignored.labels(inbound.platform, "pairing_pending").inc()
            return
        await self._notice(inbound, access.pairing_text(request, cli=self.config.cli()))
        if not new:
            return
        log.info("pairing: %s asks for access; code %s", request.label(), request.code)
        if self.throttles.announcements.hit(inbound.platform):
            log.warning(
                "pairing: too many requests on %s to announce; see `chital pairing list`", inbound.platform
            )
            return
        chats = await access.admin_chats(policy, inbound.platform, self.store)
        if not chats:
            log.warning("pairing: no admin of %s can be told in chat (set access.admins)", inbound.platform)
        for chat_id in chats:
            await self._tell(
                inbound.platform,
                chat_id,
                f"pairing-{request.code}",
                access.announcement_text(request, self.config.cli()),
            )
