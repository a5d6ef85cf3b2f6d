"""The WhatsApp adapter's parts that need no daemon: the webhook signature, the payload reading,
the rendering, the Graph error mapping and where the bearer token may be sent; and the adapter
against FakeWhatsApp for sends, buttons and the token check."""

from __future__ import annotations

import pytest

from channels.base import (
    Button,
    FatalChannelError,
    PermanentSendError,
    Rendered,
    ReplyTarget,
    RetryAfter,
    TransientSendError,
)
from channels.whatsapp.api import Graph, GraphError, OutsideWindow, send_error
from channels.whatsapp.channel import WhatsAppChannel
from channels.whatsapp.inbound import changes, failed_status, signed, to_inbound
from channels.whatsapp.render import render, to_whatsapp
from channels.whatsapp.settings import WhatsAppSettings
from tests.fakes.whatsapp_server import PHONE_NUMBER_ID, VERSION, FakeWhatsApp

USER = "15550003333"


def test_signature_is_hmac_sha256_of_the_raw_body() -> None:
    import hashlib
    import hmac

    body = b'{"entry": []}'
    good = "sha256=" + hmac.new(b"s3cret", body, hashlib.sha256).hexdigest()
    assert signed("s3cret", body, good)
    assert signed("s3cret", body, good.upper().replace("SHA256", "sha256"))  # hex is case-free
    assert not signed("s3cret", body + b" ", good)
    assert not signed("other", body, good)
    assert not signed("s3cret", body, None) and not signed("s3cret", body, "")
    assert not signed("s3cret", body, "sha1=" + good[7:])
    assert not signed("", body, "sha256=" + hmac.new(b"", body, hashlib.sha256).hexdigest()), (
        "no secret, no pass"
    )


def test_changes_skip_other_numbers_and_other_fields_and_flag_unreadable_ones() -> None:
    fake = FakeWhatsApp()
    msg = fake.message(USER, "text", text={"body": "hi"})
    assert [c.messages if c else None for c in changes(fake.payload(msg), PHONE_NUMBER_ID)] == [[msg]]
    assert list(changes(fake.payload(msg, number="42"), PHONE_NUMBER_ID)) == []
    other = fake.payload(msg)
    other["entry"][0]["changes"][0]["field"] = "account_update"
    assert list(changes(other, PHONE_NUMBER_ID)) == []
    assert list(changes([1], PHONE_NUMBER_ID)) == [None]
    assert list(changes({"entry": [{"changes": [1]}]}, PHONE_NUMBER_ID)) == [None]
    names = next(iter(changes(fake.payload(msg, names={USER: "Ada"}), PHONE_NUMBER_ID)))
    assert names is not None and names.names == {USER: "Ada"}


def test_messages_become_inbound_values() -> None:
    fake = FakeWhatsApp()
    text = to_inbound(
        fake.message(USER, "text", text={"body": "hi"}, context={"id": "wamid.X"}), {USER: "Ada"}
    )
    assert text is not None and text.is_direct and text.addressed and text.chat_id == USER == text.sender_id
    assert text.sender_name == "Ada" and text.extra["replied_to"] == "wamid.X"
    image = to_inbound(
        fake.message(USER, "image", image={"id": "77", "mime_type": "image/jpeg", "caption": "c"}), {}
    )
    assert image is not None and image.text == "c" and image.attachments[0].name == "image.jpg"
    assert image.attachments[0].kind == "image" and image.attachments[0].file_id == "77"
    voice = to_inbound(
        fake.message(USER, "audio", audio={"id": "78", "mime_type": "audio/ogg", "voice": True}), {}
    )
    assert voice is not None and voice.attachments[0].kind == "voice"
    place = to_inbound(fake.message(USER, "location", location={"latitude": 1.5, "longitude": 2}), {})
    assert place is not None and "1.5, 2" in place.text
    sticker = to_inbound(fake.message(USER, "sticker", sticker={"id": "1"}), {})
    assert sticker is not None and sticker.unsupported == "stickers"
    odd = to_inbound(fake.message(USER, "brand_new_type"), {})
    assert odd is not None and odd.unsupported
    assert to_inbound(fake.message(USER, "reaction", reaction={"emoji": "👍"}), {}) is None
    with pytest.raises(TypeError):
        to_inbound(fake.message(USER, "text", text={"body": 1}), {})
    with pytest.raises(ValueError):
        to_inbound(fake.message("not-a-number", "text", text={"body": "x"}), {})


def test_failed_status_names_recipient_and_code() -> None:
    assert failed_status({"status": "failed", "recipient_id": USER, "errors": [{"code": 131047}]}) == (
        USER,
        131047,
    )
    assert failed_status({"status": "delivered"}) is None
    assert failed_status({"status": "failed", "recipient_id": "x\n", "errors": "no"}) == ("?", 0)


def test_markdown_becomes_whatsapp_formatting_with_code_untouched() -> None:
    out = to_whatsapp("# Title\n**bold** and *it* and ~~gone~~, [site](https://x.example)\n`**raw**`")
    assert out == "*Title*\n*bold* and _it_ and ~gone~, site (https://x.example)\n`**raw**`"
    assert to_whatsapp("```\n**kept**\n```") == "```\n**kept**\n```"
    parts = render("word " * 3000)
    assert len(parts) >= 2 and all(0 < len(p.text) <= 4096 for p in parts)


@pytest.mark.parametrize(
    ("status", "code", "kind"),
    [(401, 190, FatalChannelError), (400, 131047, OutsideWindow), (400, 130429, RetryAfter),
     (429, 4, RetryAfter), (500, 2, TransientSendError), (400, 100, PermanentSendError)],
)  # fmt: skip
def test_graph_errors_map_to_the_contract(status: int, code: int, kind: type) -> None:
    assert isinstance(send_error(GraphError(status, code, "m")), kind)


def test_bearer_token_goes_only_to_meta_media_hosts_or_the_graph_origin() -> None:
    graph = Graph("https://graph.facebook.com", VERSION, PHONE_NUMBER_ID, "tok")
    assert graph.media_allowed("https://lookaside.fbsbx.com/whatsapp_business/attachments/?mid=1")
    assert graph.media_allowed("https://graph.facebook.com/v21.0/media")
    assert not graph.media_allowed("http://lookaside.fbsbx.com/x"), "never over plain http"
    assert not graph.media_allowed("https://evil.example/fbsbx.com")
    assert not graph.media_allowed("https://fbsbx.com.evil.example/x")


def test_settings_declare_the_four_credentials_and_validate_endpoints() -> None:
    s = WhatsAppSettings()
    assert "WHATSAPP_APP_SECRET" in (s.missing() or "") and "WHATSAPP_VERIFY_TOKEN" in (s.missing() or "")
    with pytest.raises(ValueError):
        WhatsAppSettings(graph_url="https://graph.facebook.com/evil path")
    with pytest.raises(ValueError):
        WhatsAppSettings(api_version="latest")


async def test_send_buttons_and_lists_respect_whatsapp_limits(whatsapp: FakeWhatsApp) -> None:
    ch = WhatsAppChannel(PHONE_NUMBER_ID, whatsapp.token, whatsapp.app_secret, whatsapp.verify_token,
                         graph_url=whatsapp.base_url, api_version=VERSION)  # fmt: skip
    target = ReplyTarget("whatsapp", USER, reply_to="wamid.U")
    try:
        await ch.send_buttons(target, Rendered("Pick"), [Button("A very long label indeed here", "a"),
                                                         Button("B", "b")], idempotency_key="k")  # fmt: skip
        sent = whatsapp.sent[-1].body["interactive"]
        titles = [b["reply"]["title"] for b in sent["action"]["buttons"]]
        assert sent["type"] == "button" and all(len(t) <= 20 for t in titles) and titles[1] == "B"
        assert whatsapp.sent[-1].reply_to == "wamid.U"
        await ch.send_buttons(target, Rendered("x" * 2000), [Button(str(i), str(i)) for i in range(5)],
                              idempotency_key="k2")  # fmt: skip
        assert whatsapp.sent[-2].kind == "text" and len(whatsapp.sent[-2].text) == 2000
        assert whatsapp.sent[-1].body["interactive"]["type"] == "list"
        with pytest.raises(PermanentSendError):
            await ch.send_buttons(target, Rendered("x"), [Button(str(i), str(i)) for i in range(11)],
                                  idempotency_key="k3")  # fmt: skip
        with pytest.raises(PermanentSendError):
            await ch.edit(target, "wamid.B", Rendered("x"))
        whatsapp.outside_window.add(USER)
        with pytest.raises(OutsideWindow):
            await ch.send(target, Rendered("late"), idempotency_key="k4")
        assert ch.notice and "24 hours" in ch.notice
    finally:
        await ch.close()


async def test_a_token_refused_twice_is_fatal_and_later_calls_make_no_request(whatsapp: FakeWhatsApp) -> None:
    ch = WhatsAppChannel(PHONE_NUMBER_ID, whatsapp.token, whatsapp.app_secret, whatsapp.verify_token,
                         graph_url=whatsapp.base_url, api_version=VERSION)  # fmt: skip
    whatsapp.revoke_token()

    async def sink(_: object) -> None:
        return None

    try:
        with pytest.raises(FatalChannelError) as err:
            await ch.run(sink)
        assert whatsapp.token not in str(err.value) and "190" in str(err.value)
        calls = len(whatsapp.calls)
        with pytest.raises(FatalChannelError):
            await ch.send(ReplyTarget("whatsapp", USER), Rendered("x"), idempotency_key="k")
        assert len(whatsapp.calls) == calls
    finally:
        await ch.close()
