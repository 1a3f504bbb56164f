"""One engine step is one forward over its decodes and prefill chunks together."""

import torch

from radixmesh.node_agent.engine.config import EngineConfig
from radixmesh.node_agent.engine.engine import Engine
from radixmesh.node_agent.engine.request import Request, RequestId
from radixmesh.node_agent.memory.config import MemoryConfig
from radixmesh.node_agent.model.llama import AttentionBatch, LlamaForCausalLM
from radixmesh.proto.serve.sampling import SamplingParams
from tests.support.tiny_model import tiny_model

BS = 4


def make_engine(model: LlamaForCausalLM) -> Engine:
    return Engine(model, EngineConfig(block_size=BS, max_num_batched_tokens=12,
                                      memory=MemoryConfig(num_gpu_blocks=64, enable_prefix_caching=False)))


def request(i: int, prompt_len: int) -> Request:
    prompt = tuple((7 * i + j) % 200 + 2 for j in range(prompt_len))
    return Request(RequestId(f"r{i}"), prompt, SamplingParams(max_tokens=6, ignore_eos=True))


def test_decodes_and_prefill_chunks_share_one_forward_and_keep_each_requests_tokens() -> None:
    model = tiny_model(seed=1)
    alone = {r.request_id: make_engine(model).generate([r])[0].output_token_ids
             for r in (request(i, 5 + 4 * i) for i in range(4))}
    batches: list[AttentionBatch] = []
    forward = model.forward

    def recording(ids: torch.Tensor, positions: torch.Tensor, batch: AttentionBatch, *rest: torch.Tensor
                  ) -> torch.Tensor:
        batches.append(batch)
        return forward(ids, positions, batch, *rest)

    model.forward = recording  # type: ignore[method-assign]
    eng = make_engine(model)
    # Requests arrive while others decode, so later steps hold decodes and a prefill chunk at once.
    outputs: dict[str, list[int]] = {}
    for i in range(4):
        eng.submit(request(i, 5 + 4 * i))
        for _ in range(2):
            for rid, token, _ in eng.step().tokens:
                outputs.setdefault(rid, []).append(token)
    while eng.has_work:
        for rid, token, _ in eng.step().tokens:
            outputs.setdefault(rid, []).append(token)
    assert len(batches) == eng.counters.steps
    assert any(0 < b.num_decodes and b.prefill is not None for b in batches)
    assert {rid: tuple(t) for rid, t in outputs.items()} == alone
