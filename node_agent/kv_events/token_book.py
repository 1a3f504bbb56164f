"""TokenBook: the tokens behind the block hashes an agent caches, which vLLM's events carry.

The cache events (proto/events.py) name blocks by hash alone; the prefix cache never sees tokens. The
agent does, when it serves: it opens a ticket with the prompt's hashes (the ones it computed for the
engine, not hashed again) and extends it with every token generated, so each full block it may cache
has an entry: its tokens, its parent, and for a chain's first block the cache salt (the tenant).

    ticket tokens:  [ prompt ............ | output ...... ]
    entries:        [ h0 | h1 | ... | h(p-1) | hp | ... ]   hp.. hashed here, chained from h(p-1)

Entries stay while the events say a tier holds the block (a block demoted to the host tier keeps its
entry), and up to `max_unheld` more, the most recently used: the blocks of requests whose events
have not been published yet, and blocks that may be stored again. The oldest unheld go first.

Not thread-safe; the publisher's event loop owns it.
"""

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from radixmesh.proto.block_hash import BlockHash, hash_blocks, tenant_salt
from radixmesh.proto.events import Tier


@dataclass(frozen=True, slots=True)
class BookEntry:
    tokens: tuple[int, ...]
    """The block's tokens (block_size of them)."""
    parent: BlockHash | None
    """The hash before it in its chain; None: the chain's first block."""
    cache_salt: str | None
    """The tenant that salted the chain, on its first block only (None elsewhere and unsalted)."""


@dataclass(slots=True)
class Ticket:
    """One request being served: its tokens so far and the hashes of their full blocks."""

    serial: int
    tokens: list[int]
    hashes: list[BlockHash]
    tenant: str | None


@dataclass(slots=True)
class TokenBook:
    block_size: int
    hash_key: bytes = b""
    max_unheld: int = 1 << 16
    _entries: dict[BlockHash, BookEntry] = field(default_factory=dict)
    _held: dict[BlockHash, set[Tier]] = field(default_factory=dict)
    _unheld: OrderedDict[BlockHash, None] = field(default_factory=OrderedDict)
    _open: set[int] = field(default_factory=set)
    _next_serial: int = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, block_hash: BlockHash) -> BookEntry | None:
        return self._entries.get(block_hash)

    # --- tickets (the agent's serve) -----------------------------------------------------------
    def open(self, tokens: Sequence[int], hashes: Sequence[BlockHash], tenant: str | None) -> Ticket:
        """A request's prompt `tokens`, whose full blocks the agent hashed as `hashes` under the
        tenant's salt and this book's key."""
        assert len(hashes) == len(tokens) // self.block_size, "one hash per full prompt block"
        ticket = Ticket(self._next_serial, [], [], tenant or None)
        self._next_serial += 1
        self._open.add(ticket.serial)
        self._add(ticket, tokens, hashes)
        return ticket

    def extend(self, ticket: Ticket, tokens: Sequence[int]) -> None:
        """Generated `tokens`: the full blocks they complete get entries."""
        bs = self.block_size
        done = len(ticket.hashes)
        tail = [*ticket.tokens[done * bs:], *tokens]
        salt = tenant_salt(ticket.tenant) if not done else b""
        parent = ticket.hashes[-1] if done else None
        self._add(ticket, tokens, hash_blocks(tail, bs, salt=salt, key=self.hash_key, parent=parent))

    def close(self, ticket: Ticket) -> None:
        self._open.discard(ticket.serial)

    def stamp(self) -> int:
        """The serial the next ticket will get: a ticket below it was opened by now."""
        return self._next_serial

    def opened_before_are_closed(self, stamp: int) -> bool:
        """Whether every ticket opened before `stamp` has closed (no more tokens can come from them)."""
        return all(s >= stamp for s in self._open)

    # --- holdings (the published events) -------------------------------------------------------
    def hold(self, hashes: Sequence[BlockHash], tier: Tier) -> None:
        for h in hashes:
            if h in self._entries:
                self._held.setdefault(h, set()).add(tier)
                self._unheld.pop(h, None)

    def release(self, hashes: Sequence[BlockHash], tier: Tier) -> None:
        for h in hashes:
            tiers = self._held.get(h)
            if tiers is not None:
                tiers.discard(tier)
                if not tiers:
                    del self._held[h]
                    self._unheld[h] = None
        self._trim()

    def release_all(self) -> None:
        for h in self._held:
            self._unheld[h] = None
        self._held.clear()
        self._trim()

    def check_invariants(self) -> None:
        assert not set(self._held) & set(self._unheld), "a hash both held and unheld"
        assert set(self._held) | set(self._unheld) == set(self._entries), (
            f"{len(self._entries)} entries, {len(self._held)} held + {len(self._unheld)} unheld")
        assert len(self._unheld) <= self.max_unheld, f"{len(self._unheld)} unheld > {self.max_unheld}"

    # --- internals -----------------------------------------------------------------------------
    def _add(self, ticket: Ticket, tokens: Sequence[int], hashes: Sequence[BlockHash]) -> None:
        bs = self.block_size
        ticket.tokens.extend(tokens)
        for h in hashes:
            i = len(ticket.hashes)
            parent = ticket.hashes[-1] if i else None
            salt = ticket.tenant if not i else None
            self._entries[h] = BookEntry(tuple(ticket.tokens[i * bs:(i + 1) * bs]), parent, salt)
            ticket.hashes.append(h)
            if h not in self._held:
                self._unheld[h] = None
                self._unheld.move_to_end(h)
        self._trim()

    def _trim(self) -> None:
        while len(self._unheld) > self.max_unheld:
            h, _ = self._unheld.popitem(last=False)
            del self._entries[h]
