"""Images in the user's message, for a model that takes them, and out of it again later.

A turn's images go into its HumanMessage as OpenAI ``image_url`` content parts with a ``data:``
URL (what langchain-openai sends as is, and what other LangChain chat models convert). The gateway
hands over only images already scaled within ``agent.vision``'s limits, and only when the turn's
model is marked ``vision: true`` (docs/media.md).

Why images fade: the HumanMessage lives in the thread's checkpoint and every later model call of
the thread resends the history. Kept forever, each old picture would be paid for (tokens, upload)
on every call and ride along in each checkpoint snapshot. So an image stays for ``keep_turns``
user messages (the one it came with, and follow-ups like "and the top left corner?"); after that
a new turn replaces it, in place (same message id), with a line naming the file in the uploads,
where the agent's tools can still open it.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

from langchain_core.messages import AnyMessage, HumanMessage

from agent.turn import ImagePart

_SHOWN = "(Images attached below, in this order:"
IMAGES_KEY = "images"
"""``HumanMessage.additional_kwargs`` key listing the images a message carries (name, path): what a
placeholder names once the pixels are gone. langchain-openai does not send these kwargs."""


def human_content(text: str, images: Sequence[ImagePart]) -> str | list[str | dict[str, Any]]:
    """The HumanMessage content: ``text`` alone, or a text part followed by one ``image_url`` part
    per image."""
    if not images:
        return text
    names = ", ".join(image.path or image.name for image in images)
    parts: list[str | dict[str, Any]] = [
        {"type": "text", "text": text},
        {"type": "text", "text": f"{_SHOWN} {names})"},
    ]
    for image in images:
        url = f"data:{image.mime};base64,{base64.b64encode(image.data).decode('ascii')}"
        parts.append({"type": "image_url", "image_url": {"url": url}})
    return parts


def image_index(images: Sequence[ImagePart]) -> list[dict[str, str]]:
    """What :data:`IMAGES_KEY` holds for ``images``."""
    return [{"name": image.name, "path": image.path} for image in images]


def carries_images(message: AnyMessage) -> bool:
    return (
        isinstance(message, HumanMessage)
        and isinstance(message.content, list)
        and any(isinstance(p, dict) and p.get("type") in ("image_url", "image") for p in message.content)
    )


def faded(messages: Sequence[AnyMessage], keep_turns: int) -> list[HumanMessage]:
    """Replacements for the user messages whose images have been shown for ``keep_turns`` user
    messages, counting the new one about to be added: the same id and text, each image replaced by
    a line naming its file. Empty when nothing is due; every image is due with ``keep_turns=0``
    (the turn's model takes no images)."""
    humans = [m for m in messages if isinstance(m, HumanMessage)]
    due = humans[: max(0, len(humans) - (keep_turns - 1))]
    return [_without_images(m) for m in due if carries_images(m)]


def _without_images(message: HumanMessage) -> HumanMessage:
    text = "".join(
        p if isinstance(p, str) else str(p.get("text", ""))
        for p in message.content
        if isinstance(p, str)
        or (isinstance(p, dict) and p.get("type") == "text" and not str(p.get("text", "")).startswith(_SHOWN))
    )
    listed = message.additional_kwargs.get(IMAGES_KEY) or []
    names = ", ".join(str(i.get("path") or i.get("name")) for i in listed if isinstance(i, dict))
    note = f"[The images of this message are no longer attached; the files stay in your uploads: {names}]"
    return message.model_copy(update={"content": f"{text}\n\n{note}" if text else note})
