"""Feishu / Lark channel: lark-oapi's long connection in, interactive cards out.

Inbound. lark-oapi's ``ws.Client`` cannot be embedded as it is (``start()`` blocks forever, cannot be
stopped, uses a module-global event loop, and some reconnect failures end it silently), so
:mod:`channels.lark._ws` runs each client in its own daemon thread and loop and observes it. The SDK
calls our handler synchronously on that thread; the handler hands the :class:`~channels.base.Inbound`
to the daemon's loop (``run_coroutine_threadsafe``) and **blocks until the sink returned**, because
the SDK writes the frame's ack right after the handler: ``{"code":200}`` once journaled, ``500`` when
the sink raised, which makes the platform redeliver.

Liveness. The client pings at least every ``liveness_timeout / 3`` seconds and every frame it
receives (pong or event) counts as life. ``run()`` raises :class:`LarkConnectionError`, and so has
the gateway supervisor start a fresh client, when no frame came for ``liveness_timeout`` (half-open
socket, dead reconnect loop), when the SDK's reconnect gave up (e.g. the endpoint answered a client
error code) or when its thread ended. The SDK's own reconnect handles ordinary drops first. On
cancel or restart the old client is shut down from its own loop (auto-reconnect off, tasks cancelled,
websocket closed) and refuses events from the moment it is stopping, so two clients never both
deliver.

Mapping. ``p2p`` chats are direct and always addressed; in groups the bot is addressed when its
open_id (from ``GET /open-apis/bot/v3/info``) is among the message's mentions. ``@_user_N``
placeholders become ``@Name``, the bot's own are removed. A message in a topic / thread carries a
``thread_id`` and forms its own conversation; replies go back into it (``reply_in_thread``). Text and
rich-text posts become plain text; images and files become attachments whose ``file_id`` holds the
message id and resource key needed to download them.

Outbound. All answers are JSON 2.0 interactive cards (see :mod:`channels.lark.render`) sent with the
reply API and a ``uuid`` derived from the idempotency key; streaming PATCHes one card in place.
Blocking SDK calls run in a small thread pool.
"""

from typing import TYPE_CHECKING

from channels import lazy_exports

from .settings import LarkSettings

if TYPE_CHECKING:
    from .channel import LarkChannel, LarkConnectionError

__all__ = ["LarkChannel", "LarkConnectionError", "LarkSettings"]
__getattr__ = lazy_exports(__name__, {"LarkChannel": ".channel", "LarkConnectionError": ".channel"})
