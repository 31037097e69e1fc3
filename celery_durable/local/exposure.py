"""The loopback rule of the two servers the CLI starts: ``web`` and ``flower``.

Both can steer runs (cancel, signal; revoke tasks, shut workers down), so
both trust the machine's users on loopback, like ``redis-server``'s
protected mode, and refuse to start anywhere else without a credential.
The rule lives here, outside ``celery_durable.web``, because ``flower``
must apply it without the web extra installed.
"""

from __future__ import annotations

import ipaddress

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
"""The ``Host`` names a loopback server answers to (SPEC §13), as browsers write them."""


class ExposureError(ValueError):
    """Serving on a non-loopback address without a credential."""


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


def refuse_exposure(host: str, *, has_credential: bool, option: str, env: str) -> None:
    """``ExposureError`` for a server about to listen beyond this machine with no credential.

    ``option`` and ``env`` name how this server is given one, so the one
    line the CLI prints says what to do.
    """
    if not has_credential and not is_loopback(host):
        raise ExposureError(
            f"refusing to serve on {host} without a credential: pass {option} user:password "
            f"(or set {env}), or bind to 127.0.0.1"
        )
