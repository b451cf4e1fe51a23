"""The Lua scripts of the Redis backend, and what their replies mean.

Each script runs atomically in Redis, so what it checks and what it writes are one step
whatever process calls it (:mod:`sessions.backends.redis_store` registers and calls
them). Keys (``P`` = the key prefix, ``S`` = a session id; the ``{S}`` hash tag keeps a
session's keys in one Redis Cluster slot):

``P:s:{S}:meta``   hash: ``epoch``, ``last``, ``first``, ``closed``, ``bytes`` (see
                   ``redis_store``).
``P:s:{S}:stream`` the shared ring (a Redis Stream); entries ``e`` (the envelope) and
                   ``t`` (epoch ms when appended).
``P:s:{S}:idem``   hash: idempotency key -> ``"<id> <epoch> <digest>"``, the first result
                   of each key (docs/protocol.md, "Idempotent publish").
``P:s:{S}:idemt``  sorted set: idempotency key -> the time of its first request (epoch
                   ms); trimmed in the publish script to ``IDEMPOTENCY_MAX_KEYS`` members
                   (oldest first) and to ``IDEMPOTENCY_TTL_S``. Both idempotency keys
                   expire ``IDEMPOTENCY_TTL_S`` after the last publish that carried a key.

Idempotency inside the publish script: a key already in ``idem`` (and younger than the
time to live) answers its first result and writes nothing; a new key is stored with the
id the same script assigns. So a publish whose answer was lost (a timeout, a dropped
connection) and is retried with its key never publishes twice, on any process.

Trimming inside the publish script (docs/protocol.md, "Ring limits"): after the append
the oldest entries leave while the stream holds more than its count, more than
``bytes`` allows (``len(e)`` plus ``FRAME_OVERHEAD_BYTES`` per entry, the measure of the
local rings) or entries older than the age limit, at most ``TRIM_BATCH`` a call (the
newest entry always stays). ``bytes`` in the meta hash is kept by the script. A stream
written before byte counts existed (no ``bytes`` field, entries without ``t``, during a
rolling upgrade) starts from Redis's own estimate of it (``MEMORY USAGE``), is never
trimmed by age for its old entries, and is exact again once it is down to one entry.

This module imports nothing from Django.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from sessions.backends.idempotency import Remembered

__all__ = [
    "CLOSED_KEYS_TTL_MS",
    "ENSURE_LUA",
    "IDEMPOTENCY_EXPIRE_BATCH",
    "PUBLISH_LUA",
    "RESTART_LUA",
    "TRIM_BATCH",
    "PublishOutcome",
    "parse_remembered",
]

#: How long a closed session's stream stays in Redis at least (ms): long enough for every
#: process's reader to deliver ``session_closed``; ``CLOSED_HISTORY_S`` when longer (its
#: history stays readable that long). Its small meta hash stays (a tombstone), so the
#: session can never be reopened by a publish even if writing the row failed.
CLOSED_KEYS_TTL_MS: Final = 3_600_000

#: At most this many idempotency keys are dropped by one publish (expired or over the
#: count): bounded work per call, and within Lua's argument limit for ``unpack``.
IDEMPOTENCY_EXPIRE_BATCH: Final = 1000

#: At most this many old entries are trimmed by one publish (bounded work per call).
TRIM_BATCH: Final = 1000

# KEYS: meta, stream, idem hash, idem times. ARGV: 1 envelope JSON without id, 2 ring size,
# 3 "1" to close after it, 4 the highest id the caller knows was issued, 5 the keys' time
# to live after a close (ms), 6 idempotency key ("" for none), 7 its request digest,
# 8 now (epoch ms), 9 the keys' time to live (ms), 10 at most this many keys, 11 the batch,
# 12 the byte limit, 13 the age limit (ms, 0: none), 14 bytes counted per entry beyond
# its envelope, 15 at most this many entries trimmed, 16 the session's sharded notify
# channel, told the new id ("" for none: on one Redis the readers block in XREAD).
# -> {"ok", epoch, id} | {"replay", "<id> <epoch> <digest>"} | {"closed", epoch}
#    | {"noepoch"} | {"stale", epoch}
PUBLISH_LUA: Final = """
local key = ARGV[6]
local now = tonumber(ARGV[8])
local batch = tonumber(ARGV[11])
if key ~= '' then
  local expired = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now - tonumber(ARGV[9]),
                             'LIMIT', 0, batch)
  if #expired > 0 then
    redis.call('HDEL', KEYS[3], unpack(expired))
    redis.call('ZREM', KEYS[4], unpack(expired))
  end
  local first = redis.call('HGET', KEYS[3], key)
  if first then return {'replay', first} end
end
local epoch = redis.call('HGET', KEYS[1], 'epoch')
if not epoch then return {'noepoch'} end
if redis.call('HEXISTS', KEYS[1], 'closed') == 1 then return {'closed', epoch} end
local last = tonumber(redis.call('HGET', KEYS[1], 'last'))
if not last or last < tonumber(ARGV[4]) then return {'stale', epoch} end
local id = redis.call('HINCRBY', KEYS[1], 'last', 1)
local overhead = tonumber(ARGV[14])
local held = redis.call('HGET', KEYS[1], 'bytes')
if held then
  held = tonumber(held)
elseif redis.call('XLEN', KEYS[2]) == 0 then
  held = 0
else  -- written before byte counts: start from Redis's estimate of the stream
  local ok, usage = pcall(redis.call, 'MEMORY', 'USAGE', KEYS[2])
  held = (ok and tonumber(usage)) or 0
end
redis.call('XADD', KEYS[2], id .. '-0', 'e', ARGV[1], 't', ARGV[8])
if ARGV[16] and ARGV[16] ~= '' then redis.call('SPUBLISH', ARGV[16], id) end
held = held + string.len(ARGV[1]) + overhead
local count = redis.call('XLEN', KEYS[2])
local maxlen, maxbytes, maxage = tonumber(ARGV[2]), tonumber(ARGV[12]), tonumber(ARGV[13])
local trimmed, cut = 0, nil
local after = '-'
while count > 1 and trimmed < tonumber(ARGV[15]) do
  local oldest = redis.call('XRANGE', KEYS[2], after, '+', 'COUNT', 1)[1]
  if not oldest then break end
  local body, stamp = nil, nil
  for i = 1, #oldest[2], 2 do
    if oldest[2][i] == 'e' then body = oldest[2][i + 1] end
    if oldest[2][i] == 't' then stamp = tonumber(oldest[2][i + 1]) end
  end
  local aged = maxage > 0 and stamp ~= nil and stamp < now - maxage
  if not (count > maxlen or held > maxbytes or aged) then break end
  held = held - string.len(body or '') - overhead
  cut = oldest[1]
  after = '(' .. cut
  count = count - 1
  trimmed = trimmed + 1
end
if cut then
  local ms = string.match(cut, '^(%d+)')
  redis.call('XTRIM', KEYS[2], 'MINID', (tonumber(ms) + 1) .. '-0')
end
if count <= 1 then held = string.len(ARGV[1]) + overhead end  -- exact again
if held < 0 then held = 0 end
redis.call('HSET', KEYS[1], 'bytes', held)
if key ~= '' then
  redis.call('HSET', KEYS[3], key, id .. ' ' .. epoch .. ' ' .. ARGV[7])
  redis.call('ZADD', KEYS[4], now, key)
  local extra = math.min(redis.call('ZCARD', KEYS[4]) - tonumber(ARGV[10]), batch)
  if extra > 0 then
    local oldest = redis.call('ZRANGE', KEYS[4], 0, extra - 1)
    redis.call('HDEL', KEYS[3], unpack(oldest))
    redis.call('ZREMRANGEBYRANK', KEYS[4], 0, extra - 1)
  end
  redis.call('PEXPIRE', KEYS[3], ARGV[9])
  redis.call('PEXPIRE', KEYS[4], ARGV[9])
end
if ARGV[3] == '1' then
  redis.call('HSET', KEYS[1], 'closed', id)
  redis.call('PEXPIRE', KEYS[2], ARGV[5])
end
return {'ok', epoch, id}
"""

# KEYS: meta, stream. ARGV: the stale epoch, a new epoch, base id, the highest id the
# caller knows was issued. Replaces the session's data only if it still has the stale epoch
# (or none) and its last id is still below that (checked here, atomically: an id issued
# since the caller looked is not Redis going back in time). The idempotency keys stay:
# a retry still answers its first result, in the epoch it was published in.
# -> {epoch, replaced (0/1)}
RESTART_LUA: Final = """
local epoch = redis.call('HGET', KEYS[1], 'epoch')
if epoch and epoch ~= ARGV[1] then return {epoch, 0} end
local last = tonumber(redis.call('HGET', KEYS[1], 'last'))
if epoch and last and last >= tonumber(ARGV[4]) then return {epoch, 0} end
redis.call('DEL', KEYS[1], KEYS[2])
local base = tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'epoch', ARGV[2], 'last', base, 'first', base + 1)
return {ARGV[2], 1}
"""

# KEYS: meta, stream. ARGV: new epoch, base id (ids continue at base + 1).
# -> {epoch, created (0/1)}
ENSURE_LUA: Final = """
local epoch = redis.call('HGET', KEYS[1], 'epoch')
if epoch then return {epoch, 0} end
redis.call('DEL', KEYS[2])
local base = tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'epoch', ARGV[1], 'last', base, 'first', base + 1)
return {ARGV[1], 1}
"""


@dataclass(frozen=True, slots=True)
class PublishOutcome:
    """What the publish script did: ``status`` is ``ok``, ``replay`` (``remembered`` is
    the key's first result), ``closed``, ``stale`` or ``noepoch``."""

    status: str
    epoch: str | None = None
    event_id: int | None = None
    remembered: Remembered | None = None


def parse_remembered(raw: str) -> Remembered | None:
    """Return the ``"<id> <epoch> <digest>"`` value of the ``idem`` hash, or None if it is
    not one (then the key counts as unknown). Never raises."""
    parts = raw.split(" ")
    if len(parts) != 3 or not parts[0].isdigit():
        return None
    return Remembered(int(parts[0]), parts[1], parts[2])
