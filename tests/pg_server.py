"""A real PostgreSQL server for tests: a throw-away cluster in a temporary directory.

Debian's ``postgresql`` package provides the binaries (``scripts/test.sh`` installs it as root). The
server refuses to run as root, so when the tests run as root the cluster belongs to the package's
``postgres`` user (or ``nobody``); it listens on 127.0.0.1 on a free port and on a socket in its own
directory, with ``trust`` authentication for that loopback only. :func:`find_postgres` says why not
when it cannot run, and the fixtures skip with that reason.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


def _bin_dir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_as() -> pwd.struct_passwd | None:
    """Who runs the server: ourselves unless we are root (initdb refuses root)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    return None


def find_postgres() -> tuple[Path | None, str]:
    """The directory with ``initdb``/``pg_ctl``, or None and why not."""
    bindir = _bin_dir()
    if bindir is None:
        return (
            None,
            "PostgreSQL server binaries not found (Debian package `postgresql`; scripts/test.sh installs it as root)",
        )
    if os.geteuid() == 0 and _run_as() is None:
        return None, "running as root and no unprivileged user (postgres, nobody) to run PostgreSQL"
    return bindir, ""


@dataclass
class PgServer:
    """One running cluster; :attr:`url` is a libpq URL to its ``postgres`` database."""

    bindir: Path
    root: Path
    port: int
    user: pwd.struct_passwd | None
    proc: subprocess.Popen[bytes] | None = None
    settings: tuple[str, ...] = ()
    """More ``postgresql.conf`` lines (a bench loads ``pg_stat_statements``)."""

    @property
    def data(self) -> Path:
        return self.root / "data"

    def url(self, db: str = "postgres") -> str:
        return f"postgresql://chital@127.0.0.1:{self.port}/{db}"

    def _cmd(self, *args: str) -> list[str]:
        return list(args)

    def _preexec(self) -> None:
        if self.user is not None:
            os.setgid(self.user.pw_gid)
            os.setgroups([])
            os.setuid(self.user.pw_uid)

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C.UTF-8"
        if self.user is not None:
            env["HOME"] = str(self.root)
        return env

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if self.user is not None:
            os.chown(self.root, self.user.pw_uid, self.user.pw_gid)
        subprocess.run(
            [str(self.bindir / "initdb"), "-D", str(self.data), "-U", "chital", "-A", "trust", "-E", "UTF8",
             "--no-sync"],
            check=True, capture_output=True, preexec_fn=self._preexec, env=self._env(), cwd=self.root,
        )  # fmt: skip
        conf = [
            "listen_addresses = '127.0.0.1'",
            f"port = {self.port}",
            f"unix_socket_directories = '{self.root}'",
            "fsync = off",
            "synchronous_commit = off",
            "full_page_writes = off",
            "max_connections = 200",
            "shared_buffers = 32MB",
            "log_min_messages = warning",
            *self.settings,
        ]
        with open(self.data / "postgresql.conf", "a") as f:
            f.write("\n".join(conf) + "\n")
        log = open(self.root / "server.log", "wb")
        self.proc = subprocess.Popen(
            [str(self.bindir / "postgres"), "-D", str(self.data)],
            stdout=log, stderr=subprocess.STDOUT, preexec_fn=self._preexec, env=self._env(), cwd=self.root,
        )  # fmt: skip
        log.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"postgres exited: {(self.root / 'server.log').read_text()[-2000:]}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.2):
                ready = subprocess.run(
                    [str(self.bindir / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)],
                    capture_output=True,
                )
                if ready.returncode == 0:
                    return
            time.sleep(0.1)
        raise RuntimeError("postgres did not become ready within 30 s")

    def create_db(self, name: str) -> str:
        """A fresh database; returns its URL."""
        subprocess.run(
            [str(self.bindir / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "chital", name],
            check=True, capture_output=True, env=self._env(),
        )  # fmt: skip
        return self.url(name)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: "smart" shutdown; fast enough with no clients
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def postgres_server(settings: tuple[str, ...] = ()) -> Iterator[PgServer]:
    bindir, why = find_postgres()
    if bindir is None:
        raise RuntimeError(why)
    root = Path(tempfile.mkdtemp(prefix="chital-pg-"))
    os.chmod(root, 0o755)
    server = PgServer(bindir, root / "cluster", _free_port(), _run_as(), settings=settings)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
