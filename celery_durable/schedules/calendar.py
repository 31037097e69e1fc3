"""When a schedule ticks: a cron expression or a fixed interval, in a time zone.

Cron expressions are parsed and walked by ``cronsim`` (the cron library of
Healthchecks, a cron monitoring service: typed, kept up, five fields or six
with seconds first, names, ranges, steps and lists as crontab has them). We
never parse cron by hand.

``cronsim`` is handed *naive* local wall-clock times, so its own DST rules
(Debian cron's, which run a skipped job late) never apply: the DST rule is
SPEC §5d's, here, in one place. A local time that does not exist on a day
(spring forward) is skipped that day; one that occurs twice (fall back)
fires once, at its first occurrence.

Every time is an int of milliseconds since the epoch, UTC, as the store
keeps it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from celery_durable.workflows.waits import seconds_of

MAX_CANDIDATES = 2_000
"""Local times looked at for one next tick before giving up: a cron whose
every match falls in DST gaps (none does in practice) cannot spin for ever."""


def zone(name: object) -> ZoneInfo:
    """The IANA time zone ``name``; a ``ValueError`` naming it when there is none."""
    if not isinstance(name, str) or not name or name != name.strip():
        raise ValueError(f"Unknown time zone: {name!r:.80}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ValueError(f"Unknown time zone: {name!r:.80}") from None


def check_cron(expression: object) -> str:
    """A cron expression that parses (five fields, or six with seconds first), normalised to single spaces."""
    if not isinstance(expression, str) or not expression.strip():
        raise ValueError(f"cron must be a cron expression of 5 fields (or 6 with seconds first): {expression!r:.80}")
    text = " ".join(expression.split())
    fields = len(text.split(" "))
    if fields not in (5, 6):
        raise ValueError(f"cron {text!r:.80} has {fields} fields: give 5 (or 6 with seconds first)")
    try:
        it = CronSim(text, datetime(2000, 1, 1))
    except CronSimError as exc:
        raise ValueError(f"cron {text!r:.80} does not parse: {exc}") from None
    try:
        next(it)
    except StopIteration:
        raise ValueError(f"cron {text!r:.80} never fires") from None
    return text


@dataclass(frozen=True, slots=True)
class Calendar:
    """A schedule's ticks: ``cron`` in ``timezone``, or every ``every_ms`` from ``anchor_ms``."""

    cron: str | None
    every_ms: int | None
    timezone: str
    anchor_ms: int
    """For ``every``: the creation time; ticks are anchor + k * every, k >= 1."""

    def next_after(self, after_ms: int) -> int | None:
        """The first tick strictly after ``after_ms``; None when there is none (a cron that stopped matching)."""
        if self.every_ms is not None:
            if after_ms < self.anchor_ms:
                return self.anchor_ms + self.every_ms
            return self.anchor_ms + ((after_ms - self.anchor_ms) // self.every_ms + 1) * self.every_ms
        assert self.cron is not None
        return _next_cron(self.cron, zone(self.timezone), after_ms)

    def upcoming(self, first_ms: int, count: int) -> list[int]:
        """``first_ms`` (a tick) and the ``count - 1`` ticks after it."""
        out = [first_ms]
        while len(out) < count:
            following = self.next_after(out[-1])
            if following is None:
                break
            out.append(following)
        return out[:count]

    def between(self, start_ms: int, end_ms: int, most: int) -> list[int]:
        """The ticks in ``[start_ms, end_ms)``, at most ``most`` + 1 (so a caller sees it went over)."""
        out: list[int] = []
        tick = self.next_after(start_ms - 1)
        while tick is not None and tick < end_ms and len(out) <= most:
            out.append(tick)
            tick = self.next_after(tick)
        return out


def _next_cron(cron: str, tz: ZoneInfo, after_ms: int) -> int | None:
    """Walk the local wall clock from ``after_ms``'s local time: a local time
    that does not exist is skipped, one that exists twice is taken at its
    first occurrence (fold 0), and one at or before ``after_ms`` (the second
    pass of a repeated hour) was fired already. A gap, and the rest of a
    repeated hour ``after_ms`` is in, are jumped over whole, not walked a
    candidate at a time: a cron with seconds has 3,600 candidates in an hour."""
    after = datetime.fromtimestamp(after_ms / 1000, tz=UTC)
    local_after = after.astimezone(tz)
    wall = local_after.replace(tzinfo=None)
    if local_after.fold:
        # The second pass of a repeated hour: its local times fired in the first.
        repeat = local_after.replace(fold=0).utcoffset() - local_after.utcoffset()  # type: ignore[operator]
        wall = _last_before_shift(tz, after - repeat, after)
    # Whole milliseconds only: cronsim walks whole seconds, and a tick is a whole second.
    it = CronSim(cron, wall.replace(microsecond=0))
    for _ in range(MAX_CANDIDATES):
        try:
            local = next(it)
        except StopIteration:
            return None
        first = local.replace(tzinfo=tz, fold=0)
        if first.astimezone(UTC).astimezone(tz).replace(tzinfo=None) != local:
            # Does not exist today (spring forward): go on from the gap's end.
            before, later = sorted(local.replace(tzinfo=tz, fold=fold).astimezone(UTC) for fold in (0, 1))
            it = CronSim(cron, _last_before_shift(tz, before, later))
            continue
        at_ms = int(first.astimezone(UTC).timestamp() * 1000)
        if at_ms > after_ms:
            return at_ms
    return None


def _last_before_shift(tz: ZoneInfo, before: datetime, later: datetime) -> datetime:
    """Where cronsim goes on after ``tz`` shifts to ``later``'s offset, which it
    does after ``before`` (UTC; a DST change, at a whole second): a second
    before the first local time past both sides of the shift, the end of a
    gap (spring forward) or of a repeated hour (fall back)."""
    offset = later.astimezone(tz).utcoffset()
    low, high = int(before.timestamp()), int(later.timestamp())
    while high - low > 1:
        middle = (low + high) // 2
        if datetime.fromtimestamp(middle, tz).utcoffset() == offset:
            high = middle
        else:
            low = middle
    last_before = datetime.fromtimestamp(high - 1, tz).replace(tzinfo=None)
    first_after = datetime.fromtimestamp(high, tz).replace(tzinfo=None)
    return max(last_before, first_after - timedelta(seconds=1))


def to_ms(when: datetime) -> int:
    """An aware datetime (a naive one is read as UTC) in milliseconds."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)


def from_ms(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def every_ms(every: object) -> int:
    """``every`` (seconds, a number >= 1, or a timedelta) in milliseconds."""
    seconds = seconds_of(every)
    if seconds is None:
        raise ValueError(f"every must be a number of seconds >= 1 or a timedelta: {every!r:.80}")
    if not seconds >= 1 or seconds > 10 * 366 * 86400:
        raise ValueError(f"every must be a number of seconds >= 1 (at most ten years): {every!r:.80}")
    return round(seconds * 1000)
