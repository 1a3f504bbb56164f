"""IndexFeed: the ordered stream of index changes that WatchIndex sends to the routers' replicas.

The service records every change it applies (a node joined or left, its load changed, a batch of its
events or a snapshot applied) here, in the order it applied them; each record gets the next sequence
number. A watcher subscribes and takes a snapshot in the same event-loop step (no await between), so
the first update it is queued after its snapshot is exactly snapshot.seq + 1.

Each subscription queues at most `max_backlog` updates. A watcher that falls that far behind is not
sent the rest: its queue is dropped and it is marked `behind`, and its stream sends a fresh snapshot
instead (what a watcher that sees a sequence gap asks for too), so a slow router costs the service
bounded memory and never slows the others.
"""

import asyncio
import uuid
from collections import deque

from radixmesh.proto.ids import NodeId
from radixmesh.proto.metadata.messages import IndexUpdate, NodeBlocks, RoutedWork, WatchedNode


class FeedClosed(Exception):
    """The service is stopping: the watch stream ends (its watcher reconnects elsewhere or later)."""


class Subscription:
    """One watcher's queue of updates. Use from the service's event loop."""

    def __init__(self, max_backlog: int) -> None:
        self._max_backlog = max_backlog
        self._queue: deque[IndexUpdate] = deque()
        self._ready = asyncio.Event()
        self.behind = False
        """Updates were dropped: the watcher needs a fresh snapshot (then call `restart`)."""
        self.closed = False

    def push(self, update: IndexUpdate) -> None:
        if self.behind:
            return
        if len(self._queue) >= self._max_backlog:
            self._queue.clear()
            self.behind = True
        else:
            self._queue.append(update)
        self._ready.set()

    def close(self) -> None:
        self.closed = True
        self._ready.set()

    def restart(self) -> None:
        """The watcher is being sent a snapshot that covers everything queued: start afresh."""
        self._queue.clear()
        self.behind = False

    async def next_batch(self) -> list[IndexUpdate] | None:
        """Every update queued (waiting for one), or None when the watcher fell behind.
        Raises FeedClosed once the feed is closed."""
        while not self._queue and not self.behind and not self.closed:
            self._ready.clear()
            await self._ready.wait()
        if self.closed:
            raise FeedClosed
        return self.take()

    def take(self) -> list[IndexUpdate] | None:
        """Every update queued now (maybe none), or None when the watcher fell behind."""
        if self.behind:
            return None
        batch = list(self._queue)
        self._queue.clear()
        return batch


class IndexFeed:
    """Numbers the service's changes and fans them out to the subscriptions."""

    def __init__(self, max_backlog: int = 65536) -> None:
        if max_backlog < 1:
            raise ValueError(f"max_backlog must be >= 1, got {max_backlog}")
        self.max_backlog = max_backlog
        self.seq = 0
        """Sequence number of the last change recorded."""
        self.incarnation = uuid.uuid4().hex
        """Names this feed: a watcher that reconnects to another process sees another name."""
        self._subs: set[Subscription] = set()
        self._closed = False

    def record(
        self,
        *,
        left: tuple[NodeId, ...] = (),
        nodes: tuple[WatchedNode, ...] = (),
        blocks: tuple[NodeBlocks, ...] = (),
        work: tuple[RoutedWork, ...] = (),
    ) -> None:
        self.seq += 1
        if not self._subs:
            return  # nobody watches: build no message
        update = IndexUpdate(self.seq, False, left, nodes, blocks, self.incarnation, work)
        for sub in self._subs:
            sub.push(update)

    def subscribe(self) -> Subscription:
        sub = Subscription(self.max_backlog)
        self._subs.add(sub)
        if self._closed:
            sub.close()
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        self._subs.discard(sub)

    def close(self) -> None:
        """End every watch stream (the server is stopping: open streams would hold up its grace)."""
        self._closed = True
        for sub in self._subs:
            sub.close()

    @property
    def watchers(self) -> int:
        return len(self._subs)
