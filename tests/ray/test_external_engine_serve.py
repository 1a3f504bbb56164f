"""radixmesh's routing as a Ray Serve request router, on local Ray: requests that share a prefix
go to the replica that served it, and that replica's own prefix cache shows the hits."""

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import ray
from ray import serve
from ray.serve.config import RequestRouterConfig

from radixmesh.cluster.api.ray_serve import RadixmeshRequestRouter, prompt_of
from radixmesh.cluster.launch.local_ray import init_loopback_ray
from radixmesh.common.text.tokenizer import ByteTokenizer
from radixmesh.proto.block_hash import hash_blocks

pytestmark = pytest.mark.ray

BS = 4


@serve.deployment(
    num_replicas=3,
    max_ongoing_requests=8,
    ray_actor_options={"num_cpus": 0},  # three replicas on two shared cores
    # affinity_attempts: on this shared 2-core host a replica's queue-length probe can miss Serve's
    # deadline six times running (3.5 s) under a loaded suite, and the group would then fall through
    # to another replica; affinity is what this test checks (the fall-through has its own test).
    request_router_config=RequestRouterConfig(request_router_class=RadixmeshRequestRouter,
                                              request_router_kwargs={"block_size": BS, "seed": 0,
                                                                     "affinity_attempts": 20}),
)
class CachingReplica:
    """A replica with a prefix cache of its own, the way an engine replica has one."""

    def __init__(self) -> None:
        self.cache: set[bytes] = set()
        self.replica = serve.get_replica_context().replica_id.unique_id

    def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        hashes = hash_blocks(request["prompt"], BS)
        hit = 0
        while hit < len(hashes) and hashes[hit] in self.cache:
            hit += 1
        self.cache.update(hashes)
        return {"replica": self.replica, "cached_tokens": hit * BS}


@pytest.fixture(scope="module")
def serve_app() -> Iterator[Any]:
    init_loopback_ray(num_cpus=2, log_to_driver=False)
    try:
        serve.start(proxy_location="Disabled")
        yield serve.run(CachingReplica.bind(), name="radixmesh-serve-test", route_prefix=None)
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.mark.integration
@pytest.mark.slow
def test_shared_prefixes_stay_on_their_replica_and_hit(serve_app: Any) -> None:
    prefixes = {g: [g * 50 + i for i in range(32)] for g in (1, 2, 3)}  # 8 blocks each
    served: dict[int, list[dict[str, Any]]] = {g: [] for g in prefixes}
    for turn in range(3):
        for g, prefix in prefixes.items():
            served[g].append(serve_app.remote({"prompt": [*prefix, 200 + turn, 201, 202, 203]}).result(timeout_s=60))
    for g, results in served.items():
        assert len({r["replica"] for r in results}) == 1, f"group {g} was split: {results}"
        assert [r["cached_tokens"] for r in results] == [0, 32, 32], f"group {g}: {results}"


def test_prompts_are_read_from_text_token_ids_or_messages() -> None:
    class Req:
        def __init__(self, **fields: Any) -> None:
            self.__dict__.update(fields)

    class Pending:
        def __init__(self, *args: Any) -> None:
            self.args, self.kwargs = list(args), {}

    tok = ByteTokenizer()
    assert prompt_of(Pending(Req(prompt=[1, 2, 3], cache_salt="t")), tok) == ([1, 2, 3], "t")  # type: ignore[arg-type]
    assert prompt_of(Pending(Req(prompt="hi")), tok) == (tok.encode("hi"), "")  # type: ignore[arg-type]
    messages = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    assert prompt_of(Pending({"messages": messages}), tok) == (tok.encode("ab"), "")  # type: ignore[arg-type]
    assert prompt_of(Pending(42), tok) is None  # type: ignore[arg-type]


def test_the_holder_alone_is_offered_until_its_tries_run_out() -> None:
    """A holder whose queue-length probe is slow (a busy host) is retried before Serve may fall
    through to replicas that hold none of the prefix."""

    class Rid:
        def __init__(self, name: str) -> None:
            self.name = name

        def to_full_id_str(self) -> str:
            return self.name

    class Replica:
        def __init__(self, name: str) -> None:
            self.replica_id = Rid(name)

    class Meta:
        def __init__(self, request_id: str) -> None:
            self.internal_request_id = request_id

    class Pending:
        def __init__(self, request_id: str, prompt: list[int]) -> None:
            self.args, self.kwargs, self.metadata = [{"prompt": prompt}], {}, Meta(request_id)

    router = RadixmeshRequestRouter.__new__(RadixmeshRequestRouter)
    router.initialize_state(block_size=BS, seed=0, affinity_attempts=3)
    replicas = [Replica(n) for n in ("a", "b", "c")]
    prompt = list(range(16))

    async def tries(request: Pending, n: int) -> list[list[list[str]]]:
        ranks = [await router.choose_replicas(replicas, request) for _ in range(n)]  # type: ignore[arg-type]
        return [[[r.replica_id.name for r in rank] for rank in ranked] for ranked in ranks]

    first = Pending("r1", prompt)
    [[[holder]]] = asyncio.run(tries(first, 1))
    router.on_request_routed(first, Rid(holder), None)  # type: ignore[arg-type]
    router.on_request_completed(Rid(holder), "r1")  # type: ignore[arg-type]
    ranked = asyncio.run(tries(Pending("r2", prompt), 3))
    others = sorted({"a", "b", "c"} - {holder})
    assert ranked[:2] == [[[holder]], [[holder]]]
    assert ranked[2][0] == [holder] and sorted(ranked[2][1]) == others
    with pytest.raises(ValueError, match="affinity_attempts"):
        router.initialize_state(affinity_attempts=0)
