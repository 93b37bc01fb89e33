"""Which addresses the gate may be made to call: engine URLs only to hosts or networks the
operator allows, and never to link-local or cloud-metadata addresses.

A `url` engine makes the gate poll that address for minutes and send it thousands of requests,
so a URL a caller names is a request forgery waiting to happen (the metadata service at
169.254.169.254, the gate's own database, a neighbour's admin port). The rules:

- syntax (every spec, the CLI's too): http or https, a host, an optional port and path, no
  user info, no query, no fragment;
- always refused, whoever asks: link-local (169.254.0.0/16, fe80::/10), the metadata addresses
  of the clouds and their names, unspecified, multicast and broadcast addresses; a host name is
  resolved and every address it resolves to is checked;
- allowed only when on the operator's list (`GATE_ENGINE_URL_ALLOW`): an exact host name, a
  `.suffix` for a domain's subdomains, an IP address, or a network in CIDR form; the command
  line also allows loopback, the service does not (the service's loopback is its own host).
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable, Iterable, Sequence
from urllib.parse import urlsplit

from gate.core.errors import UrlRefused as UrlRefused  # it lived here: re-exported

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str], Sequence[str]]

METADATA_HOSTS = frozenset(
    {
        "metadata",
        "metadata.google.internal",
        "metadata.goog",
        "metadata.azure.internal",
        "instance-data",
        "instance-data.ec2.internal",
    }
)
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",  # AWS, GCP, Azure, OpenStack, DigitalOcean, Oracle
        "169.254.170.2",  # AWS ECS task metadata
        "fd00:ec2::254",  # AWS IMDS over IPv6
        "100.100.100.200",  # Alibaba Cloud
        "192.0.0.192",  # Oracle Cloud (classic)
        "168.63.129.16",  # Azure WireServer
    )
)
LOOPBACK = ("127.0.0.0/8", "::1/128", "localhost")
_PATH_RE = re.compile(r"^(/[A-Za-z0-9._~-]+)*/?$")
_HOST_RE = re.compile(r"^(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9_-]{0,61}[A-Za-z0-9])?\.?)+$")


def check_syntax(url: str) -> str:
    """The URL without a trailing slash, or UrlRefused naming what is wrong with it."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise UrlRefused(f"not a URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UrlRefused("must be an http(s) URL such as http://127.0.0.1:8000")
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise UrlRefused("must not carry user info (user:password@): send no credentials")
    if parts.query or url.rstrip("/").endswith("?") or "?" in url:
        raise UrlRefused("must not have a query: the gate chooses the paths it calls")
    if parts.fragment or "#" in url:
        raise UrlRefused("must not have a fragment")
    if not _PATH_RE.match(parts.path) or ".." in parts.path.split("/"):
        raise UrlRefused("its path may hold only letters, digits, '.', '_', '~', '-' and '/'")
    if port == 0:
        raise UrlRefused("port 0 is not a port")
    if any(ch.isspace() or ord(ch) < 0x20 for ch in url):
        raise UrlRefused("must not contain spaces or control characters")
    host = parts.hostname
    if "%" in host:  # an IPv6 zone id: equal-comparison with the refused addresses would miss
        raise UrlRefused("must not carry an IPv6 zone id (%...)")
    if _literal(host) is None and not _HOST_RE.match(host):
        raise UrlRefused(
            "its host may hold only letters, digits, '-', '_' and '.' (IDNA-encode other names)"
        )
    return url.rstrip("/")


def _literal(host: str) -> Address | None:
    try:
        addr = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.scope_id is not None:
        addr = ipaddress.IPv6Address(str(addr).split("%", 1)[0])  # resolvers may add a zone
    return addr


_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))
_TRANSLATED = ipaddress.ip_network("::ffff:0:0:0/96")  # SIIT's IPv4-translated form


def _embedded_v4(addr: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries (mapped, 6to4, NAT64, the old compatible form)."""
    if addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    if addr.sixtofour is not None:
        return addr.sixtofour
    if any(addr in net for net in _NAT64) or addr in _TRANSLATED:
        return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    if addr.teredo is not None:
        return addr.teredo[1]
    if int(addr) >> 32 == 0 and int(addr) > 1:  # ::a.b.c.d (deprecated, still routable)
        return ipaddress.IPv4Address(int(addr))
    return None


def forbidden_address(addr: Address) -> str | None:
    """Why an address is never called, or None."""
    if isinstance(addr, ipaddress.IPv6Address) and (v4 := _embedded_v4(addr)) is not None:
        why = forbidden_address(v4)
        if why is not None:
            return f"{addr} carries {why}"
    if addr in METADATA_ADDRESSES:
        return f"{addr} is a cloud metadata address"
    if addr.is_link_local:
        return f"{addr} is link-local"
    if addr.is_unspecified:
        return f"{addr} is unspecified"
    if addr.is_multicast:
        return f"{addr} is multicast"
    if isinstance(addr, ipaddress.IPv4Address) and addr == ipaddress.IPv4Address("255.255.255.255"):
        return f"{addr} is broadcast"
    return None


def system_resolver(host: str) -> list[str]:
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise UrlRefused(f"host {host!r} does not resolve: {exc}") from None
    return sorted({str(info[4][0]) for info in infos})


def _addresses(host: str, resolve: Resolver) -> list[Address]:
    lit = _literal(host)
    if lit is not None:
        return [lit]
    out = []
    for a in resolve(host):
        lit = _literal(a.split("%", 1)[0])
        if lit is not None:
            out.append(lit)
    if not out:
        raise UrlRefused(f"host {host!r} resolves to no address")
    return out


def check_always(url: str, resolve: Resolver | None = system_resolver) -> None:
    """The rules no setting lifts: raise UrlRefused for a metadata or link-local target.
    Without `resolve`, only names and address literals are checked (a spec's validation does
    no I/O; the engine checks the resolved addresses again when it attaches)."""
    host = (urlsplit(url).hostname or "").lower().rstrip(".")
    if host in METADATA_HOSTS:
        raise UrlRefused(f"host {host!r} is a cloud metadata service: never called")
    if resolve is None and _literal(host) is None:
        return
    for addr in _addresses(host, resolve or system_resolver):
        why = forbidden_address(addr)
        if why is not None:
            raise UrlRefused(f"host {host!r}: {why}; never called")


def _entry_allows(entry: str, host: str, port: int | None, addrs: Iterable[Address]) -> bool:
    entry = entry.strip().lower()
    if not entry:
        return False
    if "/" in entry:  # a network: every address the host has must be inside it
        try:
            net = ipaddress.ip_network(entry, strict=False)
        except ValueError:
            return False
        addrs = list(addrs)
        return bool(addrs) and all(a in net for a in addrs)
    want_port: int | None = None
    if entry.count(":") == 1 and not entry.startswith("["):  # host:port
        entry, _, p = entry.partition(":")
        if not p.isdigit():
            return False
        want_port = int(p)
    if want_port is not None and port != want_port:
        return False
    entry = entry.strip("[]").rstrip(".")
    if entry.startswith("."):
        return host.endswith(entry) and len(host) > len(entry)
    lit = _literal(entry)
    if lit is not None:
        return _literal(host) == lit
    return host == entry


def check_allowed(
    url: str,
    allow: Sequence[str],
    *,
    loopback: bool,
    setting: str = "GATE_ENGINE_URL_ALLOW",
    resolve: Resolver = system_resolver,
) -> str:
    """The cleaned URL if it may be called; UrlRefused naming the setting otherwise."""
    clean = check_syntax(url)
    check_always(clean, resolve=None)  # names and literals first: no I/O for a refusal
    parts = urlsplit(clean)
    host = (parts.hostname or "").lower().rstrip(".")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    entries = [*allow, *(LOOPBACK if loopback else ())]
    named = [e for e in entries if "/" not in e]
    networks = [e for e in entries if "/" in e]
    # The allow-list decides before any name is resolved: with no entry that could admit it, a
    # caller's name is never looked up (no DNS oracle, no blind lookups of the caller's own
    # domains). A name is resolved only once an entry admits it, or when the operator allows a
    # network (its addresses decide); then every address it has must be callable.
    if any(_entry_allows(e, host, port, ()) for e in named):
        check_always(clean, resolve)
        return clean
    if networks:
        addrs = _addresses(host, resolve)
        if any(_entry_allows(e, host, port, addrs) for e in networks):
            check_always(clean, resolve)
            return clean
    raise UrlRefused(
        f"host {host!r} is not on the operator's allow-list ({setting}"
        + (f": {', '.join(allow)}" if allow else ", empty")
        + ")"
    )
