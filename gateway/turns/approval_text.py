"""How an approval request reads in the chat: the exact call, bounded, masked and inert
(docs/approvals.md, "What the chat shows"). Split from gateway/turns/approvals.py, which records,
posts and settles the requests."""

from __future__ import annotations

import json
import re
from typing import Any

from agent.events import ApprovalRequested
from agent.untrusted import code_span
from channels.base import scrub
from gateway.config.durations import in_words
from gateway.turns.grants import typed_help

ARGS_CHARS = 1500
"""Characters of a call's arguments shown in the chat; the rest is cut (the agent has it all)."""
VALUE_CHARS = 700
"""Characters of one argument value shown."""


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


_INVISIBLE = re.compile(
    r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff\ufff9-\ufffb]"
)
"""Characters that do not show as themselves: controls, zero-width and bidirectional marks (a
right-to-left override makes ``rm -rf ~`` display as something else). Shown escaped."""


def _visible(text: str) -> str:
    return _INVISIBLE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _args_text(args: dict[str, Any], value_chars: int | None) -> str:
    cut = {k: _cut(v, value_chars) if isinstance(v, str) and value_chars else v for k, v in args.items()}
    if set(cut) == {"command"} and isinstance(cut["command"], str):
        return _visible(cut["command"])  # a shell command reads best as itself
    return _visible(json.dumps(cut, ensure_ascii=False, indent=2, default=str))


def shown_args(args: dict[str, Any]) -> str:
    """The call's arguments for the chat: each value cut, the whole cut, credentials masked
    (the agent already masked configured secrets), characters that would not show as themselves
    escaped, fences broken so the code block holds."""
    return scrub(_cut(_args_text(args, VALUE_CHARS), ARGS_CHARS)).replace("```", "`\u200b``")


def hidden_chars(args: dict[str, Any]) -> int:
    """About how many characters of the call the chat does not show (cut off)."""
    full = len(_args_text(args, None))
    return max(0, full - len(_cut(_args_text(args, VALUE_CHARS), ARGS_CHARS))) if full > 0 else 0


def request_text(
    event: ApprovalRequested, requester: str, timeout: float, code: str, buttons: bool, standing: bool = False
) -> str:
    """The request as the chat shows it (Markdown); ``standing``: Allow here / Always are offered."""
    # The code is shown with buttons too: a Lark app without the card callback subscription shows
    # buttons that reach no one, and typed answers always work.
    how = "\n" + typed_help(code, buttons, standing)
    hidden = hidden_chars(event.args)
    warning = (
        f"⚠️ Not all of it is shown: about {hidden:,} more characters were cut (at each …). "
        "Approve only if you trust what you cannot see.\n"
        if hidden
        else ""
    )
    if event.untrusted:
        warning += (
            f"⚠️ It asks after reading content you did not write ({code_span(event.untrusted, 300)}): "
            "the call may follow instructions from there.\n"
        )
    return (
        f"🔐 **Approval needed**: the agent wants to run `{event.tool}`\n"
        f"```\n{shown_args(event.args)}\n```\n{warning}"
        f"Asked for {code_span(requester)}; only they or an admin can answer. "
        f"Times out in {in_words(timeout)} (then it is denied).{how}"
    )
