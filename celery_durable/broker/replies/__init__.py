"""Every Lua script's reply, typed, parsed in one place.

A script answers with a Lua table, which redis-py hands over as a list that
mostly opens with a verdict; what follows depends on the verdict. The store
and the journal never index a reply or compare a verdict string: each
passes it to the parse function named after its script, and gets a small
typed value back (verdicts are ``StrEnum`` members, equal to the strings the
scripts send), or the fence's refusal raised. A reply of a shape its script
never sends is ``StorageCorruptError``, naming the script. Each script's
header comment (``broker/lua/``) says what it returns; the parse functions'
docstrings say the same.

One module per part of the store that runs the scripts:

- ``shape``: what every reply shares (the verdict, the fence's ``Refusal``, the flags);
- ``journal``: the ``Journal``'s scripts (``redis_journal.py``), as the results
  ``broker/journal.py`` types;
- ``run``: a run's record, its passes' lock, its tasks' starts, beats and ends,
  a called task's answer (``run_records.py``, ``run_passes.py``);
- ``control``: finish, resume, halt, cancel, pause, signal (``run_control.py``);
- ``fleet``: the recovery sweep's (``fleet_store.py``);
- ``history``: a page of a run's history (``history_log.py``);
- ``index``: the scripts that keep a namespace's indexes (``run_index.py``);
- ``schedules``: the schedules' (``schedule_store.py``).
"""
