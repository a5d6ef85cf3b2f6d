"""Running lark-oapi's long-connection client inside a daemon that owns its own event loop.

``lark_oapi.ws.Client`` was written to be the whole program: ``start()`` blocks forever, has no stop,
refuses to run inside a running loop, and every coroutine it schedules goes to a module-global
``lark_oapi.ws.client.loop`` grabbed at import time. Its reconnect can die silently (a client error
code during a reconnect ends the task and nothing else notices), and it only pings every
``PingInterval`` seconds as the server configures it. :class:`WsRunner` makes it embeddable:

* one dedicated daemon thread per client with a fresh event loop. Instead of assigning that loop to
  the module global (which a second client in the same process, e.g. the old one still winding down
  during a restart, would then share across threads), the global is replaced once by
  :class:`_PerThreadLoop`, which resolves to the loop bound to the calling thread. Every use of the
  global in lark_oapi/ws/client.py (``start``'s ``run_until_complete``, ``_connect``'s and
  ``_receive_message_loop``'s ``create_task``) runs on the client's own thread, so each client only
  ever touches its own loop;
* a small subclass (:class:`_WatchedClient`) that reports every received frame, a lost connection
  and a reconnect that gave up, and pings at our cadence so a half-open socket shows within the
  liveness timeout (the frames the server answers are what prove the connection alive);
* a guard around the event dispatcher (:class:`_GuardedDispatcher`): the SDK answers 500 to an event
  it cannot parse (not JSON, no header) or has no handler for, and the platform then redelivers it
  again and again. An unparseable one goes to ``on_unreadable`` (skipped, acked 200); other event
  types are acked 200 and ignored; only our handler's own refusal (stopping, sink failed) stays 500;
* a guard around data frames (:meth:`_WatchedClient._handle_data_frame`): the SDK drops a frame of a
  type it does not know, one without its ``sum`` header, one whose payload is not UTF-8, and the
  old ``card`` callback frames, all without an ack, so the platform redelivers them. Those are
  acked 200 here and reported as malformed (``on_malformed``);
* :meth:`WsRunner.stop`: refuse further events, switch auto-reconnect off and cancel every task on
  the client's loop from that loop (``call_soon_threadsafe``), close the websocket, close the loop.
  A thread stuck in the SDK's blocking endpoint request (it has no timeout) cannot be interrupted; it
  is abandoned as a daemon thread, and because the runner refuses events once stopping, it can never
  deliver a message next to its successor.

This module is the adapter's one module for lark-oapi's private names (the vendor boundary,
docs/design.md): the client's ``_handle_message``, ``_handle_data_frame``, ``_ping_loop``,
``_reconnect`` and ``_write_message`` overridden, its ``_conn`` and ``_auto_reconnect`` read and
set, ``_new_ping_frame`` called, the module-global loop replaced. The releases it was verified on
are in compat/versions.py; there is no public fallback (the SDK's public ``start()`` cannot be
embedded or stopped), so outside them the daemon refuses to start.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from lark_oapi.api.application.v6 import P2ApplicationBotMenuV6
from lark_oapi.api.im.v1 import P2ImMessageReceiveV1
from lark_oapi.core.enum import LogLevel
from lark_oapi.event.callback.model.p2_card_action_trigger import (
    P2CardActionTrigger,
    P2CardActionTriggerResponse,
)
from lark_oapi.event.dispatcher_handler import EventDispatcherHandler
from lark_oapi.ws import client as sdk_ws

from channels import malformed
from channels.base import scrub

log = logging.getLogger(__name__)


class _PerThreadLoop:
    """Stands in for ``lark_oapi.ws.client.loop``: attribute access goes to the loop bound to the
    calling thread (falling back to the SDK's original loop for threads that bound none)."""

    def __init__(self, fallback: Any) -> None:
        self._fallback = fallback
        self._local = threading.local()

    def bind(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self._local.loop = loop

    def __getattr__(self, name: str) -> Any:
        return getattr(getattr(self._local, "loop", None) or self._fallback, name)


_install_lock = threading.Lock()


def _loop_proxy() -> _PerThreadLoop:
    with _install_lock:
        current = sdk_ws.loop
        if not isinstance(current, _PerThreadLoop):
            current = _PerThreadLoop(current)
            sdk_ws.loop = current
        return current


class _WatchedClient(sdk_ws.Client):
    """The SDK client with three observation points (private SDK methods, pinned lark-oapi 1.7.x)."""

    def __init__(self, *args: Any, runner: WsRunner, ping_every: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._runner = runner
        self._ping_every = ping_every

    async def _handle_message(self, msg: bytes) -> None:
        self._runner._frame_seen()
        await super()._handle_message(msg)

    async def _handle_data_frame(self, frame: Any) -> None:
        headers = {h.key: h.value for h in frame.headers}
        kind = _frame_problem(headers, frame.payload)
        if kind is None:
            await super()._handle_data_frame(frame)
            return
        self._runner._malformed(kind)
        log.warning("lark: a %s frame the SDK cannot take; acked and skipped", kind)
        frame.payload = json.dumps({"code": 200}).encode()
        await self._write_message(frame.SerializeToString())

    async def _ping_loop(self) -> None:
        # Same as the SDK's loop, but at least every ``ping_every`` seconds: the server's pongs are
        # our liveness signal, and its configured PingInterval (minutes) is too slow for that.
        while True:
            try:
                if self._conn is not None:
                    frame = sdk_ws._new_ping_frame(int(self._service_id))
                    await self._write_message(frame.SerializeToString())
            except Exception as e:
                log.debug("lark ping failed: %s", e)
            await asyncio.sleep(min(float(self._ping_interval or self._ping_every), self._ping_every))

    async def _reconnect(self) -> None:
        try:
            await super()._reconnect()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the SDK lets this die inside a task nobody awaits
            self._runner._client_died(e)
            raise


def _frame_problem(headers: dict[str, str], payload: bytes) -> str | None:
    """The malformed kind of a data frame lark-oapi would drop without an ack, or None when the
    SDK can take it. ``card``: the old card callback, which this app does not use."""
    if headers.get("type") == "card":
        return malformed.INTERACTION
    if headers.get("type") != "event" or not headers.get("message_id"):
        return malformed.ENVELOPE
    total, seq = headers.get("sum", ""), headers.get("seq", "")
    if not (total.isdigit() and seq.isdigit() and int(total) >= 1):
        return malformed.ENVELOPE
    if int(total) == 1:
        try:
            payload.decode("utf-8")
        except UnicodeDecodeError:
            return malformed.ENVELOPE
    return None


MESSAGE_EVENT = "im.message.receive_v1"
CARD_ACTION_EVENT = "card.action.trigger"
MENU_EVENT = "application.bot.menu_v6"


def refusal_toast(text: str) -> P2CardActionTriggerResponse:
    """The answer to a card press that changed nothing: an error toast only the presser sees."""
    return P2CardActionTriggerResponse({"toast": {"type": "error", "content": text}})


class _Redeliver(Exception):
    """Our handler refused an event on purpose (client stopping, sink failed): answer 500."""


class _GuardedDispatcher:
    """Stands in for the SDK's ``EventDispatcherHandler``: the websocket client only ever calls
    its ``_do_without_validation(payload)`` (lark_oapi/ws/client.py, pinned 1.7.x)."""

    def __init__(
        self,
        inner: EventDispatcherHandler,
        on_unreadable: Callable[[bytes, Exception], None],
        on_bad_card: Callable[[Exception], Any],
    ) -> None:
        self._inner, self._on_unreadable, self._on_bad_card = inner, on_unreadable, on_bad_card

    def _do_without_validation(self, payload: bytes) -> Any:
        try:
            body = json.loads(payload)
            header = body.get("header") if isinstance(body, dict) else None
            event_type = header.get("event_type") if isinstance(header, dict) else None
            if event_type is None and isinstance(body, dict) and "uuid" in body:
                return None  # a v1 (legacy) event: not one we subscribe to
            if not isinstance(event_type, str):
                raise ValueError("event without a header.event_type")
        except Exception as exc:
            self._on_unreadable(payload, exc)
            return None
        if event_type not in (MESSAGE_EVENT, CARD_ACTION_EVENT, MENU_EVENT):
            return None  # not ours: acked, or the platform would redeliver it forever
        try:
            return self._inner._do_without_validation(payload)
        except _Redeliver as refused:
            raise (refused.__cause__ or refused) from None
        except Exception as exc:  # the SDK's own parsing of the event failed
            if event_type == CARD_ACTION_EVENT:
                return self._on_bad_card(exc)  # the presser gets a toast saying so
            self._on_unreadable(payload, exc)
            return None


class WsRunner:
    """One lark-oapi websocket client in its own thread. Callbacks run on that thread."""

    def __init__(
        self,
        app_id: str,
        app_secret: str,
        domain: str,
        on_message: Callable[[WsRunner, P2ImMessageReceiveV1], None],
        *,
        on_unreadable: Callable[[WsRunner, bytes, Exception], None] | None = None,
        on_card_action: Callable[[WsRunner, P2CardActionTrigger], P2CardActionTriggerResponse | None]
        | None = None,
        ping_every: float,
        notify: Callable[[str], None],
        on_malformed: Callable[[str], None] | None = None,
        on_menu: Callable[[WsRunner, P2ApplicationBotMenuV6], None] | None = None,
    ) -> None:
        self._app_id, self._app_secret, self._domain = app_id, app_secret, domain
        self._on_message = on_message
        self._on_unreadable = on_unreadable
        self._on_card_action = on_card_action
        self._on_malformed = on_malformed
        builder = EventDispatcherHandler.builder("", "").register_p2_im_message_receive_v1(self._guard)
        # Card button presses (card.action.trigger) arrive over the same connection as event
        # frames; what the handler returns is the callback's answer (a toast), carried back in
        # the ack frame. (Frames of type "card", the old callback, the SDK drops unanswered.)
        builder = builder.register_p2_card_action_trigger(self._guard_card)
        if on_menu is not None:  # the bot's custom menu (channels/lark/menu.py)
            builder = builder.register_p2_application_bot_menu_v6(lambda data: self._guard(data, on_menu))
        self._dispatcher = _GuardedDispatcher(builder.build(), self._unreadable, self._bad_card)
        self._ping_every = ping_every
        self._notify = notify  # "frame" | "reconnecting" | "died" | "exit"
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self.last_frame = time.monotonic()
        self.frames = 0
        self.busy = 0  # handlers currently waiting for the daemon's sink
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: _WatchedClient | None = None
        self._thread = threading.Thread(target=self._main, name=f"lark-ws-{app_id}", daemon=True)

    # -- daemon side -------------------------------------------------------------------------
    def start(self) -> None:
        self.last_frame = time.monotonic()
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def connected(self) -> bool:
        client = self._client
        return client is not None and client._conn is not None

    def problem(self, liveness_timeout: float) -> str | None:
        """Why this client cannot be trusted any more, or None while it looks healthy."""
        if self.error is not None:
            # The SDK's texts can carry the websocket URL, its connection ticket in the query.
            return scrub(f"Lark websocket client stopped: {type(self.error).__name__}: {self.error}")
        if not self._thread.is_alive():
            return "Lark websocket client thread ended"
        idle = time.monotonic() - self.last_frame
        if self.busy == 0 and idle > liveness_timeout:
            state = "connected" if self.connected else "not connected"
            return f"no frame from Lark for {idle:.0f}s ({state}; half-open connection or dead client)"
        return None

    def stop(self, timeout: float = 5.0) -> bool:
        """Shut the client down as far as the SDK allows; True when its thread has ended."""
        self.stopping.set()
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # loop already closed
                loop.call_soon_threadsafe(self._cancel_everything)
        if self._thread.is_alive():
            self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("lark websocket thread did not stop within %.0fs; abandoning it", timeout)
            return False
        return True

    # -- client thread -----------------------------------------------------------------------
    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)  # the SDK's ExpiringCache grabs the thread's loop in __init__
        proxy = _loop_proxy()
        proxy.bind(loop)
        self._loop = loop
        try:
            self._client = _WatchedClient(
                self._app_id,
                self._app_secret,
                log_level=LogLevel.WARNING,
                event_handler=self._dispatcher,
                domain=self._domain,
                auto_reconnect=True,
                runner=self,
                ping_every=self._ping_every,
            )
            self._client.on_reconnecting = lambda: self._notify("reconnecting")
            if not self.stopping.is_set():
                self._client.start()  # returns only by an exception
        except BaseException as e:  # CancelledError included: that is how stop() ends start()
            if not self.stopping.is_set():
                self.error = e
        finally:
            try:
                loop.run_until_complete(self._cleanup())
                loop.run_until_complete(loop.shutdown_asyncgens())
            except BaseException as e:
                log.debug("lark websocket cleanup: %s", e)
            finally:
                loop.close()
                proxy.bind(None)
                self._notify("exit")

    def _cancel_everything(self) -> None:
        if self._client is not None:
            self._client._auto_reconnect = False
        for task in asyncio.all_tasks():
            task.cancel()

    async def _cleanup(self) -> None:
        client = self._client
        if client is not None:
            client._auto_reconnect = False
            conn, client._conn = client._conn, None
            if conn is not None:
                try:
                    async with asyncio.timeout(1):  # a half-open peer never answers
                        await conn.close()
                except Exception:
                    with contextlib.suppress(Exception):
                        conn.transport.abort()
        me = asyncio.current_task()
        others = [t for t in asyncio.all_tasks() if t is not me]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    def _guard(self, data: Any, handler: Callable[[WsRunner, Any], None] | None = None) -> None:
        # A client being stopped (or abandoned) must never deliver next to its successor: raising
        # makes the SDK ack 500, so the platform redelivers to the live connection.
        if self.stopping.is_set():
            raise _Redeliver() from RuntimeError("this Lark client is stopping")
        try:
            (handler or self._on_message)(self, data)
        except Exception as exc:
            raise _Redeliver() from exc

    def _guard_card(self, data: P2CardActionTrigger) -> P2CardActionTriggerResponse | None:
        if self.stopping.is_set():
            raise _Redeliver() from RuntimeError("this Lark client is stopping")
        if self._on_card_action is None:
            return None
        try:
            return self._on_card_action(self, data)
        except Exception as exc:
            raise _Redeliver() from exc

    def _unreadable(self, payload: bytes, exc: Exception) -> None:
        if self.stopping.is_set():
            raise RuntimeError("this Lark client is stopping")
        if self._on_unreadable is not None:
            self._on_unreadable(self, payload, exc)

    def _bad_card(self, exc: Exception) -> P2CardActionTriggerResponse:
        """A card press the SDK could not parse: counted, and refused in the callback's toast."""
        if self.stopping.is_set():
            raise RuntimeError("this Lark client is stopping")
        self._malformed(malformed.ACTION)
        log.warning("lark: a card press that cannot be read (%s); refused", type(exc).__name__)
        return refusal_toast(malformed.ACTION_UNREADABLE)

    def _malformed(self, kind: str) -> None:
        if self._on_malformed is not None:
            self._on_malformed(kind)

    def _frame_seen(self) -> None:
        self.last_frame = time.monotonic()
        self.frames += 1
        self._notify("frame")

    def _client_died(self, error: BaseException) -> None:
        if not self.stopping.is_set():
            self.error = error
            self._notify("died")
