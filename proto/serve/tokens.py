"""Where a request's prompt tokens came from: the one shape the engine, the agent, the router, the
metadata service and the replay tools all report them in."""

from dataclasses import dataclass, field, fields


@dataclass(frozen=True, slots=True)
class TokenSources:
    """Prompt tokens by source; they sum to the prompt. Every source but `computed` is a hit."""

    local_gpu: int = 0
    """Found in the serving node's gpu tier."""
    local_host: int = 0
    """Found in the serving node's host tier (copied up to the gpu)."""
    local_disk: int = field(default=0, kw_only=True)
    """Found in the serving node's disk tier (read back through the host to the gpu). Keyword-only:
    positional construction keeps its older meaning (gpu, host, remote, computed); `fields` and
    every listing still put it after local_host."""
    remote: int = 0
    """Pulled from a peer (blocks that arrived intact)."""
    computed: int = 0
    """Prefilled: the miss."""

    def __post_init__(self) -> None:
        if min(self.local_gpu, self.local_host, self.local_disk, self.remote, self.computed) < 0:
            raise ValueError(f"token counts must be non-negative: {self}")

    @classmethod
    def of_prompt(cls, prompt_tokens: int, *, local_gpu: int = 0, local_host: int = 0, local_disk: int = 0,
                  remote: int = 0) -> "TokenSources":
        """The hits given; the rest of the prompt computed. ValueError when the hits exceed it."""
        computed = prompt_tokens - local_gpu - local_host - local_disk - remote
        if computed < 0:
            raise ValueError(f"hits {prompt_tokens - computed} exceed the prompt's {prompt_tokens} tokens")
        return cls(local_gpu, local_host, remote, computed, local_disk=local_disk)

    @property
    def prompt(self) -> int:
        return self.hits + self.computed

    @property
    def hits(self) -> int:
        return self.local_gpu + self.local_host + self.local_disk + self.remote

    @property
    def local(self) -> int:
        """Found on the serving node itself, in any of its tiers."""
        return self.local_gpu + self.local_host + self.local_disk

    def __add__(self, other: "TokenSources") -> "TokenSources":
        return TokenSources(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    def items(self) -> list[tuple[str, int]]:
        """(source name, tokens) in field order: the `source` label values of every metric."""
        return [(f.name, getattr(self, f.name)) for f in fields(self)]


SOURCES = tuple(f.name for f in fields(TokenSources))
"""Source names, in order: local_gpu, local_host, local_disk, remote, computed."""
HIT_SOURCES = SOURCES[:-1]
"""The sources that are hits: local_gpu, local_host, local_disk, remote."""
