"""A throwaway PostgreSQL server for the tests, from Debian's `postgresql` package (`make test`
installs it; tests that need it are skipped, saying why, where it is missing).

One server per test session, tuned to start fast and never sync (fsync, full-page writes and
synchronous commit off: a crash loses nothing a test needs). It listens on a unix socket in its
own temp directory only, so it never competes for a TCP port. PostgreSQL refuses to run as root,
so under root the server runs as the `postgres` system user (`runuser`). Each test gets a fresh,
empty store from ``new_database()``: a schema of its own, first on the connection's search_path
(CREATE SCHEMA takes a millisecond; CREATE DATABASE copies a template, about a second here).
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

PG_ROOT = Path("/usr/lib/postgresql")
PORT = 5432  # only names the socket file: the server listens on no TCP port
FAST = ("-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200 "
        "-c shared_buffers=64MB -c listen_addresses=''")


def find_bin_dir() -> Path | None:
    """The newest installed server's bin directory (Debian layout), or None."""
    versions = sorted((p for p in PG_ROOT.glob("*/bin") if (p / "initdb").is_file()),
                      key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)
    return versions[-1] if versions else None


class PostgresServer:
    """initdb + pg_ctl on a temp directory; ``stop()`` removes everything."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="aah-pg-"))
        self.data = self.root / "data"
        self.socket_dir = self.root / "socket"
        self._as_postgres = os.geteuid() == 0
        self._names = itertools.count()
        self.socket_dir.mkdir()
        if self._as_postgres:
            shutil.chown(self.root, "postgres")
            shutil.chown(self.socket_dir, "postgres")
        try:
            self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                      "--no-sync", "--locale=C")
            self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"), "-w", "-t", "60",
                      "-o", f"{FAST} -k {self.socket_dir} -p {PORT}", "start")
        except BaseException:
            self.stop()
            raise

    def _run(self, tool: str, *args: str) -> None:
        cmd = [str(self.bin_dir / tool), *args]
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=self.root)
        if done.returncode != 0:
            log = self.root / "server.log"
            raise RuntimeError(f"{tool} failed ({done.returncode}): {done.stderr.strip()[-2000:]}"
                               + (f"\nserver log: {log.read_text()[-2000:]}" if log.is_file() else ""))

    def url(self, schema: str | None = None) -> str:
        url = f"postgresql+psycopg://postgres@/postgres?host={self.socket_dir}&port={PORT}"
        return url if schema is None else f"{url}&options=-csearch_path%3D{schema}"

    def new_database(self) -> str:
        """An empty store of its own (a schema); returns its SQLAlchemy URL."""
        import psycopg

        schema = f"t{next(self._names)}"
        with psycopg.connect(host=str(self.socket_dir), port=PORT, user="postgres", dbname="postgres",
                             autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
        return self.url(schema)

    def stop(self) -> None:
        if (self.data / "postmaster.pid").is_file():
            try:
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
            except (RuntimeError, subprocess.TimeoutExpired):
                pass
        shutil.rmtree(self.root, ignore_errors=True)
