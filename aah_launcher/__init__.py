"""Launching AAH Studio: the `aah` command's `serve` (a process supervisor for the API and the dashboard).

Kept outside aah_core on purpose: the engine knows nothing of servers, ports or databases.
"""
