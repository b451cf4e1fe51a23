"""The ``nchan`` contender: Debian's nginx with the Nchan module, the C-level reference.

- :func:`ensure_installed` installs ``nginx`` and ``libnginx-mod-nchan`` with apt-get when
  they are missing (idempotent; needs root), and stops the system nginx the package's
  post-install may have started (the bench runs its own);
- :func:`write_conf` writes an ``nginx.conf`` into a directory of its own (pid, logs and
  temp paths there, one worker process, 127.0.0.1 only): ``POST /pub/<channel>`` is the
  HTTP publisher, ``GET /stream/<channel>`` the EventSource subscriber (live only:
  ``nchan_subscriber_first_message newest`` on a fresh channel, as the other contenders'
  subscribers without ``Last-Event-ID``), ``GET /replay/<channel>`` the same from the
  oldest buffered message (scenario 6), a buffer of 8,000 messages per channel, and
  ``/bench/ping``;
- ``python -m bench.nchan publish '<spec>'`` publishes bench events through the publisher
  location on one keep-alive connection, requests pipelined (:func:`publish`), and prints
  the same timings as the Python servers' ``/bench/burst``.

Nchan's EventSource ids are ``<unix time>:<sequence>`` strings (:func:`parse_id`); the
load generator checks loss and duplicates on the events' payload sequence numbers, as for
every contender, and that the ids only go up.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import secrets
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

NGINX = "/usr/sbin/nginx"
MODULE = Path("/usr/lib/nginx/modules/ngx_nchan_module.so")
PACKAGES = ("nginx", "libnginx-mod-nchan")
BUFFER_LENGTH = 8000
#: Publish requests in flight on the publisher's connection (``batch`` raises it).
PIPELINE = 64


def ensure_installed(log: Any = print) -> None:
    """Install nginx and the Nchan module from Debian unless both are there (needs root)."""
    if Path(NGINX).exists() and MODULE.exists():
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise RuntimeError(f"nchan: {NGINX} or {MODULE} missing; install {' '.join(PACKAGES)}")
    log(f"nchan: apt-get install {' '.join(PACKAGES)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "--no-install-recommends", *PACKAGES]
    if subprocess.run(install, env=env, capture_output=True, timeout=600).returncode != 0:
        subprocess.run(["apt-get", "update"], env=env, capture_output=True, timeout=600)
        subprocess.run(install, env=env, capture_output=True, timeout=600, check=True)
    # The package's post-install starts the system nginx where it can; the bench needs none.
    subprocess.run([NGINX, "-s", "quit"], capture_output=True, timeout=30)


def parse_id(value: str) -> tuple[int, int]:
    """``"1764600000:12"`` → ``(1764600000, 12)``: an Nchan message id (time, sequence).

    Raises ``ValueError`` for anything else (a multiplexed id such as ``"1:[0],[1]"``
    included: the bench subscribes to one channel per stream)."""
    time_part, sep, seq_part = value.strip().partition(":")
    if not sep or not time_part.isdigit() or not seq_part.isdigit():
        raise ValueError(f"not an nchan message id: {value!r}")
    return int(time_part), int(seq_part)


def new_channel() -> dict[str, Any]:
    """A fresh channel (Nchan creates it on the first subscriber or publish)."""
    name = "bench" + secrets.token_hex(8)
    return {"channel": name, "token": "", "path": f"/stream/{name}"}


def replay_path(channel: dict[str, Any]) -> str:
    return f"/replay/{channel['channel']}"


def publisher_argv(port: int, channel: dict[str, Any], params: dict[str, str]) -> list[str]:
    spec = {"port": port, "path": f"/pub/{channel['channel']}", **params}
    return [sys.executable, "-m", "bench.nchan", "publish", json.dumps(spec)]


def write_conf(
    prefix: Path, port: int, tls: tuple[Path, Path] | None = None, plain_port: int | None = None
) -> Path:
    """Write ``prefix/nginx.conf`` for one nginx on 127.0.0.1:``port``; return its path.

    With ``tls`` the port speaks TLS with HTTP/2 by ALPN, and ``plain_port`` (if given)
    serves the same locations in plain HTTP/1.1 (the bench publishes there)."""
    prefix.mkdir(parents=True, exist_ok=True)
    for sub in ("logs", "tmp"):
        (prefix / sub).mkdir(exist_ok=True)
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    listens = []
    if tls is not None:
        listens.append(f"listen 127.0.0.1:{port} ssl http2;")
        listens.append(f"ssl_certificate {tls[0]}; ssl_certificate_key {tls[1]};")
        if plain_port:
            listens.append(f"listen 127.0.0.1:{plain_port};")
    else:
        listens.append(f"listen 127.0.0.1:{port};")
    conf = f"""
load_module {MODULE};
worker_processes 1;
worker_rlimit_nofile {hard};
pid {prefix}/nginx.pid;
error_log {prefix}/logs/error.log warn;
events {{ worker_connections {max(1024, hard - 64)}; }}
http {{
    access_log off;
    client_body_temp_path {prefix}/tmp/body;
    proxy_temp_path {prefix}/tmp/proxy;
    fastcgi_temp_path {prefix}/tmp/fastcgi;
    uwsgi_temp_path {prefix}/tmp/uwsgi;
    scgi_temp_path {prefix}/tmp/scgi;
    keepalive_requests 10000000;
    keepalive_timeout 300s;
    http2_max_concurrent_streams 1024;
    nchan_max_reserved_memory 512M;
    nchan_message_buffer_length {BUFFER_LENGTH};
    nchan_message_timeout 1h;
    server {{
        {" ".join(listens)}
        location ~ ^/pub/(\\w+)$ {{
            nchan_publisher http;
            nchan_channel_id $1;
        }}
        location ~ ^/stream/(\\w+)$ {{
            nchan_subscriber eventsource;
            nchan_channel_id $1;
            nchan_subscriber_first_message newest;
        }}
        location ~ ^/replay/(\\w+)$ {{
            nchan_subscriber eventsource;
            nchan_channel_id $1;
            nchan_subscriber_first_message oldest;
        }}
        location = /bench/ping {{
            default_type application/json;
            return 200 '{{"ok": true}}';
        }}
    }}
}}
"""
    path = prefix / "nginx.conf"
    path.write_text(conf)
    return path


# -- the publisher ----------------------------------------------------------------------


async def _read_response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").lower().split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    length = next((int(ln.split(":", 1)[1]) for ln in lines if ln.startswith("content-length:")), 0)
    if any(ln.startswith("transfer-encoding:") and "chunked" in ln for ln in lines):
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    elif length:
        await reader.readexactly(length)
    return status


async def publish(spec: dict[str, Any]) -> dict[str, Any]:
    """Publish ``n`` bench events to ``path`` (Nchan's publisher) over one connection.

    Spec: ``port``, ``path``, ``n``, ``size``, ``rate``, ``batch`` (as ``/bench/burst``).
    Requests are pipelined, at most ``max(PIPELINE, batch)`` in flight; an event counts as
    refused unless Nchan answers 201 or 202. Returns ``run_burst``'s timings plus
    ``statuses`` and ``acked_s`` (until the last answer)."""
    import time

    import orjson

    from bench.common import burst_params, run_burst

    n, size, rate, batch = burst_params({k: str(v) for k, v in spec.items()})
    reader, writer = await asyncio.open_connection("127.0.0.1", int(spec["port"]))
    window = asyncio.Semaphore(max(PIPELINE, batch))
    statuses: dict[int, int] = {}
    head = (
        f"POST {spec['path']} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Content-Type: application/json\r\nAccept: text/plain\r\n"
    ).encode()

    async def read_all() -> None:
        for _ in range(n):
            status = await _read_response(reader)
            statuses[status] = statuses.get(status, 0) + 1
            window.release()

    reading = asyncio.create_task(read_all())

    async def send(data: dict[str, Any]) -> bool:
        await window.acquire()
        body = orjson.dumps(data)
        writer.write(b"%sContent-Length: %d\r\n\r\n%s" % (head, len(body), body))
        return True

    started = time.monotonic()
    result = await run_burst(send, n, size, rate, batch)
    await writer.drain()
    await asyncio.wait_for(reading, 120)
    writer.close()
    accepted = statuses.get(201, 0) + statuses.get(202, 0)
    result.update(
        published=accepted,
        refused=n - accepted,
        statuses={str(k): v for k, v in statuses.items()},
        acked_s=time.monotonic() - started,
    )
    return result


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "publish":
        raise SystemExit("usage: python -m bench.nchan publish '<spec as JSON>'")
    print(json.dumps(asyncio.run(publish(json.loads(args[1])))))


if __name__ == "__main__":
    main()
