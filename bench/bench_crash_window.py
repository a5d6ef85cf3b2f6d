"""kill -9 at the moment the first streamed message reaches the platform (run by hand, prints figures).

    python bench/bench_crash_window.py            # 20 kills per case
    python bench/bench_crash_window.py --runs 5

`chital run` against the fake Telegram and Slack and a fake model that streams a long answer. The
fake platform kills the daemon (SIGKILL) right after the first call of the reply took effect and
before the daemon reads the answer: the worst instant. Then the daemon is started again and the
chat is read. Per case: how many answers were lost, doubled, or left a half-written message behind.

Cases:
- telegram-dm: the first streamed call is a draft (sendMessageDraft), which leaves nothing behind;
- telegram-dm-final: the kill hits the one real send (the final answer) instead: the remaining window;
- telegram-group: no drafts and no way to find the orphan; the resumed answer says it replaces it;
- slack: the orphan is found by the message metadata carrying the key, and edited.

Discord (enforce_nonce) and Lark (uuid) make a repeated send return the first message, so the same
kill there cannot double a reply (tests/test_discord_channel.py, tests/test_lark_channel.py).

Also printed: the remaining window in milliseconds, read from the daemon's DEBUG lines ("recorded
X ms after the platform answered") in runs without a kill.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.daemon import DaemonProcess, base_config, free_port
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.fakes.slack_server import FakeSlack
from tests.fakes.telegram_server import FakeTelegram

WORDS = " ".join(f"word{i}" for i in range(60))
FINAL_TAIL = "word59"
USER = 7001
GROUP = -100777
SLACK_CHANNEL, SLACK_USER = "C_BENCH", "U_BENCH"


class Case:
    def __init__(self, name: str, kill_on: set[str]) -> None:
        self.name, self.kill_on = name, kill_on
        self.counts = {"ok": 0, "lost": 0, "doubled": 0, "half-left": 0}

    def tally(self, texts: list[str]) -> None:
        complete = [t for t in texts if FINAL_TAIL in t]
        partial = [t for t in texts if FINAL_TAIL not in t and "word" in t]
        if not complete:
            self.counts["lost"] += 1
        elif len(complete) > 1:
            self.counts["doubled"] += 1
        elif partial:
            self.counts["half-left"] += 1
        else:
            self.counts["ok"] += 1


async def run_case(case: Case, runs: int, model: FakeOpenAI) -> list[float]:
    windows: list[float] = []
    async with FakeTelegram() as tg, FakeSlack() as slack:
        work = Path(tempfile.mkdtemp(prefix=f"chital-crash-{case.name}-"))
        cfg = base_config(work / "data", model.base_url, free_port())
        cfg["agent"]["tools"] = False
        cfg["log_level"] = "DEBUG"
        cfg["delivery"] = {"first_edit_delay": 0.1}
        if case.name.startswith("telegram"):
            cfg["channels"]["telegram"] = {"enabled": True, "token": tg.token, "base_url": tg.base_url,
                                           "base_file_url": tg.base_file_url, "poll_timeout": 1}  # fmt: skip
            cfg["access"] = {"allow_users": [str(USER)], "group_policy": "free"}
        else:
            cfg["channels"]["slack"] = {"enabled": True, "bot_token": slack.bot_token,
                                        "app_token": slack.app_token, "api_base_url": slack.api_base_url,
                                        "ping_interval": 0.5}  # fmt: skip
            cfg["access"] = {"allow_users": [f"slack:{SLACK_USER}"], "group_policy": "mention"}
        daemon = DaemonProcess(work, cfg)
        armed = {"on": False}

        def after_call(method: str, params: dict[str, Any]) -> None:
            if armed["on"] and method in case.kill_on:
                armed["on"] = False
                daemon.kill9()

        tg.after_call = after_call
        slack.after_call = after_call
        await daemon.start()
        try:
            for i in range(runs):
                armed["on"] = True
                if case.name == "slack":
                    await slack.wait_connected()
                    post = await slack.inject_mention(SLACK_CHANNEL, SLACK_USER, f"tell me {i}")
                    read = lambda post=post: list(slack.thread(SLACK_CHANNEL, post.ts).values())  # noqa: E731
                else:
                    chat = GROUP if case.name == "telegram-group" else USER
                    kind = "supergroup" if chat < 0 else "private"
                    up = tg.inject_message(chat, USER, f"tell me {i}", chat_type=kind)
                    mid = up["message"]["message_id"]
                    read = lambda chat=chat, mid=mid: [  # noqa: E731
                        m.text for m in tg.bot_messages(chat) if m.reply_to == mid
                    ]
                with contextlib.suppress(TimeoutError):
                    # The fake kills the daemon during the reply; wait for the process to be gone.
                    if daemon.proc:
                        await asyncio.wait_for(daemon.proc.wait(), 30)
                await daemon.start()
                with contextlib.suppress(AssertionError):
                    await tg.wait_for(lambda read=read: any(FINAL_TAIL in t for t in read()), timeout=30)
                await asyncio.sleep(1.5)
                case.tally(read())
            windows = [float(x) for x in re.findall(r"recorded ([0-9.]+) ms after", daemon.logs())]
        finally:
            await daemon.close()
    return windows


async def main(runs: int) -> None:
    async with FakeOpenAI() as model:
        model.add_rule(lambda t: True, Reply(text=WORDS, chunks=40, chunk_delay=0.03))
        cases: list[Case] = []
        for name, kill_on in (
            ("telegram-dm", {"sendMessageDraft"}),
            ("telegram-dm-final", {"sendMessage"}),
            ("telegram-group", {"sendMessage"}),
            ("slack", {"chat.postMessage"}),
        ):
            cases.append(Case(name, kill_on))
        print(f"kill -9 right after the platform took the reply's first call; {runs} runs per case")
        for case in cases:
            windows = await run_case(case, runs, model)
            c = case.counts
            line = f"  {case.name:18s} ok {c['ok']:3d}  lost {c['lost']:3d}  doubled {c['doubled']:3d}"
            line += f"  half-left {c['half-left']:3d}"
            if windows:
                line += f"   window: median {statistics.median(windows):.2f} ms, max {max(windows):.2f} ms"
            print(line, flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    asyncio.run(main(ap.parse_args().runs))
