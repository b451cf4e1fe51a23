"""The contenders' server processes, and their CPU, RSS and threads over the process tree.

Contenders (each on 127.0.0.1, a free port, its own SQLite database on tmpfs):

- ``qwenweb-serve``: ``python -m qwenweb.serve`` (the production entry point, whatever it
  serves with in the checkout: granian once issue 12's serve work is in, daphne before);
- ``qwenweb-granian``: ``python -m granian --interface asgi --loop uvloop`` on
  ``qwenweb.asgi:application``, backlog and backpressure raised for long-lived streams;
- ``qwenweb-daphne``: daphne with flow control (``python -m qwenweb.serve --server daphne``
  when the entry point has ``--server``, else ``python -m qwenweb.serve``);
- ``qwenweb-uvicorn``: ``python -m uvicorn qwenweb.asgi:application --lifespan off``;
- ``eventstream``: django-eventstream 5 under plain daphne, with ``DjangoModelStorage``;
- ``floor``: ``bench/floor_server.py``, a raw asyncio server writing pre-serialized frames;
- ``nchan``: Debian's nginx with ``libnginx-mod-nchan`` (:mod:`bench.nchan`);
- ``qwenweb-serve@baseline`` (``--baseline-tree``): ``python -m qwenweb.serve`` from another
  checkout.

A server's CPU, RSS and threads are summed over its whole process tree (granian's and
nginx's workers included), read from ``/proc``.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from bench import nchan

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
FLOOR = "floor"
QW_SERVE = "qwenweb-serve"
QW_GRANIAN = "qwenweb-granian"
QW_DAPHNE = "qwenweb-daphne"
QW_UVICORN = "qwenweb-uvicorn"
EVENTSTREAM = "eventstream"
NCHAN = "nchan"
QW_BASELINE = "qwenweb-serve@baseline"
CONTENDERS = (QW_SERVE, QW_GRANIAN, QW_DAPHNE, QW_UVICORN, EVENTSTREAM, NCHAN, FLOOR)
#: Contenders that answer HTTP/2 (by ALPN over TLS) when given a certificate.
HTTP2_CONTENDERS = (QW_SERVE, QW_GRANIAN, NCHAN)
TICKS = os.sysconf("SC_CLK_TCK")
#: Granian's limits for long-lived streams: its default backpressure (backlog / workers)
#: stops answering new connections after about a thousand open streams (issue 12).
GRANIAN_LIMITS = ("--backlog", "4096", "--backpressure", "20000")
#: Per-session subscriber limit under the bench: scenario 5 holds 10,000 on one session.
MAX_SUBSCRIBERS = 20_000


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def raise_nofile() -> None:
    """Raise this process's soft ``RLIMIT_NOFILE`` to its hard limit (children inherit it)."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# -- process trees ----------------------------------------------------------------------


@dataclass(frozen=True)
class ProcStat:
    """The fields of ``/proc/<pid>/stat`` the bench reads (times in clock ticks)."""

    pid: int
    ppid: int
    ticks: int  # utime + stime + cutime + cstime: its own and its reaped children's CPU
    threads: int


def parse_stat(text: str) -> ProcStat:
    """Parse one ``/proc/<pid>/stat`` line (the command may hold spaces and parentheses)."""
    head, _, rest = text.rpartition(")")
    fields = rest.split()
    pid = int(head.split("(", 1)[0])
    # fields[0] is the state (stat field 3); utime..cstime are stat fields 14..17.
    ticks = sum(int(value) for value in fields[11:15])
    return ProcStat(pid, int(fields[1]), ticks, int(fields[17]))


def descendants(root: int, parents: dict[int, int]) -> list[int]:
    """``root`` and every process below it, given ``{pid: ppid}`` (breadth first)."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    tree, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        if pid in tree:
            continue
        tree.append(pid)
        todo.extend(sorted(children.get(pid, ())))
    return tree


def _all_stats() -> dict[int, ProcStat]:
    stats = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = parse_stat(Path(entry.path, "stat").read_text())
            except (OSError, ValueError, IndexError):
                continue  # gone meanwhile
            stats[stat.pid] = stat
    return stats


def tree_stats(root: int) -> list[ProcStat]:
    """The ``/proc`` stats of ``root``'s process tree (empty when ``root`` is gone)."""
    stats = _all_stats()
    if root not in stats:
        return []
    tree = descendants(root, {pid: stat.ppid for pid, stat in stats.items()})
    return [stats[pid] for pid in tree]


def rss_kib_of(pids: Iterable[int]) -> int:
    """Sum of ``VmRSS`` (KiB) over ``pids`` (a page shared by two processes counts twice)."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
                    break
        except OSError:
            continue
    return total


# -- servers ----------------------------------------------------------------------------


def serve_takes(option: str, tree: Path = REPO) -> bool:
    """Whether this checkout's ``python -m qwenweb.serve`` takes ``option`` (``--server``,
    ``--certfile``: issue 12's granian entry point), read from its source."""
    package = tree / "qwenweb"
    for path in (package / "serve.py", *sorted(package.glob("serve/*.py"))):
        if path.is_file() and f'"{option}"' in path.read_text():
            return True
    return False


@dataclass
class Server:
    """One contender's server process."""

    name: str
    workdir: Path
    template_db: Path
    port: int = 0
    process: subprocess.Popen[bytes] | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    #: A database shared with other processes of one deployment (else a copy per start).
    shared_db: Path | None = None
    #: The checkout the server runs from (``--baseline-tree`` for the baseline contender).
    tree: Path = REPO
    #: ``(certificate, key)``: serve HTTPS (HTTP/2 by ALPN where the server can).
    tls: tuple[Path, Path] | None = None
    #: nchan over TLS also listens in plain HTTP here, for its publisher.
    plain_port: int = 0
    #: ``collectstatic``'s output for this checkout (:func:`collect_static`), if it needs one.
    static_root: Path | None = None

    @property
    def label(self) -> str:
        return self.name + (" (TLS)" if self.tls else "")

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    @property
    def control_port(self) -> int:
        """Where the bench calls go (``/bench/*``, nchan's publisher)."""
        return self.plain_port or self.port

    def argv(self) -> list[str]:
        port = str(self.port)
        cert, key = (str(p) for p in self.tls) if self.tls else ("", "")
        if self.name in (QW_SERVE, QW_BASELINE):
            argv = [PY, "-m", "qwenweb.serve", "-b", "127.0.0.1", "-p", port]
            return argv + (["--certfile", cert, "--keyfile", key] if self.tls else [])
        if self.name == QW_DAPHNE:
            daphne = ["--server", "daphne"] if serve_takes("--server", self.tree) else []
            return [PY, "-m", "qwenweb.serve", *daphne, "-b", "127.0.0.1", "-p", port]
        if self.name == QW_GRANIAN:
            return [
                PY, "-m", "granian", "--interface", "asgi", "--loop", "uvloop",
                "--host", "127.0.0.1", "--port", port, *GRANIAN_LIMITS,
                "--log-level", "warning", "--no-ws",
                *(["--ssl-certificate", cert, "--ssl-keyfile", key] if self.tls else []),
                "qwenweb.asgi:application",
            ]  # fmt: skip
        if self.name == QW_UVICORN:
            return [
                PY, "-m", "uvicorn", "qwenweb.asgi:application", "--host", "127.0.0.1",
                "--port", port, "--lifespan", "off", "--log-level", "warning",
                "--no-access-log",
            ]  # fmt: skip
        if self.name == EVENTSTREAM:
            return [
                PY, "-m", "daphne", "-b", "127.0.0.1", "-p", port,
                "bench.eventstream_asgi:application",
            ]  # fmt: skip
        if self.name == NCHAN:
            prefix = self.workdir / f"nchan-{self.port}"
            conf = nchan.write_conf(prefix, self.port, self.tls, self.plain_port or None)
            return [nchan.NGINX, "-p", str(prefix), "-c", str(conf), "-g", "daemon off;"]
        return [PY, "-m", "bench.floor_server", port]

    def env(self, db: Path) -> dict[str, str]:
        env = os.environ.copy()
        env.update(
            DATABASE_URL=f"sqlite:///{db}",
            DJANGO_DEBUG="0",
            DJANGO_SECRET_KEY="bench-only-secret-key-not-for-production",
            DJANGO_ALLOWED_HOSTS="127.0.0.1,localhost",
            QWENWEB_LOG_LEVEL="ERROR",
            QWENWEB_ACCESS_LOG_LEVEL="WARNING",
            # Scenario 5 opens up to 10,000 streams on one session; the default limit is 64.
            QWENWEB_MAX_SUBSCRIBERS=str(MAX_SUBSCRIBERS),
            PYTHONUNBUFFERED="1",
        )
        if self.static_root is not None:
            env["DJANGO_STATIC_ROOT"] = str(self.static_root)
        env.update(self.extra_env)
        env["DJANGO_SETTINGS_MODULE"] = (
            "bench.eventstream_settings" if self.name == EVENTSTREAM else
            "bench.qwenweb_bench_settings"
        )  # fmt: skip
        return env

    def start(self) -> Server:
        self.stop()
        self.port = free_port()
        if self.tls and self.name == NCHAN:
            self.plain_port = free_port()
        db = self.shared_db or self.workdir / f"{self.name}-{self.port}.sqlite3"
        if self.shared_db is None and self.name != NCHAN:
            shutil.copy(self.template_db, db)
        log = (self.workdir / f"{self.name}.log").open("ab")
        self.process = subprocess.Popen(
            self.argv(),
            cwd=self.tree,
            env=self.env(db),
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=raise_nofile,  # 10,000 streams need more than the usual 1,024 fds
        )
        log.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.label} exited: {self.log_tail()}")
            try:
                self.call("/bench/ping", method="GET", timeout_s=5)
                return self
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"{self.label} did not start in 30 s: {self.log_tail()}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                for stat in reversed(tree_stats(self.process.pid)):
                    with contextlib.suppress(OSError):
                        os.kill(stat.pid, 9)
                self.process.wait(timeout=10)
        self.process = None

    def log_tail(self) -> str:
        path = self.workdir / f"{self.name}.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

    def call(self, target: str, method: str = "POST", timeout_s: float = 120) -> Any:
        """A bench call (``/bench/...``) on this server's control port."""
        tls = bool(self.tls) and not self.plain_port
        return post_json(self.control_port, target, method, timeout_s, tls=tls)

    # -- resources over the process tree ----------------------------------------------

    def _tree(self) -> list[ProcStat]:
        assert self.process is not None
        return tree_stats(self.process.pid)

    def rss_kib(self) -> int:
        return rss_kib_of(stat.pid for stat in self._tree())

    def threads(self) -> int:
        return sum(stat.threads for stat in self._tree())

    def cpu_s(self) -> float:
        return sum(stat.ticks for stat in self._tree()) / TICKS

    def processes(self) -> int:
        return len(self._tree())

    # -- the bench protocol ------------------------------------------------------------

    def new_channel(self, **query: str) -> dict[str, Any]:
        if self.name == NCHAN:
            return nchan.new_channel()
        suffix = "?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else ""
        return self.call("/bench/session" + suffix)

    def stream_headers(self, channel: dict[str, Any]) -> list[list[str]]:
        token = channel.get("token")
        return [["Authorization", f"Bearer {token}"]] if token else []

    def cursor(self, channel: dict[str, Any], last_id: int) -> str | None:
        """The ``Last-Event-ID`` that replays everything after event ``last_id``; None for
        nchan, which replays its buffer from a path of its own (:func:`replay_path`)."""
        if self.name == NCHAN:
            return None
        return f"{channel['channel']}:{last_id}" if self.name == EVENTSTREAM else str(last_id)

    def replay_path(self, channel: dict[str, Any]) -> str:
        return nchan.replay_path(channel) if self.name == NCHAN else str(channel["path"])

    def trigger(self, channel: dict[str, Any], query: str) -> dict[str, Any]:
        """The load generator's spec keys that publish the events of ``query``
        (``n=&size=&rate=&batch=``) once every subscriber is connected."""
        if self.name == NCHAN:
            params = dict(parse_qsl(query))
            return {"trigger_argv": nchan.publisher_argv(self.control_port, channel, params)}
        return {
            "trigger": f"/bench/burst?channel={channel['channel']}&{query}",
            "trigger_port": self.control_port,
            "trigger_tls": bool(self.tls) and not self.plain_port,
        }

    def publish_now(self, channel: dict[str, Any], query: str, timeout_s: float = 120) -> Any:
        """Publish the events of ``query`` now (no subscriber waits for them)."""
        if self.name == NCHAN:
            params = dict(parse_qsl(query))
            argv = nchan.publisher_argv(self.control_port, channel, params)
            done = subprocess.run(argv, cwd=REPO, capture_output=True, timeout=timeout_s)
            return json.loads(done.stdout.decode().strip().splitlines()[-1])
        return self.call(f"/bench/burst?channel={channel['channel']}&{query}", timeout_s=timeout_s)


def post_json(
    port: int, target: str, method: str = "POST", timeout_s: float = 120, tls: bool = False
) -> Any:
    scheme = "https" if tls else "http"
    request = urllib.request.Request(
        f"{scheme}://127.0.0.1:{port}{target}", method=method, data=b""
    )
    context = ssl._create_unverified_context() if tls else None  # the bench's own certificate
    with urllib.request.urlopen(request, timeout=timeout_s, context=context) as response:
        return json.loads(response.read())


def migrate_template(workdir: Path, tree: Path = REPO, name: str = "template") -> Path:
    """A database migrated by ``tree``'s own migrations (each checkout gets its schema)."""
    db = workdir / f"{name}.sqlite3"
    env = os.environ.copy()
    env.update(DATABASE_URL=f"sqlite:///{db}", DJANGO_SETTINGS_MODULE="qwenweb.settings")
    subprocess.run([PY, "manage.py", "migrate", "-v0"], cwd=tree, env=env, check=True, timeout=300)
    return db


def collect_static(workdir: Path, tree: Path = REPO, name: str = "static") -> Path | None:
    """Run ``collectstatic`` into ``workdir/name`` for a checkout whose production entry
    point serves ``STATIC_ROOT`` (it refuses to start with DEBUG off before that); return
    that directory, or None for a checkout without ``DJANGO_STATIC_ROOT``."""
    if "DJANGO_STATIC_ROOT" not in (tree / "qwenweb" / "settings.py").read_text():
        return None
    root = workdir / name
    env = os.environ.copy()
    env.update(
        DJANGO_SETTINGS_MODULE="qwenweb.settings",
        DJANGO_DEBUG="0",
        DJANGO_SECRET_KEY="bench-only-secret-key-not-for-production",
        DJANGO_STATIC_ROOT=str(root),
    )
    argv = [PY, "manage.py", "collectstatic", "--noinput", "-v0"]
    subprocess.run(argv, cwd=tree, env=env, check=True, timeout=300)
    return root


def make_certificate(workdir: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (``trustme``), as PEM files in ``workdir``."""
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_path, key_path = workdir / "bench-cert.pem", workdir / "bench-key.pem"
    cert.cert_chain_pems[0].write_to_path(str(cert_path))
    for extra in cert.cert_chain_pems[1:]:
        extra.write_to_path(str(cert_path), append=True)
    cert.private_key_pem.write_to_path(str(key_path))  # PKCS#8, as granian requires
    return cert_path, key_path
