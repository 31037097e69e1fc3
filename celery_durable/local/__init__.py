"""Processes run on this machine for the quickstart, the CLI and tests: a
private ``redis-server``, the embedded default when none is configured, local
worker subprocesses, and the loopback rule of the servers the CLI starts.
None of it is part of a deployed worker."""
