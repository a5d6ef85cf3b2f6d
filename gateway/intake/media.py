"""Images and voice notes users send, made into something the model can take (docs/media.md).

Images: a model whose ``models[].vision`` is on sees each image as part of the user's message
(:class:`agent.turn.ImagePart`), scaled down to ``agent.vision``'s limits and re-encoded, which also
drops the photo's metadata (EXIF, GPS position) before it leaves for the model provider. Any file
is hostile input here: the decoder only runs on the formats listed below, an image claiming more
pixels than ``max_pixels`` is never decoded (a decompression bomb), and anything Pillow cannot
read stays a plain file with a note to the user; no image ever fails the turn.

Voice: see :mod:`gateway.intake.transcribe`; this module only says which attachments are audio.
"""

from __future__ import annotations

import asyncio
import io
import logging
import mimetypes
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agent.config import ModelSpec, VisionSettings
from agent.image_clean import pixels_only
from agent.turn import ImagePart
from channels.base import Attachment

if TYPE_CHECKING:
    from PIL import Image

    from gateway.intake.attachments import Uploads
    from gateway.intake.host import IntakeHost

log = logging.getLogger(__name__)

IMAGE, VOICE, AUDIO, FILE = "image", "voice", "audio", ""
"""What an attachment is to the gateway (:attr:`channels.base.Attachment.kind`)."""

DECODABLE = ("JPEG", "PNG", "GIF", "WEBP", "BMP", "TIFF")
"""Formats Pillow may try on a user's file: the common raster formats, nothing exotic (each
extra decoder is more attack surface for a file nobody sends a chat bot)."""

_QUALITIES = (85, 70, 55, 40)
"""JPEG qualities tried in turn until the image fits ``max_bytes``; then it is scaled down."""


def kind_of(att: Attachment) -> str:
    """The adapter's word when it said (a Telegram photo, a Discord voice message), else the
    MIME type or the file name's: ``image``, ``audio`` or ``""`` (a file like any other)."""
    if att.kind in (IMAGE, VOICE, AUDIO):
        return att.kind
    mime = (att.mime_type or "").split(";", 1)[0].strip().lower()
    if not mime or mime == "application/octet-stream":
        mime = mimetypes.guess_type(att.name)[0] or ""
    if mime.startswith("image/") and "svg" not in mime:  # SVG is text, not pixels
        return IMAGE
    if mime.startswith("audio/") or mime == "video/ogg":  # Ogg voice notes are sometimes video/ogg
        return AUDIO
    return FILE


class NotAnImage(ValueError):
    """The bytes are not an image this module will show the model; the text says why."""


def prepare_image(data: bytes, *, name: str, path: str, limits: VisionSettings) -> ImagePart:
    """``data`` as an image within ``limits``: at most ``max_side`` pixels on its longer side and
    ``max_bytes`` encoded, JPEG (PNG when it has transparency and fits). Raises
    :class:`NotAnImage` for anything that is not a readable image of an allowed format.

    Only pixels leave: the result is encoded from a new image built from the decoded pixels, so
    nothing of the file's metadata (EXIF and its GPS position, XMP, IPTC, the JPEG comment, PNG
    text chunks, WebP EXIF/XMP chunks, DPI, the ICC profile after its colours are converted to
    sRGB) can ride along to the model provider. An animation shows its first frame.

    CPU-bound (about 0.1-0.5 s for a 12-megapixel photo): call it in a worker thread. Pillow is
    imported here, on the first image, not with the daemon (docs/performance.md, "Memory")."""
    from PIL import Image, ImageOps

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            opened = Image.open(io.BytesIO(data), formats=DECODABLE)
            width, height = opened.size
            # Checked on the header, before a single pixel is decoded (Pillow's own MAX_IMAGE_PIXELS
            # guard, kept as a second line, only warns below twice its value).
            if width * height > limits.max_pixels:
                raise NotAnImage(f"it claims {width}×{height} pixels, more than I decode")
            # JPEG: let the decoder scale down by 2-8× while reading (much less memory and time).
            opened.draft("RGB", (limits.max_side, limits.max_side))
            img = ImageOps.exif_transpose(opened)  # loads the pixels; a phone photo's rotation applied
            img.thumbnail((limits.max_side, limits.max_side), Image.Resampling.LANCZOS)
            img = pixels_only(img)  # nothing but pixels leaves (agent/image_clean.py)
            return ImagePart(*_encode(img, limits.max_bytes), name=name, path=path)
    except NotAnImage:
        raise
    except Exception as exc:  # hostile bytes make decoders raise nearly anything: no image, no crash
        raise NotAnImage(_why(exc)) from None


def _why(exc: Exception) -> str:
    from PIL import Image

    if isinstance(exc, Image.DecompressionBombError | Image.DecompressionBombWarning):
        return "it claims more pixels than I decode"
    if isinstance(exc, Image.UnidentifiedImageError):
        return "it is not an image format I can read"
    if isinstance(exc, MemoryError):
        return "it is too large to decode"
    return "it is damaged or not really an image"


def _encode(img: Image.Image, max_bytes: int) -> tuple[str, bytes]:
    """(mime, bytes) of ``img`` within ``max_bytes``: PNG keeps transparency when it fits,
    otherwise JPEG at falling quality, then at 3/4 of the size, until it fits."""
    from PIL import Image

    if img.mode == "RGBA":
        png = io.BytesIO()
        img.convert("RGBA").save(png, "PNG", optimize=True)
        if png.tell() <= max_bytes:
            return "image/png", png.getvalue()
        flat = Image.new("RGB", img.size, "white")
        flat.paste(img.convert("RGBA"), mask=img.convert("RGBA").getchannel("A"))
        img = flat
    while True:
        for quality in _QUALITIES:
            out = io.BytesIO()
            img.save(out, "JPEG", quality=quality, optimize=True)
            if out.tell() <= max_bytes:
                return "image/jpeg", out.getvalue()
        if min(img.size) <= 16:
            return "image/jpeg", out.getvalue()  # cannot happen with max_bytes >= 10 KB
        img = img.resize((max(1, img.width * 3 // 4), max(1, img.height * 3 // 4)), Image.Resampling.LANCZOS)


def takes_images(spec: ModelSpec | None) -> bool:
    return spec is not None and spec.vision


def _spec(gateway: IntakeHost, name: str | None) -> ModelSpec | None:
    wanted = name or gateway.config.agent.model
    return next((m for m in gateway.config.models if m.name == wanted), None)


async def shown_images(gateway: IntakeHost, uploads: Uploads, model: str | None) -> tuple[ImagePart, ...]:
    """The images of ``uploads`` to show the turn's model (``model``: its name, None for the
    default), prepared within ``agent.vision``; () when that model does not take images. An image
    that cannot be shown gets a note for the user in ``uploads.notes`` and stays a plain file."""
    if not uploads.images or not takes_images(_spec(gateway, model)):
        return ()
    limits = gateway.config.agent.vision
    shown: list[ImagePart] = []
    for image in uploads.images[: limits.max_images]:
        try:
            part = await asyncio.to_thread(
                prepare_image, image.data, name=image.name, path=image.path, limits=limits
            )
        except NotAnImage as exc:
            log.info("not showing %s to the model: %s", image.name, exc)
            uploads.notes.append(
                f"⚠️ I could not open {image.name} as an image ({exc}), so the model did not see "
                "it; the agent has it as a file."
            )
            continue
        shown.append(part)
    extra = len(uploads.images) - limits.max_images
    if extra > 0:
        uploads.notes.append(
            f"🖼 I showed the model the first {limits.max_images} images; the other {extra} "
            "are there as files."
        )
    return tuple(shown)


@dataclass(frozen=True, slots=True)
class Received:
    """A user's image or recording, as downloaded (kept for the turn only, never stored)."""

    name: str
    """The file name the agent sees (its upload's basename)."""
    path: str
    """Where the agent sees it (its uploads)."""
    data: bytes
