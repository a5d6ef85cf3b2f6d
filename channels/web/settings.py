"""The web chat's keys under ``channels.web`` in config.yaml."""

from __future__ import annotations

from pydantic import Field

from channels.settings import ChannelSettings


class WebSettings(ChannelSettings):
    """Web chat: a page of the operator console (``/console/chat``) where a logged-in person talks
    to the agent through the same gateway path as every chat app (journaled, streamed, files in and
    out, approvals as buttons). On whenever the console is (an admin token is set); the messages
    live in the daemon's database, so a reload, a restart or another daemon of a cluster shows the
    same conversation (docs/console.md, "Web chat")."""

    max_file_bytes: int = Field(10 * 1024 * 1024, ge=1024, le=50 * 1024 * 1024)
    """Largest file a person may upload into the chat, and the agent may send back."""
    max_files: int = Field(5, ge=0, le=20)
    """Files one message may carry."""
    max_text_chars: int = Field(20_000, ge=100, le=200_000)
    """Longest message a person may send (a longer one is refused with a note, not cut)."""
    poll_seconds: float = Field(0.5, gt=0, le=10)
    """How often an open chat page's stream looks in the database for what another daemon wrote
    (what this daemon writes is pushed at once)."""
    keep_days: float = Field(30.0, gt=0)
    """Web chat messages and files older than this are deleted by the daemon's periodic prune
    (``storage.prune_interval``): the chat's history, like every platform's, is not kept forever."""
    max_streams: int = Field(16, ge=1, le=1000)
    """Chat pages open at once on this daemon (each holds one event stream); past it, the oldest
    stream is closed (the page reconnects when it is looked at again)."""
