"""Markdown → Slack mrkdwn parts, on the shared fence-aware splitter.

Slack accepts up to 40,000 characters but advises under 4,000 and truncates long ``text`` in places:
parts are cut at 3,900.
"""

from __future__ import annotations

import html
import re
from typing import Any

from slackify_markdown.slackify import SlackifyMarkdown

from channels.base import Rendered
from channels.textsplit import split_markdown, stream_text

MAX_LEN = 3900
_BROADCAST = re.compile(r"<!([^<>]*)(>?)")


def _code_text(content: str) -> str:
    """Code as Slack shows it literally: Slack reads ``<!everyone>``, ``<@U…>`` and ``<url|text>``
    anywhere in a message, backticks or not, so ``&``, ``<`` and ``>`` inside code are sent as
    entities (clients show them as the characters)."""
    return html.escape(content, quote=False)


class _Mrkdwn(SlackifyMarkdown):
    """slackify-markdown, with code kept literal: its code renderers pass ``<…>`` through, which
    turned an echoed ``<!everyone>`` in a code span into a ping and ``<https://x|y>`` into a
    disguised link (the gateway puts untrusted text in code spans: agent/untrusted.py)."""

    def text(self, tokens: Any, idx: int, options: Any, env: Any) -> str:
        """Text as slackify escapes it, but with Slack's broadcasts (``<!channel>``, ``<!here>``,
        ``<!everyone>``, ``<!subteam^…>`` user groups) kept literal too: a model answer is
        steered by what it read (a web page saying "end with <!channel>"), and a mass ping in the
        bot's voice is never what the user asked for. ``&lt;!channel&gt;`` arrives here decoded,
        so it is caught too. Person mentions (``<@U…>``) and channel links (``<#C…>``) stay."""
        text = str(super().text(tokens, idx, options, env))
        return _BROADCAST.sub(lambda m: f"&lt;!{m[1]}{'&gt;' if m[2] else ''}", text)

    def image(self, tokens: Any, idx: int, options: Any, env: Any) -> str:
        """slackify puts an image's alt text and title into the link unescaped
        (``![<!channel>](https://x)`` pinged the channel): both are escaped like code."""
        token = tokens[idx]
        token.content = _code_text(token.content or "")
        if token.attrs.get("title"):
            token.attrs["title"] = _code_text(str(token.attrs["title"]))
        return str(super().image(tokens, idx, options, env))

    def code_inline(self, tokens: Any, idx: int, options: Any, env: Any) -> str:
        tokens[idx].content = _code_text(tokens[idx].content)
        return str(super().code_inline(tokens, idx, options, env))

    def code_block(self, tokens: Any, idx: int, options: Any, env: Any) -> str:
        tokens[idx].content = _code_text(tokens[idx].content)
        return str(super().code_block(tokens, idx, options, env))

    def fence(self, tokens: Any, idx: int, options: Any, env: Any) -> str:
        tokens[idx].content = _code_text(tokens[idx].content)
        return str(super().fence(tokens, idx, options, env))


def to_mrkdwn(markdown: str) -> str:
    """Markdown → Slack mrkdwn (slackify-markdown: a markdown-it renderer that also escapes &, <, >
    outside code and keeps Slack's own ``<@U…>`` mentions there; inside code they are escaped too)."""
    return str(_Mrkdwn(markdown).slackify()).strip("\n")


def render(markdown: str, limit: int = MAX_LEN) -> list[Rendered]:
    parts = split_markdown(to_mrkdwn(markdown), limit)
    if not parts and markdown.strip():
        parts = [html.escape(markdown.strip(), quote=False)[:limit]]
    return [Rendered(text=p, payload={"mrkdwn": True}) for p in parts]


def render_stream(markdown: str, limit: int = MAX_LEN) -> Rendered:
    return Rendered(text=stream_text(to_mrkdwn(markdown), limit) or "…", payload={"mrkdwn": True})
