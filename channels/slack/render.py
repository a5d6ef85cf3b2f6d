"""Markdown → Slack mrkdwn parts, on the shared fence-aware splitter.

Slack accepts up to 40,000 characters but advises under 4,000 and truncates long ``text`` in places:
parts are cut at 3,900.
"""

from __future__ import annotations

import html

from slackify_markdown import slackify_markdown

from channels.base import Rendered
from channels.textsplit import split_markdown, stream_text

MAX_LEN = 3900


def to_mrkdwn(markdown: str) -> str:
    """Markdown → Slack mrkdwn (slackify-markdown: a markdown-it renderer that also escapes &, <, >
    and keeps Slack's own ``<@U…>`` mentions)."""
    return slackify_markdown(markdown).strip("\n")


def render(markdown: str, limit: int = MAX_LEN) -> list[Rendered]:
    parts = split_markdown(to_mrkdwn(markdown), limit)
    if not parts and markdown.strip():
        parts = [html.escape(markdown.strip(), quote=False)[:limit]]
    return [Rendered(text=p, payload={"mrkdwn": True}) for p in parts]


def render_stream(markdown: str, limit: int = MAX_LEN) -> Rendered:
    return Rendered(text=stream_text(to_mrkdwn(markdown), limit) or "…", payload={"mrkdwn": True})
