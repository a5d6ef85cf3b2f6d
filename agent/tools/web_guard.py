"""The address guard of ``web_fetch``: which hosts and addresses a fetch may reach, and a connector
that enforces it on the address every socket actually connects to.

Why the check sits on the socket and not on the URL text
--------------------------------------------------------
A URL host is not an address. The HTTP client normalises it first (yarl's IDNA step folds
fullwidth digits, circled digits, ``。``/``．``/``｡`` and more, so ``１２７.０.０.１`` *becomes*
``127.0.0.1``), libc accepts legacy IPv4 spellings (``2130706433``, ``0x7f.1``, ``127.1``,
``017700000001``), IPv6 can carry an IPv4 address (``::ffff:127.0.0.1``, 6to4, NAT64), and a name
can resolve to anything, differently the second time it is asked. Any check that looks at the URL
and then lets the client do its own parsing and resolving is one normalisation away from a bypass.

So the one check that matters runs on the socket address, in :class:`GuardedConnector`:

1. ``socket_factory`` (a public ``TCPConnector`` argument since aiohttp 3.12, handed to
   aiohappyeyeballs): aiohttp calls it with the final ``sockaddr`` of *every* connection attempt,
   whether the host was an IP literal (for which aiohttp never calls a resolver) or a name, and
   before ``connect()``. A refused address gets no SYN, let alone a request.
2. ``_create_connection`` (the hook ``BaseConnector.connect`` calls; overridden in compat/aiohttp.py):
   after the connection is made and before ``connect`` returns it to the request, the transport's
   peer address is checked again (belt and braces, and the whole guard on an aiohttp without
   ``socket_factory``). Proxied requests are refused here outright.

Not ``_resolve_host``: it is private, its signature has changed within 3.x, and it sees a host
string, not the address a socket ends up connected to.

In front of that, two checks give the model a clear reason early: :func:`check_target` judges the
host as the client will see it (the very ``yarl.URL`` handed to aiohttp, plus NFKC and
digit-folded readings of the text), and :class:`GuardedResolver` refuses a name if *any* of its
addresses is not public. aiohttp connects only to the addresses that resolver returned (the DNS
cache is off, nothing resolves twice), and the socket check sees those same addresses.

``allow_hosts`` (``WebSettings``) lets an operator open exact names, ``*.suffix`` names, IPs and
networks. A name entry applies to connections made for that name only (a context variable carries
the request's host to the socket check), so allowing ``wiki.internal`` does not open its address
to a URL that spells the address directly.
"""

from __future__ import annotations

import codecs
import contextvars
import inspect
import ipaddress
import socket
import unicodedata
from collections.abc import Collection, Iterable
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.client_proto import ResponseHandler
from aiohttp.resolver import DefaultResolver
from langchain_core.tools import ToolException
from yarl import URL

from compat.aiohttp import CheckedConnector, Connect

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_REASON = "a private, loopback, link-local or reserved address"
_HINT = " (an operator can allow it with agent.web.allow_hosts)"

# Explicit tables, so the policy does not move with the Python version's ipaddress tables (3.11
# calls fec0::/10 and 3fff::/20 global, for one). ``is_global`` is required on top of them.
_V4_DENY = tuple(
    ipaddress.IPv4Network(n)
    for n in (
        "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
        "172.16.0.0/12", "192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24", "192.168.0.0/16",
        "198.18.0.0/15", "198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4",
    )
)  # fmt: skip
_V6_DENY = tuple(
    ipaddress.IPv6Network(n)
    for n in (
        "::/96",  # unspecified, loopback and the deprecated IPv4-compatible ::a.b.c.d
        "::ffff:0:0:0/96",  # SIIT IPv4-translated
        "64:ff9b:1::/48",  # local-use NAT64
        "100::/64", "2001::/32",  # discard-only; Teredo (tunnels to an obfuscated IPv4)
        "2001:db8::/32", "3fff::/20", "5f00::/16",
        "fc00::/7", "fe80::/10", "fec0::/10", "ff00::/8",
    )
)  # fmt: skip
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_V4_IN_LOW_BITS = (ipaddress.IPv6Network("::/96"), ipaddress.IPv6Network("::ffff:0:0:0/96"))
# Characters IDNA (UTS 46) maps to a label separator; NFKC already turns U+FF0E and U+2024 into ".".
_DOTS = str.maketrans({"\u3002": ".", "\uff61": ".", "\uff0e": "."})

# The URL host of the connection being made, for the socket check of name entries of allow_hosts.
_CONNECT_HOST: contextvars.ContextVar[str | None] = contextvars.ContextVar("web_connect_host", default=None)


class UrlRefused(ToolException):
    """The URL is not allowed (scheme, or a host that is or resolves to a non-public address)."""


class AddressRefusedError(OSError):
    """Raised by the socket factory: an ``OSError``, so aiohappyeyeballs tries the next address
    and aiohttp wraps it as ``ClientConnectorError``; the connector keeps the message."""


def embedded_ipv4(ip: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address stands for (mapped, 6to4, NAT64), else None."""
    if isinstance(ip, ipaddress.IPv4Address):
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def ip_allowed(ip: IPAddress) -> bool:
    """True only for public unicast addresses; v4 addresses embedded in v6 are judged as v4."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id:
        ip = ipaddress.IPv6Address(str(ip).split("%", 1)[0])
    embedded = embedded_ipv4(ip)
    if embedded is not None:
        return ip_allowed(embedded)
    deny = _V4_DENY if isinstance(ip, ipaddress.IPv4Address) else _V6_DENY
    if any(ip in net for net in deny):
        return False
    return ip.is_global and not (
        ip.is_multicast or ip.is_reserved or ip.is_unspecified or ip.is_loopback or ip.is_link_local
    )


def parse_ip(text: str) -> IPAddress | None:
    """The address ``text`` denotes for a socket API, in any ASCII spelling: brackets, zone id
    (``%eth0``, ``%25eth0``) and trailing dots dropped; legacy IPv4 (``2130706433``, ``0x7f.1``,
    ``017700000001``, ``127.1``) read as ``inet_aton`` reads it. None for a name."""
    text = text.strip().removeprefix("[").removesuffix("]").split("%", 1)[0].rstrip(".")
    if not text or not text.isascii():
        return None
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        pass
    return _legacy_ipv4(text)


def _legacy_ipv4(text: str) -> ipaddress.IPv4Address | None:
    parts = text.split(".")
    if not 1 <= len(parts) <= 4:
        return None
    values: list[int] = []
    for part in parts:
        low = part.lower()
        if low.startswith("0x"):
            digits, base = low[2:] or "0", 16
        elif len(low) > 1 and low.startswith("0"):
            digits, base = low[1:], 8
        else:
            digits, base = low, 10
        try:
            values.append(int(digits, base) if digits.isalnum() else -1)
        except ValueError:
            return None
    *head, last = values
    if any(not 0 <= v <= 255 for v in head) or not 0 <= last < 256 ** (4 - len(head)):
        return None
    number = last
    for i, v in enumerate(head):
        number += v << (8 * (3 - i))
    return ipaddress.IPv4Address(number)


def host_readings(host: str) -> set[str]:
    """``host`` and the ways a client, resolver or IDNA step may read it: NFKC, IDNA dots, every
    Unicode decimal digit as ASCII (Arabic-Indic, Devanagari...), punycode labels decoded."""
    out = {host}
    for text in (host, unicodedata.normalize("NFKC", host)):
        folded = "".join(
            str(d) if (d := unicodedata.decimal(ch, None)) is not None else ch
            for ch in unicodedata.normalize("NFKC", text.translate(_DOTS)).translate(_DOTS)
        )
        out |= {text, folded}
        labels = folded.lower().split(".")
        if any(label.startswith("xn--") for label in labels):
            out |= host_readings(".".join(_unpunycode(label) for label in labels)) - {host}
    return out


def _unpunycode(label: str) -> str:
    if not label.startswith("xn--"):
        return label
    try:
        return codecs.decode(label[4:].encode("ascii"), "punycode")
    except (UnicodeError, ValueError):
        return label


class AddressPolicy:
    """Public addresses, plus what ``allow_hosts`` opens: exact names, ``*.suffix`` names, IPs
    and networks (an IPv6 address carrying an IPv4 one matches the IPv4 entries too)."""

    def __init__(self, allow_hosts: Iterable[str] = ()) -> None:
        names: set[str] = set()
        suffixes: list[str] = []
        networks: list[IPNetwork] = []
        for entry in allow_hosts:
            entry = entry.strip()
            try:
                networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
                continue
            except ValueError:
                pass
            if entry.startswith("*."):
                suffixes.append("." + normalize_name(entry[2:]))
            else:
                names.add(normalize_name(entry))
        self.names = frozenset(names)
        self.suffixes = tuple(suffixes)
        self.networks = tuple(networks)

    def name_allowed(self, host: str | None) -> bool:
        if not host or not (self.names or self.suffixes):
            return False
        name = normalize_name(host)
        return name in self.names or name.endswith(self.suffixes)

    def address_allowed(self, ip: IPAddress, host: str | None = None) -> bool:
        if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id:
            ip = ipaddress.IPv6Address(str(ip).split("%", 1)[0])
        if ip_allowed(ip) or self.name_allowed(host):
            return True
        candidates = [a for a in (ip, embedded_ipv4(ip)) if a is not None]
        return any(a in net for net in self.networks for a in candidates if a.version == net.version)

    def check(self, ip: IPAddress, shown: str, *, resolved: bool = False, host: str | None = None) -> None:
        """Raise UrlRefused unless ``ip`` may be reached. ``shown`` names the host in the message."""
        if not self.address_allowed(ip, host):
            verb = "resolves to" if resolved else "is"
            raise UrlRefused(f"refused: {shown} {verb} {_REASON} ({describe(ip)}){_HINT}")


def describe(ip: IPAddress) -> str:
    """``ip`` for a message, with the IPv4 address an IPv6 one carries (mapped, compatible,
    translated, 6to4, NAT64, Teredo client), so ``::ffff:a9fe:a9fe`` reads as metadata."""
    if isinstance(ip, ipaddress.IPv4Address):
        return str(ip)
    inner = embedded_ipv4(ip)
    if inner is None and ip.teredo is not None:
        inner = ip.teredo[1]
    if inner is None and int(ip) > 1 and any(ip in net for net in _V4_IN_LOW_BITS):
        inner = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return f"{ip}, which is {inner}" if inner is not None else str(ip)


def normalize_name(host: str) -> str:
    """A host name as yarl (so aiohttp) spells it: IDNA-encoded, lower case, no trailing dot."""
    host = host.strip().rstrip(".")
    try:
        host = URL.build(scheme="http", host=host).raw_host or host
    except (ValueError, UnicodeError):
        pass
    return host.lower().rstrip(".")


def _as_policy(policy: AddressPolicy | Collection[str] | None) -> AddressPolicy:
    """An ``AddressPolicy``, or one made of ``allow_hosts``-style entries (the older API's exact
    exempt IPs are such entries)."""
    if isinstance(policy, AddressPolicy):
        return policy
    return AddressPolicy(policy or ())


def check_ip(address: str, shown: str, exempt: AddressPolicy | Collection[str] = ()) -> None:
    """Raise UrlRefused unless ``address`` (an IP, any ASCII spelling) may be reached."""
    ip = parse_ip(address)
    if ip is None:
        raise UrlRefused(f"refused: {shown} is not an IP address")
    _as_policy(exempt).check(ip, shown)


def check_url(url: str, policy: AddressPolicy | Collection[str] = ()) -> str:
    """:func:`check_target` for callers that want the URL text back (unchanged)."""
    check_target(url, _as_policy(policy))
    return url


def check_target(url: str | URL, policy: AddressPolicy) -> URL:
    """Parse ``url`` exactly as aiohttp will (``yarl.URL``) and refuse a bad scheme or a host that
    is, in any reading, a non-public address. Returns the URL object to hand to aiohttp, so the
    host checked is the host connected to. Names are left to the resolver and the socket check."""
    try:
        target = URL(url)
        target.port  # noqa: B018  # a malformed port raises here
        text_host = urlsplit(str(url)).hostname or ""
    except (ValueError, UnicodeError) as exc:
        raise UrlRefused(f"refused: malformed URL ({exc})") from None
    if target.scheme not in ("http", "https"):
        raise UrlRefused(f"refused: only http and https URLs can be fetched, not {target.scheme or 'none'!r}")
    host = target.raw_host
    if not host:
        raise UrlRefused("refused: the URL has no host")
    if policy.name_allowed(target.host):
        return target
    name = normalize_name(host)
    loopback_open = any(policy.address_allowed(ipaddress.ip_address(a)) for a in ("127.0.0.1", "::1"))
    if (name == "localhost" or name.endswith(".localhost")) and not loopback_open:
        # RFC 6761: always loopback, whatever DNS says (and refused even where it does not resolve).
        shown = text_host or host
        raise UrlRefused(f"refused: {shown} is {_REASON} (127.0.0.1 / ::1, a localhost name){_HINT}")
    readings = host_readings(text_host) | host_readings(target.host or "") | {host}
    for reading in sorted(readings):
        ip = parse_ip(reading)
        if ip is not None:
            policy.check(ip, text_host or host, host=host)
    return target


class GuardedResolver(AbstractResolver):
    """aiohttp resolver that refuses a name if *any* of its addresses may not be reached."""

    def __init__(
        self, policy: AddressPolicy | Collection[str] | None = None, inner: AbstractResolver | None = None
    ) -> None:
        self._policy = _as_policy(policy)
        self._inner = inner or DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        infos = await self._inner.resolve(host, port, family)
        for info in infos:
            ip = ipaddress.ip_address(info["host"].split("%", 1)[0])
            self._policy.check(ip, host, resolved=True, host=host)
        return infos

    async def close(self) -> None:
        await self._inner.close()


_HAS_SOCKET_FACTORY = "socket_factory" in inspect.signature(aiohttp.TCPConnector.__init__).parameters


class GuardedConnector(CheckedConnector):
    """A ``TCPConnector`` whose every connection is to an address the policy allows (see the
    module docstring for the two hooks and why). ``refusals`` keeps the messages of refused
    connects, so the caller can tell "refused" from "could not connect"."""

    def __init__(self, policy: AddressPolicy, **kwargs: Any) -> None:
        self.policy = policy
        self.refusals: list[str] = []
        kwargs.setdefault("use_dns_cache", False)  # every connect resolves (and is checked) anew
        kwargs["resolver"] = GuardedResolver(policy, kwargs.get("resolver"))
        if _HAS_SOCKET_FACTORY:
            kwargs["socket_factory"] = self._guarded_socket
        elif not self.hooked:  # neither check can run on this aiohttp: fail closed
            raise UrlRefused("refused: this aiohttp release offers no way to check the addresses")
        super().__init__(**kwargs)

    def _refuse(self, ip: IPAddress, host: str | None) -> str:
        message = f"refused: {host or ip} is or resolves to {_REASON} ({describe(ip)}){_HINT}"
        self.refusals.append(message)
        return message

    def _guarded_socket(self, addr_info: Any) -> socket.socket:
        family, type_, proto, _, sockaddr = addr_info
        host = _CONNECT_HOST.get()
        ip = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if not self.policy.address_allowed(ip, host):
            raise AddressRefusedError(self._refuse(ip, host))
        return socket.socket(family=family, type=type_, proto=proto)

    async def checked_connection(self, req: Any, connect: Connect) -> ResponseHandler:
        if req.proxy:
            raise UrlRefused("refused: web_fetch never goes through a proxy")
        host = req.url.raw_host
        token = _CONNECT_HOST.set(host)
        try:
            proto = await connect()
        finally:
            _CONNECT_HOST.reset(token)
        peer = proto.transport.get_extra_info("peername") if proto.transport is not None else None
        try:
            ip = ipaddress.ip_address(str(peer[0]).split("%", 1)[0]) if peer else None
        except ValueError:
            ip = None
        if ip is None or not self.policy.address_allowed(ip, host):
            if proto.transport is not None:
                proto.transport.abort()
            if ip is None:
                raise aiohttp.ClientConnectionError("could not verify the connected address")
            raise UrlRefused(self._refuse(ip, host))
        return proto
