"""Schedules (SPEC §5d): workflows started on a calendar by whichever worker is alive.

- ``calendar``: when a schedule ticks (cron via ``cronsim``, or every N seconds), DST included;
- ``spec``: a schedule's specification checked, encoded and decoded; ``ScheduleInfo``;
- ``firing``: the sweep's fire, a trigger's and a backfill's, each tick's run started once;
- ``methods``: the client's schedule methods.
"""
