"""Acknowledged means replicated (``REDIS_WAIT_REPLICAS``): ``WAIT`` after our writes.

Redis replicates asynchronously; ``WAIT n t`` blocks until the writes made so far *on that
connection* are on ``n`` replicas (or ``t`` ms passed) and answers how many have them. The
replication stream is one ordered log, so a write made *after* reading something covers
what was read too: :func:`replicated` writes one small key of this process, then waits.
The reader and the mirror's window read hand on nothing before that said yes, so a
client never sees an event a failover can take back (and the promoted replica is never
"behind" a mirror: no epoch restart, no resync). ``WAIT`` cannot run inside a Lua script,
so :func:`publish_replicated` sends it on the same connection right after the publish
script (docs/deployment.md, "Acknowledged means replicated"). This module imports
nothing from Django.
"""

from __future__ import annotations

import logging
from typing import Any, Final

from sessions.backends.errors import OutcomeUnknownError

__all__ = ["publish_replicated", "replicated"]

logger = logging.getLogger("qwenweb.redis")

#: The time to live of the key :func:`replicated` writes (ms).
_ACK_KEY_TTL_MS: Final = 60_000


async def replicated(client: Any, key: str, replicas: int, timeout_ms: int) -> bool:
    """Whether everything Redis held before this call is on ``replicas`` replicas: one
    write of ``key``, then ``WAIT replicas timeout_ms`` on that connection. Raises the
    client's errors (Redis unreachable)."""
    async with client.pipeline(transaction=False) as pipe:
        pipe.set(key, b"1", px=_ACK_KEY_TTL_MS)
        pipe.execute_command("WAIT", replicas, timeout_ms)
        _, acked = await pipe.execute()
    return int(acked) >= replicas


async def publish_replicated(
    client: Any,
    script: Any,
    keys: list[str],
    args: list[bytes | str | int],
    replicas: int,
    timeout_ms: int,
) -> Any:
    """The publish script, then ``WAIT`` on the same connection; raises
    :class:`OutcomeUnknownError` if fewer than ``replicas`` confirmed in time."""
    async with client.pipeline(transaction=False) as pipe:
        await script(keys=keys, args=args, client=pipe)
        pipe.execute_command("WAIT", replicas, timeout_ms)
        reply, acked = await pipe.execute()
    status = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
    if status == "replay":
        # A replay writes nothing, and WAIT covers only this connection's own writes:
        # one write now (the TTL the script gives the key hash) makes it cover the
        # first publish, whichever connection made it.
        async with client.pipeline(transaction=False) as pipe:
            pipe.pexpire(keys[2], int(args[8]))
            pipe.execute_command("WAIT", replicas, timeout_ms)
            _, acked = await pipe.execute()
    if status in ("ok", "replay") and int(acked) < replicas:
        logger.warning(
            "publish_outcome_unknown key=%s replicas=%d wanted=%d timeout_ms=%d",
            keys[0],
            int(acked),
            replicas,
            timeout_ms,
        )
        raise OutcomeUnknownError(
            f"{int(acked)} of {replicas} replicas confirmed the publish in {timeout_ms} ms"
        )
    return reply
