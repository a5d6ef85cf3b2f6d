"""A platform outage of several minutes (run by hand, prints figures).

    python bench/bench_outage.py                 # 3 minutes down, 20 messages
    python bench/bench_outage.py --down 30 --messages 10

`chital run` against the fake Telegram and an instant fake model. Half of the messages arrive just
before the outage (the daemon has them; their answers fail with 502 and are parked), half while the
whole Bot API answers 502 (getUpdates included: Telegram keeps them until polling works again).
Printed: how many were answered, how many twice, and how long after the platform came back the
last answer arrived. No restart happens at any point.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.daemon import DaemonProcess, base_config, free_port
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram_server import FakeTelegram

API = {
    "getUpdates", "sendMessage", "editMessageText", "sendChatAction", "setMessageReaction",
    "sendMessageDraft", "getMe", "deleteWebhook", "sendDocument", "sendPhoto",
}  # fmt: skip


async def main(down: float, messages: int) -> None:
    async with FakeOpenAI() as model, FakeTelegram() as tg:
        work = Path(tempfile.mkdtemp(prefix="chital-outage-"))
        cfg = base_config(work / "data", model.base_url, free_port())
        cfg["agent"]["tools"] = False
        cfg["channels"]["telegram"] = {
            "enabled": True, "token": tg.token, "base_url": tg.base_url,
            "base_file_url": tg.base_file_url, "poll_timeout": 2,
        }  # fmt: skip
        chats = list(range(5001, 5001 + messages))
        cfg["access"] = {"allow_users": [str(c) for c in chats]}
        cfg["log_level"] = "WARNING"
        daemon = DaemonProcess(work, cfg)
        await daemon.start()
        try:
            early, late = chats[: messages // 2], chats[messages // 2 :]
            tg.down_methods |= {"sendMessage", "editMessageText", "sendChatAction", "sendMessageDraft"}
            ups = [tg.inject_message(c, c, f"early {c}") for c in early]
            await tg.wait_for(lambda: len(model.requests) >= len(early), timeout=60, what="early turns")
            tg.down_methods |= API
            started = time.monotonic()
            spacing = down / (len(late) + 1)
            for c in late:
                await asyncio.sleep(spacing)
                ups.append(tg.inject_message(c, c, f"late {c}"))
            await asyncio.sleep(max(0.0, down - (time.monotonic() - started)))
            answered_during = sum(1 for c in chats if tg.bot_messages(c))
            tg.down_methods.clear()
            back = time.monotonic()
            last: dict[int, float] = {}

            def check() -> bool:
                for up in ups:
                    chat = up["message"]["chat"]["id"]
                    if chat not in last and tg.bot_messages(chat):
                        last[chat] = time.monotonic() - back
                return len(last) == len(ups)

            with contextlib.suppress(AssertionError):  # reported below as "answered n of m"
                await tg.wait_for(check, timeout=120, what="every answer")
            await asyncio.sleep(3)  # anything doubled shows by now
            doubled = sum(1 for c in chats if len(tg.bot_messages(c)) > 1)
            print(f"outage: {down:.0f} s with the whole Bot API answering 502; {messages} messages")
            print(f"  answered during the outage : {answered_during}")
            print(f"  answered after it          : {len(last)} of {len(ups)}; twice: {doubled}")
            if last:
                times = sorted(last.values())
                print(f"  after recovery: first {times[0]:.1f} s, median {times[len(times) // 2]:.1f} s, "
                      f"last {times[-1]:.1f} s")  # fmt: skip
            print(f"  daemon restarts: 0 (same process, pid {daemon.proc.pid if daemon.proc else '?'})")
        finally:
            await daemon.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--down", type=float, default=180.0, help="seconds the platform is down")
    ap.add_argument("--messages", type=int, default=20)
    args = ap.parse_args()
    asyncio.run(main(args.down, args.messages))
