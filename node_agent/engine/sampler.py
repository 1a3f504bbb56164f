"""Next-token choice: greedy, or temperature + top-p with a per-request, per-position seed."""

import torch

from radixmesh.proto.serve.sampling import SamplingParams, TokenLogprob


def sample(logits: torch.Tensor, params: SamplingParams, seed: int, index: int) -> int:
    """The token to emit at output position `index` of a request, from its float32 logits [vocab].

    The draw depends only on (logits, params, seed, index): recomputing a preempted request, or
    batching it differently, cannot change which token a given distribution yields.
    """
    if params.temperature == 0.0:
        return int(torch.argmax(logits).item())
    probs = torch.softmax(logits.float().cpu() / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        # Keep a token while the mass before it is below top_p, so the top token always survives.
        keep = (torch.cumsum(sorted_probs, dim=-1) - sorted_probs) < params.top_p
        probs = torch.zeros_like(probs).scatter_(0, order[keep], sorted_probs[keep])
    gen = torch.Generator().manual_seed((seed * 1_000_003 + index) % (1 << 63))
    return int(torch.multinomial(probs, 1, generator=gen).item())


def token_logprob(logits: torch.Tensor, token: int, top: int) -> TokenLogprob:
    """`token`'s log-probability under float32 `logits` [vocab] (the ones `sample` drew it from) and
    the `top` most likely tokens, most likely first (ties: lower id first, as torch.topk on CPU)."""
    logprobs = torch.log_softmax(logits.float().cpu(), dim=-1)
    best = torch.topk(logprobs, top) if top else None
    alternatives = () if best is None else tuple(
        (int(i), float(v)) for v, i in zip(best.values.tolist(), best.indices.tolist(), strict=True))
    return TokenLogprob(token, float(logprobs[token]), alternatives)
