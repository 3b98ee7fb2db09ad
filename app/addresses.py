"""Which addresses the server's own outbound requests may reach (docs/security.md, "Outbound
requests"): one rule for every URL an operator or a request names — webhook endpoints today,
MCP server URLs with them.

A target is *private* when its host is ``localhost`` (or ends in ``.localhost``, RFC 6761), or
when any address it resolves to is not globally routable:

=================  ============================================================================
reason             addresses
=================  ============================================================================
``loopback``       127.0.0.0/8, ::1
``link-local``     169.254.0.0/16 (cloud metadata services: 169.254.169.254), fe80::/10
``unspecified``    0.0.0.0, :: (connecting to them reaches this machine)
``private``        10/8, 172.16/12, 192.168/16, fc00::/7, and the other ranges Python's
                   ``ipaddress`` calls private (benchmarking, documentation, 0/8, 240/4, …)
``shared``         100.64.0.0/10 (carrier-grade NAT)
``multicast``      224.0.0.0/4, ff00::/8
``reserved``       anything else not globally routable
=================  ============================================================================

An IPv6 address that carries an IPv4 one (IPv4-mapped ``::ffff:a.b.c.d``, NAT64
``64:ff9b::/96``, 6to4 ``2002::/16``) is judged by the IPv4 address it carries. A name is
resolved (every address it has, A and AAAA), and one private address makes it private: a name
that answers public and private addresses at once is not let through.

Only the operator's explicit yes lets a private target through (``--allow-private`` for a
webhook). A target that was checked is connected to at the address that was checked
(:func:`pinned`), so a name that resolves differently a moment later (DNS rebinding) cannot
redirect the request.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Awaitable[Sequence[IPAddress]]]

_SHARED = ipaddress.ip_network("100.64.0.0/10")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


class PrivateTarget(Exception):
    """A URL whose host is (or resolves to) an address that is not globally routable, or a
    host that cannot be resolved at all."""

    def __init__(self, message: str, host: str, reason: str) -> None:
        super().__init__(message)
        self.host = host
        self.reason = reason


def address_reason(ip: IPAddress) -> str | None:
    """Why ``ip`` is not a public address (see the module's table), or ``None``."""
    if isinstance(ip, ipaddress.IPv6Address):
        carried = ip.ipv4_mapped or ip.sixtofour
        if carried is None and ip in _NAT64:
            carried = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if carried is not None:
            return address_reason(carried)
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link-local"
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_multicast:
        return "multicast"
    if isinstance(ip, ipaddress.IPv4Address) and ip in _SHARED:
        return "shared"
    if ip.is_private:
        return "private"
    if not ip.is_global:
        return "reserved"
    return None


def _literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


async def resolve(host: str, port: int) -> list[IPAddress]:
    """Every address ``host`` resolves to (TCP), in the resolver's order, each once."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    found: list[IPAddress] = []
    for *_, sockaddr in infos:
        ip = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])  # a zone id is dropped
        if ip not in found:
            found.append(ip)
    return found


@dataclass(frozen=True)
class Target:
    """A URL that passed the check: its host and port, and the addresses it was checked at
    (empty when private targets were allowed and nothing was resolved)."""

    url: str
    host: str
    port: int
    addresses: tuple[IPAddress, ...]


def _host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r} is not an http(s) URL")
    return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)


async def check_url(url: str, *, allow_private: bool, resolver: Resolver = resolve) -> Target:
    """``url``'s target, checked: :class:`PrivateTarget` unless every address of its host is
    public (or ``allow_private``). ``ValueError`` for a URL that is not http(s)."""
    host, port = _host_port(url)
    if allow_private:
        return Target(url, host, port, ())
    name = host.lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        raise PrivateTarget(
            f"{host!r} is this machine (loopback): a private target", host, "loopback"
        )
    literal = _literal(host)
    if literal is not None:
        addresses: list[IPAddress] = [literal]
    else:
        try:
            addresses = list(await resolver(host, port))
        except OSError as exc:
            raise PrivateTarget(
                f"{host!r} could not be resolved ({exc}), so its address cannot be checked",
                host,
                "unresolved",
            ) from None
        if not addresses:
            raise PrivateTarget(f"{host!r} resolves to no address", host, "unresolved")
    for ip in addresses:
        reason = address_reason(ip)
        if reason is not None:
            shown = host if literal is not None else f"{host!r} resolves to {ip}, which"
            raise PrivateTarget(f"{shown} is a {reason} address: a private target", host, reason)
    return Target(url, host, port, tuple(addresses))


def pinned(target: Target) -> tuple[str, dict[str, str], dict[str, str]]:
    """How to send a request to a checked ``target`` at the address it was checked at: the
    URL with that address as its host, the ``Host`` header, and (for https) httpx's
    ``sni_hostname`` extension, so TLS still checks the certificate against the name."""
    if not target.addresses:
        return target.url, {}, {}
    parts = urlsplit(target.url)
    ip = target.addresses[0]
    address = f"[{ip}]" if isinstance(ip, ipaddress.IPv6Address) else str(ip)
    netloc = address if parts.port is None else f"{address}:{parts.port}"
    url = parts._replace(netloc=netloc).geturl()
    host = parts.netloc.rsplit("@", 1)[-1]  # host[:port], without credentials
    extensions = {"sni_hostname": target.host} if parts.scheme == "https" else {}
    return url, {"host": host}, extensions


__all__ = [
    "IPAddress",
    "PrivateTarget",
    "Resolver",
    "Target",
    "address_reason",
    "check_url",
    "pinned",
    "resolve",
]
