"""Application commands for the fake Discord (tests/fakes/discord_server.py): the REST endpoints a
bot registers them with and answers them through, and the INTERACTION_CREATE a user's command is.

- ``GET``/``PUT /applications/{app}/commands`` (global) and ``.../guilds/{guild}/commands``: the
  set as Discord stores it, validated as Discord does (at most 100, names ``[-_a-z0-9]{1,32}``,
  descriptions 1-100, options with a type, a name and a description; 400 code 50035 otherwise).
- ``PATCH /webhooks/{app}/{token}/messages/@original`` (or a message id) and ``POST
  /webhooks/{app}/{token}`` (a follow-up): authorized by the interaction token, not the bot token,
  and only after the interaction was acknowledged (10015 Unknown Webhook before). A deferred
  response (callback type 5) is a message that shows "thinking…" until it is edited.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from aiohttp import web

if TYPE_CHECKING:
    from tests.fakes.discord_server import FakeDiscord

_NAME = re.compile(r"[-_a-z0-9]{1,32}")
_INVALID = {"_errors": [{"code": "APPLICATION_COMMAND_INVALID", "message": "Invalid command"}]}


def routes(fake: FakeDiscord, r: web.UrlDispatcher, api: str) -> None:
    commands = CommandRoutes(fake)
    r.add_get(f"{api}/applications/{{app}}/commands", commands.get_global)
    r.add_put(f"{api}/applications/{{app}}/commands", commands.put_global)
    r.add_get(f"{api}/applications/{{app}}/guilds/{{gid}}/commands", commands.get_guild)
    r.add_put(f"{api}/applications/{{app}}/guilds/{{gid}}/commands", commands.put_guild)
    r.add_patch(f"{api}/webhooks/{{app}}/{{token}}/messages/{{mid}}", commands.edit_response)
    r.add_post(f"{api}/webhooks/{{app}}/{{token}}", commands.follow_up)


def problems(body: Any) -> list[str]:
    """Why Discord would refuse ``body`` as a bulk overwrite (empty: it would take it)."""
    if not isinstance(body, list):
        return ["not a list"]
    found: list[str] = []
    if len(body) > 100:
        found.append("more than 100 commands")
    names = [c.get("name") for c in body if isinstance(c, dict)]
    if len(set(names)) != len(names):
        found.append("a name twice")
    for c in body:
        if not isinstance(c, dict) or not isinstance(c.get("name"), str) or not _NAME.fullmatch(c["name"]):
            found.append(f"bad name {c!r:.60}")
            continue
        if not isinstance(c.get("description"), str) or not 1 <= len(c["description"]) <= 100:
            found.append(f"/{c['name']}: description length")
        for o in c.get("options") or []:
            ok = (
                isinstance(o, dict) and isinstance(o.get("type"), int) and _NAME.fullmatch(str(o.get("name")))
            )
            if not ok or not 1 <= len(str(o.get("description") or "")) <= 100:
                found.append(f"/{c['name']}: bad option")
    return found


class CommandRoutes:
    def __init__(self, fake: FakeDiscord) -> None:
        self.fake = fake

    def _check_app(self, request: web.Request) -> web.Response | None:
        if request.match_info["app"] != self.fake.application_id:
            return _error(404, 10002, "Unknown Application")
        return None

    def _stored(self, body: list[dict[str, Any]]) -> list[dict[str, Any]]:
        fake = self.fake
        return [
            {"id": fake.new_id(), "application_id": fake.application_id, "version": fake.new_id(),
             "default_member_permissions": None, "type": 1, "nsfw": False, **c}
            for c in body
        ]  # fmt: skip

    async def get_global(self, request: web.Request) -> web.Response:
        return self._check_app(request) or _json(self.fake.global_commands)

    async def put_global(self, request: web.Request) -> web.Response:
        if (bad := self._check_app(request)) is not None:
            return bad
        body = await request.json()
        if problems(body):
            return _error(400, 50035, "Invalid Form Body", {"0": _INVALID})
        self.fake.global_commands = self._stored(body)
        self.fake.command_puts += 1
        self.fake._notify()
        return _json(self.fake.global_commands)

    async def get_guild(self, request: web.Request) -> web.Response:
        return self._check_app(request) or _json(self.fake.guild_commands.get(request.match_info["gid"], []))

    async def put_guild(self, request: web.Request) -> web.Response:
        if (bad := self._check_app(request)) is not None:
            return bad
        body = await request.json()
        if problems(body):
            return _error(400, 50035, "Invalid Form Body", {"0": _INVALID})
        self.fake.guild_commands[request.match_info["gid"]] = self._stored(body)
        self.fake._notify()
        return _json(self.fake.guild_commands[request.match_info["gid"]])

    def _interaction(self, request: web.Request) -> str | None:
        """The id of the acknowledged interaction whose token the path carries."""
        token = request.match_info["token"]
        for iid, data in self.fake.interactions.items():
            if data.get("token") == token and iid in self.fake.interaction_responses:
                return iid
        return None

    async def edit_response(self, request: web.Request) -> web.Response:
        if (bad := self._check_app(request)) is not None:
            return bad
        iid = self._interaction(request)
        if iid is None:
            return _error(404, 10015, "Unknown Webhook")
        mid = request.match_info["mid"]
        if mid == "@original":
            mid = self.fake.originals.get(iid, "")
        data = self.fake._messages.get(mid)
        if data is None:
            return _error(404, 10008, "Unknown Message")
        payload = await _payload(request)
        content = payload.get("content") or ""
        if len(content) > 2000:
            return _error(400, 50035, "Invalid Form Body")
        data["content"], data["flags"] = content, 0  # no longer "thinking…"
        for m in self.fake.posted:
            if m.id == mid:
                m.content, m.edits = content, m.edits + 1
        self.fake._notify()
        return _json(data)

    async def follow_up(self, request: web.Request) -> web.Response:
        if (bad := self._check_app(request)) is not None:
            return bad
        iid = self._interaction(request)
        if iid is None:
            return _error(404, 10015, "Unknown Webhook")
        payload = await _payload(request)
        cid = str(self.fake.interactions[iid].get("channel_id"))
        data = self.fake._message_data(cid, self.fake.bot_id, payload.get("content") or "")
        self.fake._record(data)
        return _json(data)


async def _payload(request: web.Request) -> dict[str, Any]:
    if request.content_type.startswith("multipart/"):
        reader = await request.multipart()
        async for part in reader:
            if part.name == "payload_json":
                import json

                return dict(json.loads(await part.text()))  # type: ignore[union-attr]
        return {}
    body = await request.json()
    return body if isinstance(body, dict) else {}


def _json(data: Any, status: int = 200) -> web.Response:
    from tests.fakes.discord_server import _json as json_response

    return json_response(data, status)


def _error(status: int, code: int, message: str, errors: dict[str, Any] | None = None) -> web.Response:
    from tests.fakes.discord_server import _error as error_response

    return error_response(status, code, message, errors)


def command_interaction(
    fake: FakeDiscord, user_id: str, channel_id: str, name: str, args: str | None
) -> dict[str, Any]:
    """An INTERACTION_CREATE of type 2 (a chat-input command) as Discord sends it."""
    registered = next((c for c in fake.global_commands if c["name"] == name), None)
    options: list[dict[str, Any]] = []
    if args is not None and registered is not None and registered.get("options"):
        options = [{"name": registered["options"][0]["name"], "type": 3, "value": args}]
    payload = {"id": registered["id"] if registered else fake.new_id(), "name": name, "type": 1,
               **({"options": options} if options else {})}  # fmt: skip
    return fake.interaction(2, channel_id, user_id, payload)
