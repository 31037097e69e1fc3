"""Who may reach the web view, and what a browser may do with its pages.

The web view can cancel runs and send signals, so it is an operator's tool,
not a dashboard: bound to loopback it trusts the machine's users (like
``redis-server``'s protected mode); bound anywhere else it refuses to start
without a credential, and then asks for it on every request, static files
included. The response headers forbid inline scripts and framing, so even a
payload that slipped past escaping would not run, and no other site can
put the page's buttons under a user's click.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
from dataclasses import dataclass

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

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


class ExposureError(ValueError):
    """Serving on a non-loopback address without a credential."""


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


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and ``localhost``; any other name counts as exposed.

    Names are not resolved: what a name resolves to can change after the
    check, and ``0.0.0.0`` or ``::`` (every interface) must never pass.
    """
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, credential: Credential | None) -> None:
    """Refuse to serve beyond this machine without a credential."""
    if credential is None and not is_loopback(host):
        raise ExposureError(
            f"refusing to serve on {host} without a credential: pass --auth user:password "
            f"(or set {AUTH_ENV}), or bind to 127.0.0.1"
        )


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
