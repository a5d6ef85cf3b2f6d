"""``chital chat``: talk to the agent in this terminal, on the same database and agent as the daemon."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import time

from .cli_common import load_config_arg
from .config import Config


async def _chat(cfg: Config) -> int:
    from agent.events import Clarification, Final, StatusUpdate, TextDelta, ToolProgress, TurnFailed

    from .app import open_harness
    from .store import Store

    store = await Store.open(cfg.storage.path / "gateway.sqlite", cfg.storage.reserve_mb << 20)
    harness = await open_harness(cfg)
    conversation = f"cli:{getpass.getuser()}"
    thread_id = await store.thread_for(conversation)
    print(f"chital chat — model {harness.model_name}. /new starts over, /quit (or Ctrl-D) leaves.")
    loop = asyncio.get_running_loop()
    try:
        while True:
            try:
                line = await loop.run_in_executor(None, lambda: input("you> "))
            except (EOFError, KeyboardInterrupt):
                print()
                break
            text = line.strip()
            if not text:
                continue
            if text in ("/quit", "/exit"):
                break
            if text == "/new":
                thread_id = await store.new_thread(conversation)
                print("(fresh conversation)")
                continue
            print("chital> ", end="", flush=True)
            streamed = False
            async for ev in harness.run(
                thread_id, user_id=conversation, message_id=f"cli-{time.time_ns()}", text=text
            ):
                if isinstance(ev, TextDelta):
                    streamed = True
                    print(ev.text, end="", flush=True)
                elif isinstance(ev, ToolProgress) and ev.phase == "start":
                    print(f"\n  [tool {ev.name}]", flush=True)
                elif isinstance(ev, StatusUpdate):
                    print(f"\n  [{ev.text}]", flush=True)
                elif isinstance(ev, Clarification):
                    print(f"? {ev.question}", end="")
                elif isinstance(ev, Final) and not streamed:
                    print(ev.text, end="")
                elif isinstance(ev, TurnFailed):
                    print(f"⚠ {ev.message}", end="")
            print()
    finally:
        await harness.close()
        await store.close()
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    import logging

    cfg = load_config_arg(args)
    logging.basicConfig(level=logging.WARNING)
    return asyncio.run(_chat(cfg))
