"""Who may reach the web view, and what a browser may do with its pages.

The web view can cancel runs and send signals, so it is an operator's tool,
not a dashboard: bound to loopback it trusts the machine's users (like
``redis-server``'s protected mode); bound anywhere else it refuses to start
without a credential, and then asks for it on every request, static files
included. It answers only the ``Host`` names it serves, so a page a browser
loaded from another site cannot reach it by rebinding that site's name to
this machine's address. The response headers forbid inline scripts and
framing, so even a payload that slipped past escaping would not run, and no
other site can put the page's buttons under a user's click.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from celery_durable.local.exposure import LOOPBACK_NAMES, is_loopback, refuse_exposure

AUTH_ENV = "CELERY_DURABLE_WEB_AUTH"
REALM = "celery-durable"

SECURITY_HEADERS = {
    # Scripts and styles come from /static only: no inline script can run.
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
}


@dataclass(frozen=True, slots=True)
class Credential:
    """The one user and password of ``--auth`` / ``CELERY_DURABLE_WEB_AUTH``."""

    user: str
    password: str

    @classmethod
    def parse(cls, text: str) -> Credential:
        user, sep, password = text.partition(":")
        if not (user and sep and password):
            raise ValueError("the credential must look like 'user:password', both non-empty")
        return cls(user, password)

    def admits(self, authorization: str | None) -> bool:
        """Whether an ``Authorization`` header carries this credential.

        Both halves are compared in constant time, and both always are, so
        the response time says nothing about which half (or how much of it)
        was right.
        """
        if not authorization or authorization[:6].lower() != "basic ":
            return False
        try:
            decoded = base64.b64decode(authorization[6:].strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return False
        user, _, password = decoded.partition(":")
        user_ok = hmac.compare_digest(user.encode(), self.user.encode())
        password_ok = hmac.compare_digest(password.encode(), self.password.encode())
        return user_ok & password_ok


def check_exposure(host: str, credential: Credential | None) -> None:
    """Refuse to serve beyond this machine without a credential."""
    refuse_exposure(host, has_credential=credential is not None, option="--auth", env=AUTH_ENV)


# Written here, not taken from a library: Starlette's TrustedHostMiddleware
# (which does the check, in app.py) compares names as text, so the names it
# is given must already be in the form a Host header has; and nothing in
# Starlette or uvicorn derives them from the address a server is bound to.
HOST_NAME = re.compile(r"[a-z0-9_]([a-z0-9_.-]*[a-z0-9_])?\.?")


def host_name(text: str, *, what: str = "an allowed host") -> str:
    """``text`` as a ``Host`` header names it: lowercase, an IPv6 address in brackets.

    A port is refused rather than ignored (every port of a name is served,
    so one written there would suggest a restriction that does not exist),
    and so is ``*``: a pattern that admits any name is the hole this closes.
    """
    name = text.strip().lower()
    bare = name[1:-1] if name.startswith("[") and name.endswith("]") else name
    try:
        address = ipaddress.ip_address(bare)
    except ValueError:
        if not HOST_NAME.fullmatch(name):
            raise ValueError(f"{what} must be a host name or an address, without a port or '*': got {text!r}") from None
        return name
    return f"[{address.compressed}]" if address.version == 6 else address.compressed


def served_hosts(bound: str, allowed: Iterable[str] = ()) -> list[str]:
    """The ``Host`` names a server bound to ``bound`` answers.

    The loopback names when bound to loopback, else the bound name, as SPEC
    §13 has it (bound to every interface too: there a browser on the
    machine itself needs ``localhost`` allowed); and each ``allowed`` name
    either way (a reverse proxy on the same machine that keeps the public
    name in ``Host`` needs one).
    """
    own = host_name(bound, what="--host")
    names = [own]
    if is_loopback(bound):
        names += LOOPBACK_NAMES
    names += (host_name(name, what="--allowed-host") for name in allowed)
    return list(dict.fromkeys(names))


def _netloc(text: str, default_port: str) -> str:
    return text.lower().removesuffix(default_port)


def names_this_server(headers: Headers) -> bool:
    """Whether the request's ``Origin`` names the host and port its ``Host`` does.

    A browser sets ``Origin`` on every cross-site POST and no page can
    change it, so one naming this server proves the request came from its
    own pages. ``Host`` itself was checked against the served names first.
    Written by hand: Starlette's CORSMiddleware only decides which origins
    may read answers and refuses no request, and the ASGI CSRF packages
    (asgi-csrf, starlette-csrf) want a cookie beside every token and have
    no ``Origin`` alternative, which the JSON API accepts.
    """
    origin, host = headers.get("origin"), headers.get("host")
    if not origin or not host:
        return False
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or not parts.netloc or "@" in parts.netloc:
        return False
    if parts.path or parts.query or parts.fragment:
        return False  # an Origin is scheme://host[:port] and nothing else
    default_port = ":80" if parts.scheme == "http" else ":443"
    return _netloc(parts.netloc, default_port) == _netloc(host, default_port)


class BasicAuth:
    """HTTP Basic on every request; ``lifespan`` messages pass untouched."""

    def __init__(self, app: ASGIApp, credential: Credential) -> None:
        self.app = app
        self.credential = credential

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        if self.credential.admits(Headers(scope=scope).get("authorization")):
            await self.app(scope, receive, send)
            return
        body = b"Authentication required.\n"
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"www-authenticate", f'Basic realm="{REALM}", charset="UTF-8"'.encode()),
                    (b"content-type", b"text/plain; charset=utf-8"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


class SecurityHeaders:
    """Adds ``SECURITY_HEADERS`` to every HTTP response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers.setdefault(name, value)
            await send(message)

        await self.app(scope, receive, send_with_headers)
