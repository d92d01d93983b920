"""One parse of a worker URL: the one the router routes by (WHATWG URL rules), checked against Python's.

smg (Rust, the `url` crate) parses a worker URL as browsers do (the WHATWG URL Standard): tabs and
newlines are removed, a `\\` is a `/` in http(s) URLs and so ends the authority, the host is
percent-decoded and an all-numeric host is an IPv4 address in any of its old spellings. Python's
`urllib.parse.urlsplit`, which the rest of kvgate reads URLs with, does none of that: the authority
runs to the first `/`, `?` or `#`, and the host starts after its last `@`. A URL the two read as
different hosts is routed to one worker while kvgate reads another (seen with the real smg 1.13.0:
`http://A\\@B` is listed as given, health-checked and routed to A, and urllib names B).

`disagreement(url)` answers whether a URL is one kvgate can gate: None when both parsers name the
same scheme, host, port and path and the URL has nothing either reads loosely; otherwise a sentence
naming what differs. It is our own small reading of the Standard's host and authority steps for the
two special schemes kvgate reads (http, https), written to detect disagreement, not to be a URL
library: what it does not model (IDNA, opaque paths, other schemes) is refused, never guessed.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import unquote_to_bytes, urlsplit

_DEFAULT_PORT = {"http": 80, "https": 443}
#: what the Standard strips from both ends (C0 controls and space) and removes anywhere (tab, LF, CR)
_STRIP = "".join(map(chr, range(0x21)))
_REMOVED = "\t\n\r"
#: forbidden domain code points (the Standard's "forbidden host code point" plus C0, % and DEL)
_FORBIDDEN_HOST = set(" #/:<>?@[\\]^|%\x7f") | set(map(chr, range(0x20)))
#: a path kvgate and the router spell alike: RFC 3986 pchar, no backslash, no quotes or spaces
_SAFE_PATH = re.compile(r"(/[A-Za-z0-9._~!$&'()*+,;=:@-]*)*")


class NotParsed(ValueError):
    """The Standard fails this URL (the router would refuse it) or it uses what this reader does not model."""


@dataclass(frozen=True)
class WebParts:
    """A URL as the WHATWG Standard reads it: scheme, userinfo (None: none), serialized host, port
    (the default made explicit), path (its dot segments resolved), query and fragment (None: none)."""

    scheme: str
    userinfo: str | None
    host: str
    port: int
    path: str
    query: str | None
    fragment: str | None


def _ipv4_number(part: str) -> int:
    """One part of the Standard's IPv4 parser: decimal, 0x hex or 0-led octal (an empty 0x is 0)."""
    if part[:2] in ("0x", "0X"):
        digits, base = part[2:] or "0", 16
    elif len(part) > 1 and part[0] == "0":
        digits, base = part[1:], 8
    else:
        digits, base = part, 10
    if not (digits.isascii() and digits.isalnum()):
        raise NotParsed(f"{part!r} is not an IPv4 number")
    try:
        return int(digits, base)
    except ValueError:
        raise NotParsed(f"{part!r} is not an IPv4 number") from None


def _ends_in_number(host: str) -> bool:
    parts = host.split(".")
    if parts[-1] == "" and len(parts) > 1:
        parts.pop()
    last = parts[-1]
    if last and all(c in "0123456789" for c in last):
        return True
    return bool(re.fullmatch(r"0[xX][0-9A-Fa-f]*", last))


def _ipv4(host: str) -> str:
    """The Standard's IPv4 parser: 1-4 parts, each decimal, 0x hex or 0 octal; the last fills the rest."""
    parts = host.split(".")
    if parts[-1] == "" and len(parts) > 1:
        parts.pop()
    if len(parts) > 4 or "" in parts:
        raise NotParsed(f"{host!r} is not an IPv4 address")
    numbers = [_ipv4_number(p) for p in parts]
    if any(n > 255 for n in numbers[:-1]) or numbers[-1] >= 256 ** (5 - len(numbers)):
        raise NotParsed(f"{host!r} is out of IPv4 range")
    value = numbers[-1]
    for i, n in enumerate(numbers[:-1]):
        value += n << (8 * (3 - i))
    return str(ipaddress.IPv4Address(value))


def _host(raw: str) -> str:
    """The Standard's host parser for a special scheme, as the serialized host."""
    if raw.startswith("["):
        if not raw.endswith("]"):
            raise NotParsed(f"unclosed IPv6 literal {raw!r}")
        try:
            return f"[{ipaddress.IPv6Address(raw[1:-1]).compressed}]"
        except ValueError:
            raise NotParsed(f"{raw!r} is not an IPv6 address") from None
    try:
        domain = unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        raise NotParsed(f"the host {raw!r} percent-decodes to bytes that are not UTF-8") from None
    if not domain.isascii():
        raise NotParsed(f"the host {raw!r} is not ASCII (the router would IDNA-encode it)")
    domain = domain.lower()
    if domain == "" or any(c in _FORBIDDEN_HOST for c in domain):
        raise NotParsed(f"the host {raw!r} is empty or has a forbidden code point")
    return _ipv4(domain) if _ends_in_number(domain) else domain


def _path(raw: str) -> str:
    """The path with `\\` as `/` and its `.`/`..` segments resolved (`%2e` counts as a dot)."""
    out: list[str] = []
    segments = raw.replace("\\", "/").split("/")[1:] if raw else [""]
    for i, seg in enumerate(segments):
        last = i == len(segments) - 1
        low = seg.lower()
        if low in ("..", ".%2e", "%2e.", "%2e%2e"):
            if out:
                out.pop()
            if last:
                out.append("")
        elif low in (".", "%2e"):
            if last:
                out.append("")
        else:
            out.append(seg)
    return "/" + "/".join(out)


def whatwg(url: str) -> WebParts:
    """`url` as the WHATWG URL Standard parses an http(s) URL with no base; NotParsed where it fails."""
    s = url.strip(_STRIP)
    for c in _REMOVED:
        s = s.replace(c, "")
    m = re.match(r"([A-Za-z][A-Za-z0-9+.-]*):", s)
    if m is None or m.group(1).lower() not in _DEFAULT_PORT:
        raise NotParsed("not an http(s) URL")
    scheme, rest = m.group(1).lower(), s[m.end() :].lstrip("/\\")
    end = min((i for i in (rest.find(c) for c in "/\\?#") if i >= 0), default=len(rest))
    authority, tail = rest[:end], rest[end:]
    at = authority.rfind("@")
    userinfo, hostport = (authority[:at], authority[at + 1 :]) if at >= 0 else (None, authority)
    bracket, split = False, len(hostport)
    for i, c in enumerate(hostport):
        bracket = (bracket or c == "[") and c != "]"
        if c == ":" and not bracket:
            split = i
            break
    host, port_text = hostport[:split], hostport[split + 1 :]
    if host == "":
        raise NotParsed("no host")
    if port_text and not (port_text.isascii() and port_text.isdigit()):
        raise NotParsed(f"port {port_text!r} is not a number")
    port = int(port_text) if port_text else _DEFAULT_PORT[scheme]
    if port > 65535:
        raise NotParsed(f"port {port} is out of range")
    fragment = query = None
    tail, hash_, frag = tail.partition("#")
    if hash_:
        fragment = frag
    tail, mark, q = tail.partition("?")
    if mark:
        query = q
    return WebParts(scheme, userinfo, _host(host), port, _path(tail), query, fragment)


def _python_view(url: str) -> tuple[str, str | None, int | None, str]:
    parts = urlsplit(url)
    host = parts.hostname
    if host is not None and ":" in host:
        try:
            host = f"[{ipaddress.IPv6Address(host).compressed}]"
        except ValueError:
            pass
    port = parts.port  # ValueError when urllib cannot read it
    return parts.scheme, host, _DEFAULT_PORT.get(parts.scheme) if port is None else port, parts.path or "/"


def _hosts(url: str) -> str:
    """`; the router reaches H:P, Python's parser H:P` as far as each can read it."""
    try:
        web = whatwg(url)
        router = f"{web.host}:{web.port}"
    except NotParsed:
        router = "nothing (it refuses the URL)"
    try:
        _, host, port, _ = _python_view(url)
        python = f"{host}:{port}"
    except ValueError:
        python = "nothing (it cannot read the port)"
    return f"; the router's parser reaches {router}, Python's {python}"


#: URLs up to this long are remembered (a real worker's URL is far shorter): the cache stays under about 30 MiB
#: however a router fills its listing, interval after interval
_CACHED_URL_CHARS = 512


def disagreement(url: str) -> str | None:
    """None when the router (WHATWG rules) and kvgate (urllib) read `url` as one scheme, host, port and
    path with nothing either reads loosely; else why not, naming what each parser reaches.

    Remembered for short URLs: a pure function of the text, and a fleet's listing is read twice per
    check (the second look) and once per interval by the watch; parsing each URL both ways was a third
    of a 1,024-worker listing's cost (bench/fleet_read.py)."""
    return _remembered(url) if len(url) <= _CACHED_URL_CHARS else _disagreement(url)


def _disagreement(url: str) -> str | None:
    why = _why(url)
    return None if why is None else why + _hosts(url)


_remembered = functools.lru_cache(maxsize=1 << 14)(_disagreement)


def _why(url: str) -> str | None:
    removed = sorted({repr(c)[1:-1] for c in url if c in _REMOVED})
    if removed or url != url.strip(_STRIP):
        what = ", ".join(removed) or "leading or trailing control characters or spaces"
        return f"it contains {what}, which the router's parser (WHATWG) silently drops"
    if "\\" in url:
        return "it contains a backslash, which the router's parser (WHATWG) reads as '/' (ending the host there)"
    try:
        web = whatwg(url)
    except NotParsed as exc:
        return f"the router's parser (WHATWG) does not read it as an http(s) URL: {exc}"
    try:
        scheme, host, port, path = _python_view(url)
    except ValueError as exc:
        return f"Python's parser cannot read it: {exc}"
    if web.userinfo is not None or "@" in urlsplit(url).netloc:
        return "it carries userinfo (text before an '@'), which the parsers split differently and kvgate never sends"
    if web.query is not None or web.fragment is not None:
        return "it carries a query or fragment: the paths kvgate and the router append would land inside it"
    seen = {
        "scheme": (web.scheme, scheme),
        "host": (web.host, host),
        "port": (web.port, port),
        "path": (web.path, path),
    }
    differ = [f"{k} {a!r} (router) vs {b!r} (Python)" for k, (a, b) in seen.items() if a != b]
    if differ:
        return "the router's parser (WHATWG) and Python's read it differently: " + "; ".join(differ)
    if not _SAFE_PATH.fullmatch(path) or "%" in path:
        return f"its path {path!r} has characters the two parsers encode differently"
    return None


__all__ = ["NotParsed", "WebParts", "disagreement", "whatwg"]
