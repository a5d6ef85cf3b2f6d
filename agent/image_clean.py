"""Images as pixels only, for anything the model provider is sent (docs/media.md, "Privacy").

Used by the gateway for images users send (gateway/intake/media.py) and by the sandbox backend when the
agent reads an image file with read_file (an upload is the user's original photo, GPS and all).
Pillow is imported on first use, not with the daemon.
"""

from __future__ import annotations

import io
import logging
import warnings
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from PIL import Image

log = logging.getLogger(__name__)

FORMATS = {".png": "PNG", ".jpg": "JPEG", ".jpeg": "JPEG", ".webp": "WEBP", ".gif": "GIF"}
"""Image files read_file shows the model, by suffix, re-encoded in the same format."""
MAX_SIDE = 2048
"""Pixels of the longer side of an image read_file shows (larger ones are scaled down)."""
MAX_PIXELS = 50_000_000
"""Images claiming more pixels are not decoded (a decompression bomb)."""


class NotShown(ValueError):
    """The file cannot be shown as an image; the text says why."""


def clean_image_file(data: bytes, suffix: str) -> bytes:
    """``data`` re-encoded in the format its ``suffix`` names, pixels only, at most
    :data:`MAX_SIDE` on its longer side. Raises :class:`NotShown`."""
    from PIL import Image, ImageOps

    fmt = FORMATS[suffix.lower()]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            opened = Image.open(io.BytesIO(data), formats=(fmt,))
            width, height = opened.size
            if width * height > MAX_PIXELS:
                raise NotShown(f"it claims {width}×{height} pixels, more than I decode")
            opened.draft("RGB", (MAX_SIDE, MAX_SIDE))
            img = ImageOps.exif_transpose(opened)
            img.thumbnail((MAX_SIDE, MAX_SIDE), Image.Resampling.LANCZOS)
            img = pixels_only(img)
            if fmt == "JPEG" and img.mode == "RGBA":
                img = img.convert("RGB")
            out = io.BytesIO()
            img.save(out, fmt, **({"quality": 90} if fmt in ("JPEG", "WEBP") else {}))
            return out.getvalue()
    except NotShown:
        raise
    except Exception as exc:  # hostile bytes make decoders raise nearly anything
        raise NotShown(f"it is not a readable {fmt} image ({type(exc).__name__})") from None


def pixels_only(img: Image.Image) -> Image.Image:
    """A new RGB, RGBA or L image holding only ``img``'s pixels, its colours in sRGB.

    Why a new image rather than dropping keys: Pillow's encoders copy some of ``img.info`` into
    the file they write (the JPEG ``comment``, ``icc_profile``, ``dpi``, PNG ``exif``), and which
    keys they copy changes between versions. An image built with ``frombytes`` has an empty
    ``info``: whatever a future encoder copies, there is nothing to copy. An embedded ICC
    profile is applied first (a wide-gamut or CMYK photo keeps its colours), then dropped."""
    from PIL import Image

    icc = img.info.get("icc_profile")
    if img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
        img = img.convert("RGBA")
    elif img.mode in ("L", "1", "I;16", "I", "F"):
        img = img.convert("L")
    elif img.mode != "RGB":
        img = img.convert("RGB")
    if icc and img.mode in ("RGB", "RGBA"):
        img = _to_srgb(img, icc)
    return Image.frombytes(img.mode, img.size, img.tobytes())


def _to_srgb(img: Image.Image, icc: bytes) -> Image.Image:
    """``img``'s pixels converted from its embedded profile to sRGB; unchanged when the profile
    cannot be used (a damaged profile costs some colour accuracy, never the image)."""
    from PIL import ImageCms

    try:
        source = ImageCms.ImageCmsProfile(io.BytesIO(icc))
        converted = ImageCms.profileToProfile(
            img, source, ImageCms.createProfile("sRGB"), outputMode=img.mode
        )
    except Exception as exc:  # a hostile or broken profile: keep the pixels as they are
        log.info("ICC profile not applied (%s); the image is sent without it", type(exc).__name__)
        return img
    return converted if converted is not None else img
