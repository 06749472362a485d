"""A real PostgreSQL 15 server for the tests (the Debian server binaries of the machine image):
initdb into a temporary folder, start on a free loopback port, stop at the end. As root, the
server runs as the ``postgres`` user (initdb refuses root)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.procs import free_port, wait_for_port


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}")) or [shutil.which(name) or ""]
    if not found[-1]:
        raise RuntimeError(f"PostgreSQL's {name} is not installed (Debian: postgresql)")
    return found[-1]


class Postgres:
    def __init__(self, root: Path | None = None):
        # its own folder under the system temp dir: pytest's tmp folders are private to root, and
        # the server runs as the postgres user when we are root
        self.root = Path(root) if root else Path(tempfile.mkdtemp(prefix="envsched-pg-"))
        os.chmod(self.root, 0o755)
        self.data = self.root / "data"
        self.port = free_port()
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def _run(self, *cmd: str) -> None:
        subprocess.run([*self.as_user, *cmd], check=True, capture_output=True, timeout=60)

    def start(self) -> Postgres:
        self.root.mkdir(parents=True, exist_ok=True)
        if self.as_user:
            shutil.chown(self.root, "postgres", "postgres")
        self._run(_bin("initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")
        self._run(
            _bin("pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.root / "log"),
            "-w",
            "start",
            "-o",
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off",
        )
        wait_for_port(self.port, what="PostgreSQL")
        self._run(_bin("createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "dagster")
        return self

    def env(self) -> dict[str, str]:
        return {
            "DAGSTER_PG_HOST": "127.0.0.1",
            "DAGSTER_PG_PORT": str(self.port),
            "DAGSTER_PG_USER": "postgres",
            "DAGSTER_PG_PASSWORD": "",
            "DAGSTER_PG_DB": "dagster",
        }

    def stop(self) -> None:
        try:
            self._run(_bin("pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop")
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(self.root, ignore_errors=True)
