"""systemd's readiness and watchdog protocol (sd_notify(3)), spoken directly: one datagram per state
on the unix socket ``$NOTIFY_SOCKET`` names. No libsystemd binding is needed for three messages.

Why it matters for a chat daemon: with ``Type=notify`` systemd counts the unit started only once the
store is open and the channels are supervised (``READY=1``), so ``systemctl start`` and units ordered
after it wait for a daemon that can actually take messages; with ``WatchdogSec=`` a daemon whose event
loop is stuck (a blocking call, a deadlock) stops sending ``WATCHDOG=1`` and is restarted, which a
process that is alive but frozen would otherwise never be. The pings come from a task on the daemon's
own loop for exactly that reason: they prove the loop turns.

Outside systemd (no ``$NOTIFY_SOCKET``) every call is a no-op.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Mapping

log = logging.getLogger(__name__)


class Notifier:
    """Sends sd_notify states to the socket systemd gave us. Never raises: a lost notification must
    not take the daemon down (systemd then times the start out or restarts, which it reports)."""

    def __init__(self, address: str, watchdog_interval: float | None) -> None:
        # An address starting with "@" is in the abstract namespace (a leading NUL byte).
        self.address = "\0" + address[1:] if address.startswith("@") else address
        self.watchdog_interval = watchdog_interval

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Notifier | None:
        """The notifier systemd asked for, or None. The watchdog interval is half ``WATCHDOG_USEC``
        (what sd_watchdog_enabled(3) recommends), and only when ``WATCHDOG_PID`` is unset or ours:
        a child that inherited the variables must not ping for its parent."""
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET", "")
        if not address or not (address.startswith(("/", "@"))):
            return None
        interval: float | None = None
        usec, pid = env.get("WATCHDOG_USEC", ""), env.get("WATCHDOG_PID", "")
        if usec.isascii() and usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            interval = int(usec) / 2_000_000
        return cls(address, interval)

    def send(self, *states: str) -> bool:
        """One datagram with ``states`` (``READY=1``, ``STATUS=…``), newline-separated."""
        payload = "\n".join(s.replace("\n", " ") for s in states).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.connect(self.address)
                sock.sendall(payload)
        except OSError as exc:
            log.warning("could not notify systemd (%s): %s", states[0].split("=")[0], exc)
            return False
        return True

    async def watchdog(self) -> None:
        """``WATCHDOG=1`` every interval until cancelled; returns at once when no watchdog is set."""
        if not self.watchdog_interval:
            return
        while True:
            self.send("WATCHDOG=1")
            await asyncio.sleep(self.watchdog_interval)
