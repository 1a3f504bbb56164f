"""LeaderLease: which of several metadata services on one Redis is the active one.

The active service holds a Redis key (`SET key name NX PX ttl`) and renews it every ttl / 3; a standby
polls for the key and, once it gets it, builds its MetadataService (which restores nodes, leases,
counters and the index from the same Redis) and starts serving. Clients list both addresses
(`ipv4:host:p1,host:p2`: gRPC's pick_first connects to whichever listens), so they fail over when the
active one stops listening. An active service that cannot renew within its ttl stops serving at once
(`serve_while_leader`): the standby may already hold the key. A renewal Redis did not answer is
retried while the key is still ours, so one slow round trip does not hand the service over.

Not fenced: writes the old active's write-behind task had in flight when it lost the key may still
land (at most one write round; the new active's next persist overwrites the index).
"""

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

import redis.asyncio
import redis.exceptions

from radixmesh.cluster.metadata.server import MetadataServer, cancel_and_wait

logger = logging.getLogger(__name__)

_RENEW = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0"
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"


class LeaderLease:
    """The leader key `key` in the Redis at `url`, claimed under `name` for `ttl_s`."""

    def __init__(self, url: str, name: str, *, key: str = "radixmesh:leader", ttl_s: float = 1.0) -> None:
        if not ttl_s > 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
        self.name = name
        self.key = key
        self.ttl_s = ttl_s
        self._redis = redis.asyncio.Redis.from_url(url, socket_timeout=ttl_s / 3,
                                                   socket_connect_timeout=ttl_s / 3)

    async def try_acquire(self) -> bool:
        """True when this name holds the key now (taken, or already ours and renewed)."""
        try:
            if await self._redis.set(self.key, self.name, nx=True, px=int(self.ttl_s * 1000)):
                return True
            return bool(await self.renew())
        except (redis.exceptions.RedisError, OSError) as e:
            logger.info("leader key %s: %s", self.key, e)
            return False

    async def renew(self) -> bool | None:
        """Extend the key's ttl if this name still holds it: True; False when it does not; None when
        Redis did not answer (the key stays ours until the ttl of the last renewal runs out)."""
        try:
            return bool(await self._redis.eval(_RENEW, 1, self.key, self.name, int(self.ttl_s * 1000)))
        except (redis.exceptions.RedisError, OSError) as e:
            logger.warning("leader key %s not renewed: %s", self.key, e)
            return None

    async def release(self) -> None:
        """Give the key up (only if this name holds it) so a standby takes over without waiting."""
        with contextlib.suppress(redis.exceptions.RedisError, OSError):
            await self._redis.eval(_RELEASE, 1, self.key, self.name)

    async def close(self) -> None:
        await self._redis.aclose()

    async def acquire(self, poll_s: float | None = None) -> None:
        """Wait until this name holds the key (a standby's wait)."""
        while not await self.try_acquire():
            await asyncio.sleep(poll_s if poll_s is not None else self.ttl_s / 5)  # polling Redis, by design

    async def keep(self) -> None:
        """Renew every ttl / 3; return when the key is someone else's (or gone), or when no renewal
        can be answered before the last one's ttl runs out (a standby may take it then).

        An unanswered renewal is retried at once: on a loaded host one slow Redis round trip (the
        socket timeout is ttl / 3) must not end a lease that is still held for two thirds of a ttl.
        """
        expires = time.monotonic() + self.ttl_s  # the key was set or renewed just before
        pause = self.ttl_s / 3
        while True:
            await asyncio.sleep(pause)  # the renewal period, not a synchronisation
            asked = time.monotonic()
            renewed = await self.renew()
            if renewed is False:
                return
            if renewed:
                expires, pause = asked + self.ttl_s, self.ttl_s / 3
            elif time.monotonic() + self.ttl_s / 3 > expires:
                return  # a retry could be answered only after the key may have passed on
            else:
                pause = self.ttl_s / 20  # Redis refused at once (restarting): retry soon, not in a spin


async def serve_while_leader(
    lease: LeaderLease, start: Callable[[], Awaitable[MetadataServer]], stop: asyncio.Event
) -> bool:
    """Wait for leadership, `start` a server (build the service only now: it restores from Redis),
    serve until `stop` is set (then release the key: True) or the lease is lost (False). `stop`
    set while waiting returns True without serving. Cancelled, it stops the server and releases
    the key like a stop, then re-raises. The server is stopped either way."""
    if not await _first_of(lease.acquire(), stop):
        await lease.release()  # in case the key came with `stop`: the standby need not wait out its ttl
        return True
    logger.info("%s holds %s: serving", lease.name, lease.key)
    # Renewing starts before the server does: building the service restores the index from Redis
    # and can outlast the ttl on a loaded host, and an unrenewed key would pass to the standby.
    keeper = asyncio.create_task(lease.keep(), name="leader-lease")
    stopping = asyncio.create_task(stop.wait())
    server: MetadataServer | None = None
    try:
        server = await start()
        await asyncio.wait({keeper, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        lost = keeper.done() and not keeper.cancelled()  # keep() returns only when a renewal failed
        await cancel_and_wait(keeper, stopping)
        if lost:
            logger.error("%s lost %s: stopping at once", lease.name, lease.key)
        if server is not None:
            await server.stop(0 if lost else 5.0)
        if not lost:
            await lease.release()
    return not lost


async def _first_of(acquiring: Awaitable[None], stop: asyncio.Event) -> bool:
    """True once `acquiring` is done, False once `stop` is set (the first of the two wins)."""
    waiting = asyncio.ensure_future(acquiring)
    stopping = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({waiting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await cancel_and_wait(waiting, stopping)
    return waiting.done() and not waiting.cancelled() and not stop.is_set()
