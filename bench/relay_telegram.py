"""The reference for the benchmarks: a bare python-telegram-bot relay to an OpenAI-compatible model.

No journal, no agent, no streaming to the chat: each DM's text goes to the model (openai SDK,
streamed, every chunk parsed), and the whole answer is sent back as one reply. This is what any
Telegram bot in front of a model pays at least; ``bench_streaming.py`` and ``bench_telegram.py``
run it as a subprocess beside Chital on the same fakes and report Chital's figures against it.

    python bench/relay_telegram.py --token T --base-url URL --model-url URL [--stream]
"""

from __future__ import annotations

import argparse

from openai import AsyncOpenAI
from telegram import Update
from telegram.ext import Application, ContextTypes, MessageHandler, filters


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--token", required=True)
    ap.add_argument("--base-url", required=True, help="fake Bot API, e.g. http://127.0.0.1:P/bot")
    ap.add_argument("--model-url", required=True, help="OpenAI-compatible base URL (…/v1)")
    ap.add_argument("--stream", action="store_true", help="stream the model's answer (parse every chunk)")
    args = ap.parse_args()
    client = AsyncOpenAI(base_url=args.model_url, api_key="sk-relay", max_retries=0)

    async def answer(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        message = update.effective_message
        if message is None or not message.text:
            return
        request = [{"role": "user", "content": message.text}]
        if args.stream:
            parts: list[str] = []
            stream = await client.chat.completions.create(model="fake-model", messages=request, stream=True)  # type: ignore[arg-type]
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    parts.append(chunk.choices[0].delta.content)
            text = "".join(parts)
        else:
            done = await client.chat.completions.create(model="fake-model", messages=request)  # type: ignore[arg-type]
            text = done.choices[0].message.content or ""
        for start in range(0, max(1, len(text)), 4096):  # Telegram's limit per message
            await message.reply_text(text[start : start + 4096])

    app = Application.builder().token(args.token).base_url(args.base_url).concurrent_updates(True).build()
    app.add_handler(MessageHandler(filters.TEXT, answer))
    app.run_polling(poll_interval=0, timeout=10, drop_pending_updates=False)


if __name__ == "__main__":
    main()
