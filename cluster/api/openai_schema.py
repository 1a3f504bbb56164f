"""The OpenAI wire format of the router's HTTP API: request validation and response bodies.

Parsing is pure: a body either becomes a typed request or raises ApiError carrying the HTTP status
and OpenAI's error object ``{"error": {"message", "type", "param", "code"}}``; nothing is routed,
counted or allocated before a request parses. Every request field is served, accepted and ignored,
accepted only at its "off" value, or refused with a 400 naming it, never silently ignored: the
classes, field by field, in docs/routing.md#request-fields.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from radixmesh.cluster.api.logprobs_json import chat_logprobs, completion_logprobs
from radixmesh.common.text.chat_template import ROLES, ChatMessage
from radixmesh.common.text.tokenizer import Tokenizer
from radixmesh.proto.metadata.limits import MAX_TENANT_CHARS
from radixmesh.proto.serve.sampling import (
    MAX_SEED,
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    MAX_TOP_LOGPROBS,
    TokenLogprob,
)

MAX_CHOICES = 16
"""Most choices (`n`) one request may ask for: each holds a running slot and KV of its own."""
MAX_STOP_TOKEN_IDS = 64
"""Most `stop_token_ids` one request may give: the engine checks every sampled token against them."""

# Fields both endpoints serve; each endpoint adds its prompt field (and chat max_completion_tokens).
_SERVED = frozenset({"model", "max_tokens", "n", "temperature", "top_p", "seed", "stream", "stream_options", "stop",
                     "stop_token_ids", "ignore_eos", "cache_salt"})
# Accepted and type-checked, but they change nothing in the reply.
_ACCEPTED: dict[str, type | tuple[type, ...]] = {"user": str, "metadata": dict, "store": bool, "service_tier": str}
# Implemented nowhere here; accepted only at the value that means "off" (the last one is named in the error).
_NEUTRAL: dict[str, tuple[object, ...]] = {
    "best_of": (None, 1), "echo": (None, False), "suffix": (None, ""), "logit_bias": (None, {}),
    "presence_penalty": (None, 0.0, 0), "frequency_penalty": (None, 0.0, 0), "tools": (None, []),
    "functions": (None, []), "tool_choice": (None, "none"), "function_call": (None, "none"),
    "parallel_tool_calls": (None, False), "response_format": (None, {"type": "text"}),
    "modalities": (None, ["text"]), "reasoning_effort": (None,), "prediction": (None,), "audio": (None,),
    "web_search_options": (None,),
    # vLLM's sampling extras
    "top_k": (None, 0, -1), "min_p": (None, 0.0, 0), "repetition_penalty": (None, 1, 1.0), "min_tokens": (None, 0),
    "include_stop_str_in_output": (None, False), "skip_special_tokens": (None, True),
}
# Keys of a chat message: role and content are served; these are accepted while empty (an assistant
# message the openai client hands back carries them as null).
_MESSAGE_NEUTRAL: dict[str, tuple[object, ...]] = {
    "refusal": (None,), "tool_calls": (None, []), "function_call": (None,), "audio": (None,), "annotations": (None, []),
}


def _check_fields(body: dict[str, Any], served: frozenset[str]) -> None:
    """The field policy of the module docstring, for one body."""
    for name, value in body.items():
        if name in served:
            continue
        if name in _ACCEPTED:
            if value is not None and not isinstance(value, _ACCEPTED[name]):
                raise _bad(f"'{name}' has the wrong type", name, "invalid_type")
        elif name in _NEUTRAL:
            neutral = _NEUTRAL[name]
            if value not in neutral:
                only = "" if neutral == (None,) else f" (only {neutral[-1]!r})"
                raise _bad(f"'{name}' is not supported by this server{only}", name, "unsupported_value")
        else:
            raise _bad(f"unrecognized request argument supplied: '{name}'", name, "unknown_parameter")


class ApiError(Exception):
    """An OpenAI-style error answer: HTTP `status` and the error object."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type_: str = "invalid_request_error", headers: dict[str, str] | None = None,
                 counted: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type_
        self.headers = headers or {}
        self.counted = counted
        """The router already counted the request's outcome (it got as far as Router.generate)."""

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass(frozen=True, slots=True)
class GenerationParams:
    """What both endpoints share."""

    model: str
    max_tokens: int | None
    """None: the rest of the model's context after the prompt (vLLM's default)."""
    n: int
    """Choices to generate for the prompt, 1..MAX_CHOICES."""
    logprobs: int | None
    """Return each token's log-probability with this many alternatives (0..MAX_TOP_LOGPROBS); None: off."""
    temperature: float
    top_p: float
    seed: int | None
    stream: bool
    include_usage: bool
    """stream_options.include_usage: a last chunk carries usage."""
    stop: tuple[str, ...]
    """Generation ends at the first of these in the text; it and what follows are not returned."""
    stop_token_ids: tuple[int, ...]
    """Generation ends after any of these tokens (vLLM's field)."""
    ignore_eos: bool
    """Generate past the model's EOS token (vLLM's field)."""
    cache_salt: str
    """Tenant name (vLLM's `cache_salt`): salts the prompt's block hashes, so only requests with
    equal salts share prefixes; "" is the shared tenant."""


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    prompt: str | tuple[int, ...]
    params: GenerationParams


@dataclass(frozen=True, slots=True)
class ChatRequest:
    messages: tuple[ChatMessage, ...]
    params: GenerationParams


def _bad(message: str, param: str | None, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def _number(body: dict[str, Any], name: str, default: float, low: float, high: float, low_open: bool) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad(f"'{name}' must be a number", name, "invalid_type")
    if not (low < value if low_open else low <= value) or not value <= high:
        raise _bad(f"'{name}' must be in {'(' if low_open else '['}{low}, {high}], got {value}", name)
    return float(value)


def _int(body: dict[str, Any], name: str, default: int | None, low: int, high: int) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"'{name}' must be an integer", name, "invalid_type")
    if not low <= value <= high:
        raise _bad(f"'{name}' must be in [{low}, {high}], got {value}", name)
    return value


def _n(body: dict[str, Any]) -> int:
    n = _int(body, "n", 1, 1, MAX_CHOICES)
    assert n is not None
    seed = body.get("seed")
    if n > 1 and isinstance(seed, int) and not isinstance(seed, bool) and seed > MAX_SEED - (n - 1):
        raise _bad(f"with 'n' = {n}, 'seed' must be at most {MAX_SEED - (n - 1)} (choice i uses seed + i)", "seed")
    return n


def _completion_logprobs(body: dict[str, Any]) -> int | None:
    """Completions: `logprobs` is the number of alternatives per token (0: the token's own only)."""
    return _int(body, "logprobs", None, 0, MAX_TOP_LOGPROBS)


def _chat_logprobs(body: dict[str, Any]) -> int | None:
    """Chat: `logprobs` switches them on, `top_logprobs` (which needs it) counts the alternatives."""
    on = body.get("logprobs")
    if on is not None and not isinstance(on, bool):
        raise _bad("'logprobs' must be a boolean (the number of alternatives is 'top_logprobs')", "logprobs",
                   "invalid_type")
    top = _int(body, "top_logprobs", None, 0, MAX_TOP_LOGPROBS)
    if top is not None and not on:
        raise _bad("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    return (top or 0) if on else None


def _stop(body: dict[str, Any]) -> tuple[str, ...]:
    value = body.get("stop")
    stops = [] if value is None else [value] if isinstance(value, str) else value
    if not (isinstance(stops, list) and len(stops) <= MAX_STOP_STRINGS
            and all(isinstance(s, str) and len(s) <= MAX_STOP_CHARS for s in stops)):
        raise _bad(f"'stop' must be a string or a list of at most {MAX_STOP_STRINGS} strings of at most "
                   f"{MAX_STOP_CHARS} characters", "stop", "invalid_type")
    return tuple(dict.fromkeys(s for s in stops if s))  # "" stops nothing


def _stop_token_ids(body: dict[str, Any]) -> tuple[int, ...]:
    value = body.get("stop_token_ids")
    if value is None:
        return ()
    if isinstance(value, list) and len(value) > MAX_STOP_TOKEN_IDS:
        raise _bad(f"'stop_token_ids' holds {len(value)} ids, at most {MAX_STOP_TOKEN_IDS} are allowed",
                   "stop_token_ids")
    if not (isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)):
        raise _bad("'stop_token_ids' must be a list of token ids", "stop_token_ids", "invalid_type")
    return tuple(dict.fromkeys(value))


def _params(body: object, prompt_fields: frozenset[str], max_tokens_names: tuple[str, ...],
            logprobs: Callable[[dict[str, Any]], int | None]) -> tuple[dict[str, Any], GenerationParams]:
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object", None, "invalid_type")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("'model' is required and must be a non-empty string", "model", "missing_required_parameter")
    _check_fields(body, _SERVED | prompt_fields)
    max_tokens: int | None = None
    for name in max_tokens_names:
        max_tokens = _int(body, name, max_tokens, 1, 1 << 20)
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise _bad("'stream' must be a boolean", "stream", "invalid_type")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not stream:
            raise _bad("'stream_options' is only allowed with 'stream': true", "stream_options")
        if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
            raise _bad("'stream_options' must be an object with a boolean 'include_usage'", "stream_options")
        for key in options.keys() - {"include_usage"}:
            raise _bad(f"unrecognized request argument supplied: 'stream_options.{key}'", f"stream_options.{key}",
                       "unknown_parameter")
        include_usage = bool(options.get("include_usage", False))
    cache_salt = body.get("cache_salt")
    if cache_salt is not None and not isinstance(cache_salt, str):
        raise _bad("'cache_salt' must be a string", "cache_salt", "invalid_type")
    if cache_salt is not None and len(cache_salt) > MAX_TENANT_CHARS:
        # The tenant travels in every heartbeat's hit reports and keys counters: keep it an id.
        raise _bad(f"'cache_salt' is at most {MAX_TENANT_CHARS} characters", "cache_salt")
    ignore_eos = body.get("ignore_eos")
    if ignore_eos is not None and not isinstance(ignore_eos, bool):
        raise _bad("'ignore_eos' must be a boolean", "ignore_eos", "invalid_type")
    alternatives = logprobs(body)
    return body, GenerationParams(
        model=model,
        max_tokens=max_tokens,
        n=_n(body),
        logprobs=alternatives,
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0, False),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0, True),
        seed=_int(body, "seed", None, 0, MAX_SEED),
        stream=stream,
        include_usage=include_usage,
        stop=_stop(body),
        stop_token_ids=_stop_token_ids(body),
        ignore_eos=bool(ignore_eos),
        cache_salt=cache_salt or "",
    )


def _token_list(value: list[Any]) -> tuple[int, ...] | None:
    if value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return tuple(value)
    return None


def parse_completion(body: object, max_prompt_tokens: int | None = None) -> CompletionRequest:
    """A /v1/completions body: `prompt` is a string, a list of token ids, or a one-element list of either.
    A list of ids longer than `max_prompt_tokens` is refused before any id is looked at."""
    fields, params = _params(body, frozenset({"prompt", "logprobs"}), ("max_tokens",), _completion_logprobs)
    prompt = fields.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, list) and max_prompt_tokens is not None and len(prompt) > max_prompt_tokens:
        raise ApiError(400, f"'prompt' holds {len(prompt)} token ids: more than the context of {max_prompt_tokens} "
                            "tokens", param="prompt", code="context_length_exceeded")
    if isinstance(prompt, str):
        if not prompt:
            raise _bad("'prompt' must not be empty", "prompt")
        return CompletionRequest(prompt, params)
    tokens = _token_list(prompt) if isinstance(prompt, list) else None
    if tokens is None:
        raise _bad("'prompt' must be a non-empty string or list of token ids (one prompt per request)", "prompt")
    return CompletionRequest(tokens, params)


def _content(message: dict[str, Any], i: int) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    # The content-parts form: [{"type": "text", "text": ...}, ...]; only text parts are served.
    if isinstance(content, list) and content and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content
    ):
        return "".join(p["text"] for p in content)
    raise _bad(f"messages[{i}].content must be a string or a list of text parts", f"messages[{i}].content")


def parse_chat(body: object) -> ChatRequest:
    """A /v1/chat/completions body: a non-empty list of {role, content} messages."""
    fields, params = _params(body, frozenset({"messages", "max_completion_tokens", "logprobs", "top_logprobs"}),
                             ("max_tokens", "max_completion_tokens"), _chat_logprobs)
    raw = fields.get("messages")
    if not isinstance(raw, list) or not raw:
        raise _bad("'messages' must be a non-empty list", "messages", "missing_required_parameter")
    messages = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise _bad(f"messages[{i}].role must be one of {', '.join(ROLES)}", f"messages[{i}].role")
        for key in m.keys() - {"role", "content"}:
            if m[key] not in _MESSAGE_NEUTRAL.get(key, ()):
                raise _bad(f"messages[{i}].{key} is not supported by this server", f"messages[{i}].{key}",
                           "unsupported_value")
        messages.append(ChatMessage(m["role"], _content(m, i)))
    return ChatRequest(tuple(messages), params)


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    """OpenAI's usage object; cached_tokens = prompt tokens reused (local or pulled), not prefilled."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


class ResponseShape:
    """Response bodies of /v1/completions (text_completion objects)."""

    kind = "text_completion"
    chunk_kind = "text_completion"

    def envelope(self, kind: str, ids: tuple[str, int, str], choices: list[dict[str, Any]],
                 usage_obj: dict[str, Any] | None) -> dict[str, Any]:
        """`ids` = (response id, created unix time, model); `choices` (each with its "index") empty
        gives the usage-only chunk."""
        rid, created, model = ids
        listed = [{"logprobs": None, **choice} for choice in choices]
        return {"id": rid, "object": kind, "created": created, "model": model, "choices": listed, "usage": usage_obj}

    def full_choice(self, text: str, finish_reason: str) -> dict[str, Any]:
        return {"text": text, "finish_reason": finish_reason}

    def delta_choice(self, text: str, first: bool, finish_reason: str | None) -> dict[str, Any]:
        return {"text": text, "finish_reason": finish_reason}

    def logprobs(self, tokenizer: Tokenizer, entries: Sequence[TokenLogprob], text_offset: int) -> dict[str, Any]:
        return completion_logprobs(tokenizer, entries, text_offset)


class ChatResponseShape(ResponseShape):
    """Response bodies of /v1/chat/completions (chat.completion and chat.completion.chunk)."""

    kind = "chat.completion"
    chunk_kind = "chat.completion.chunk"

    def full_choice(self, text: str, finish_reason: str) -> dict[str, Any]:
        return {"message": {"role": "assistant", "content": text}, "finish_reason": finish_reason}

    def delta_choice(self, text: str, first: bool, finish_reason: str | None) -> dict[str, Any]:
        delta: dict[str, Any] = {"role": "assistant", "content": text} if first else {"content": text}
        return {"delta": delta if text or first else {}, "finish_reason": finish_reason}

    def logprobs(self, tokenizer: Tokenizer, entries: Sequence[TokenLogprob], text_offset: int) -> dict[str, Any]:
        return chat_logprobs(tokenizer, entries)
