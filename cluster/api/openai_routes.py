"""The router's OpenAI endpoints: POST /v1/completions and /v1/chat/completions, whole or streamed
as server-sent events. A session header (context.SESSION_HEADERS) keeps a session's requests on one
node while that stays cheap (Router.generate's `session`); the request id comes from X-Request-Id
(access_log)."""

import contextlib
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, NamedTuple

from aiohttp import web

from radixmesh.cluster.api.access_log import AccessNote, note
from radixmesh.cluster.api.choices import FirstNode, choice_requests, merge_choices
from radixmesh.cluster.api.context import (
    CHAT_TEMPLATE_KEY,
    CLOCK_KEY,
    ROUTER_KEY,
    TOKENIZER_KEY,
    read_body,
    refusal,
    session_key,
)
from radixmesh.cluster.api.logprobs_json import text_length
from radixmesh.cluster.api.openai_schema import (
    ApiError,
    ChatResponseShape,
    GenerationParams,
    ResponseShape,
    parse_chat,
    parse_completion,
    usage,
)
from radixmesh.cluster.api.prompt_tokens import chat_tokens, text_tokens
from radixmesh.cluster.router.admission import Overloaded
from radixmesh.cluster.router.results import NoNodeAvailable, RouterItem
from radixmesh.cluster.router.router import Router
from radixmesh.common.text.stop_strings import StopStrings
from radixmesh.common.text.tokenizer import Tokenizer
from radixmesh.proto.serve.limits import InvalidRequest
from radixmesh.proto.serve.plan import TokenDelta
from radixmesh.proto.serve.sampling import SamplingParams, TokenLogprob

logger = logging.getLogger(__name__)


def add_openai_routes(app: web.Application) -> None:
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat)


async def completions(request: web.Request) -> web.StreamResponse:
    router = request.app[ROUTER_KEY]
    _admit(router)
    parsed = parse_completion(await read_body(request), router.config.limits.max_context_tokens)
    prompt = parsed.prompt
    tokens = await text_tokens(request.app[TOKENIZER_KEY], router.config.limits, prompt) if isinstance(prompt, str) else prompt
    return await _generate(request, parsed.params, tokens, "cmpl", ResponseShape())


async def chat(request: web.Request) -> web.StreamResponse:
    router = request.app[ROUTER_KEY]
    _admit(router)
    parsed = parse_chat(await read_body(request))
    tokens = await chat_tokens(request.app[TOKENIZER_KEY], request.app[CHAT_TEMPLATE_KEY], router.config.limits,
                               parsed.messages)
    return await _generate(request, parsed.params, tokens, "chatcmpl", ChatResponseShape())


async def _generate(request: web.Request, params: GenerationParams, tokens: tuple[int, ...], prefix: str,
                    shape: ResponseShape) -> web.StreamResponse:
    router, tokenizer = request.app[ROUTER_KEY], request.app[TOKENIZER_KEY]
    if params.model != router.config.model_name:
        raise ApiError(404, f"model {params.model!r} does not exist; this server serves "
                            f"{router.config.model_name!r}", param="model", code="model_not_found")
    session = session_key(request)
    access = note(request)
    rid = access.generation_id(prefix)
    limits = router.config.limits
    bad_stop = next((t for t in params.stop_token_ids if t >= limits.vocab_size), None)
    if bad_stop is not None:
        raise ApiError(400, f"stop token id {bad_stop} is outside the vocabulary [0, {limits.vocab_size})",
                       param="stop_token_ids", code="invalid_value")
    # Omitted max_tokens: the rest of the context (at least 1, so a prompt that fills it is refused below).
    max_tokens = params.max_tokens or max(1, limits.max_context_tokens - len(tokens))
    try:
        sampling = SamplingParams(max_tokens=max_tokens, temperature=params.temperature, top_p=params.top_p,
                                  seed=params.seed, stop_token_ids=params.stop_token_ids,
                                  ignore_eos=params.ignore_eos, stop=params.stop, logprobs=params.logprobs)
        jobs = choice_requests(rid, tokens, sampling, params.cache_salt, params.n)
        router.validate(jobs[0])
    except ValueError as e:
        raise ApiError(400, str(e), param="prompt", code="invalid_prompt") from e
    ids = (rid, int(request.app[CLOCK_KEY]()), params.model)
    first = FirstNode()

    def rest() -> list[AsyncGenerator[_Piece | _End, None]]:
        return [_reply(tokenizer, router.generate(job, node=first.node), params, access) for job in jobs[1:]]

    pieces = merge_choices(_reply(tokenizer, router.generate(jobs[0], first, session=session), params, access), rest)
    try:
        if params.stream:
            return await _stream(request, pieces, ids, params, shape)
        texts: list[list[str]] = [[] for _ in jobs]
        logprobs: list[list[TokenLogprob]] = [[] for _ in jobs]
        ends: dict[int, _End] = {}
        async for i, piece in pieces:
            if isinstance(piece, _End):
                ends[i] = piece
            else:
                texts[i].append(piece.text)
                logprobs[i].extend(piece.logprobs)
    except (InvalidRequest, Overloaded, NoNodeAvailable) as e:
        raise refusal(e) from e
    finally:
        await pieces.aclose()  # a client gone before the end: aborts every choice on its agent
    choices = [{"index": i, **shape.full_choice("".join(texts[i]), ends[i].finish_reason)} for i in range(len(jobs))]
    if params.logprobs is not None:
        for choice, entries in zip(choices, logprobs, strict=True):
            choice["logprobs"] = shape.logprobs(tokenizer, entries, 0)
    return web.json_response(shape.envelope(shape.kind, ids, choices, _usage(ends)))


def _admit(router: Router) -> None:
    """Refuse a request for capacity before its body is even read."""
    try:
        router.admission.check()
    except Overloaded as e:
        router.metrics.record_request("refused")
        raise refusal(e) from e


class _Piece(NamedTuple):
    """Text of a choice (maybe empty), and the log-probabilities of the tokens that came with it."""

    text: str
    logprobs: tuple[TokenLogprob, ...] = ()


class _End(NamedTuple):
    """How a choice ended: the last item of `_reply`."""

    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


async def _reply(tokenizer: Tokenizer, items: AsyncGenerator[RouterItem, None], params: GenerationParams,
                 access: AccessNote) -> AsyncGenerator[_Piece | _End, None]:
    """One choice's text in pieces (some empty), then one _End; closing it closes `items` (which
    aborts the request on its agent). The agent's engine ends a request on the token that completes
    a stop string; the same check here cuts the text right before it."""
    text = tokenizer.stream()  # holds back a cut character until later tokens complete it
    stops = StopStrings(params.stop) if params.stop else None
    async with contextlib.aclosing(items):
        async for item in items:
            if isinstance(item, TokenDelta):
                piece = text.push(item.token_ids)
                yield _Piece(piece if stops is None else stops.push(piece).text, item.logprobs)
                continue
            finish, tail = item.result.finish_reason.value, text.flush()
            if stops is not None:
                check = stops.push(tail)
                tail = check.text if check.stopped else check.text + stops.flush()
            yield _Piece(tail)
            access.node, access.cached_tokens = item.result.node, item.cached_tokens
            result = item.result
            yield _End(finish, result.stats.prompt_tokens, len(result.output_token_ids), item.cached_tokens)
            return
    raise AssertionError("the router's stream ended without a result")


def _usage(ends: dict[int, _End]) -> dict[str, Any]:
    """OpenAI's usage of all choices: the prompt once, every choice's completion; cached tokens are
    the first choice's (the others reuse its prefill by design)."""
    first = ends[0]
    return usage(first.prompt_tokens, sum(e.completion_tokens for e in ends.values()), first.cached_tokens)


async def _stream(request: web.Request, pieces: AsyncIterator[tuple[int, _Piece | _End]],
                  ids: tuple[str, int, str], params: GenerationParams, shape: ResponseShape) -> web.StreamResponse:
    # The first item is awaited before the response starts, so routing failures keep their status.
    first = await anext(pieces)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    opened: set[int] = set()
    ends: dict[int, _End] = {}
    offsets: dict[int, int] = {}  # characters of each choice's tokens sent so far (completions' text_offset)
    tokenizer = request.app[TOKENIZER_KEY]

    async def send(body: dict[str, Any] | str) -> None:
        data = body if isinstance(body, str) else json.dumps(body)
        await response.write(f"data: {data}\n\n".encode())

    async def emit(i: int, item: _Piece | _End) -> None:
        # chunks carry "usage": null; a last chunk carries every choice's when asked for
        if isinstance(item, _Piece):
            if item.text or item.logprobs or i not in opened:
                choice = {"index": i, **shape.delta_choice(item.text, i not in opened, None)}
                if params.logprobs is not None:
                    choice["logprobs"] = shape.logprobs(tokenizer, item.logprobs, offsets.get(i, 0))
                    offsets[i] = offsets.get(i, 0) + text_length(tokenizer, item.logprobs)
                await send(shape.envelope(shape.chunk_kind, ids, [choice], None))
                opened.add(i)
            return
        ends[i] = item
        choice = {"index": i, **shape.delta_choice("", False, item.finish_reason)}
        await send(shape.envelope(shape.chunk_kind, ids, [choice], None))

    try:
        await emit(*first)
        async for i, item in pieces:
            await emit(i, item)
        if params.include_usage:
            await send(shape.envelope(shape.chunk_kind, ids, [], _usage(ends)))
    except (NoNodeAvailable, InvalidRequest, Overloaded) as e:
        status, kind = (503, "server_error") if isinstance(e, NoNodeAvailable) else (400, "invalid_request_error")
        if isinstance(e, Overloaded):
            status, kind = 429, "requests"
        logger.warning("stream %s failed after it started: %s", ids[0], e)
        await send(ApiError(status, str(e), type_=kind).body())
    except ConnectionResetError:
        # The client left; closing the pieces (by the caller) aborts every choice on its agent.
        logger.info("client of stream %s disconnected", ids[0])
        return response
    await send("[DONE]")
    await response.write_eof()
    return response
