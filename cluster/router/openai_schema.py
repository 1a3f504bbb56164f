"""The OpenAI wire format of the router's HTTP API: request validation and response bodies.

Parsing is pure: a body either becomes a typed request or raises ApiError carrying the HTTP status
and OpenAI's error object ``{"error": {"message", "type", "param", "code"}}``; nothing is routed,
counted or allocated before a request parses. Fields the router cannot honour (several choices,
stop sequences, logprobs, ...) are refused rather than silently ignored.
"""

from dataclasses import dataclass
from typing import Any

from radixmesh.node_agent.model.chat_template import ROLES, ChatMessage
from radixmesh.proto.serve.sampling import MAX_SEED

# Fields that change what OpenAI returns; accepted only at their neutral value.
_NEUTRAL: dict[str, tuple[object, ...]] = {
    "n": (None, 1), "best_of": (None, 1), "echo": (None, False), "logprobs": (None, False, 0),
    "top_logprobs": (None, 0), "suffix": (None, ""), "stop": (None, [], ""), "logit_bias": (None, {}),
    "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0), "tools": (None, []),
    "functions": (None, []), "tool_choice": (None, "none"),
}


class ApiError(Exception):
    """An OpenAI-style error answer: HTTP `status` and the error object."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type_: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type_

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass(frozen=True, slots=True)
class GenerationParams:
    """What both endpoints share."""

    model: str
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    stream: bool
    include_usage: bool
    """stream_options.include_usage: a last chunk carries usage."""
    user: str
    """Tenant name: salts the prompt's block hashes, so only equal users share prefixes."""


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


def _params(body: object, max_tokens_names: tuple[str, ...]) -> tuple[dict[str, Any], GenerationParams]:
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object", None, "invalid_type")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("'model' is required and must be a non-empty string", "model", "missing_required_parameter")
    for name, neutral in _NEUTRAL.items():
        if name in body and body[name] not in neutral:
            raise _bad(f"'{name}' is not supported by this server (only {neutral[-1]!r})", name, "unsupported_value")
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
        include_usage = bool(options.get("include_usage", False))
    user = body.get("user", "")
    if not isinstance(user, str):
        raise _bad("'user' must be a string", "user", "invalid_type")
    return body, GenerationParams(
        model=model,
        max_tokens=16 if max_tokens is None else max_tokens,
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0, False),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0, True),
        seed=_int(body, "seed", None, 0, MAX_SEED),
        stream=stream,
        include_usage=include_usage,
        user=user,
    )


def _token_list(value: list[Any]) -> tuple[int, ...] | None:
    if value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return tuple(value)
    return None


def parse_completion(body: object) -> CompletionRequest:
    """A /v1/completions body: `prompt` is a string, a list of token ids, or a one-element list of either."""
    fields, params = _params(body, ("max_tokens",))
    prompt = fields.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
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
    fields, params = _params(body, ("max_tokens", "max_completion_tokens"))
    raw = fields.get("messages")
    if not isinstance(raw, list) or not raw:
        raise _bad("'messages' must be a non-empty list", "messages", "missing_required_parameter")
    messages = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise _bad(f"messages[{i}].role must be one of {', '.join(ROLES)}", f"messages[{i}].role")
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

    def envelope(self, kind: str, ids: tuple[str, int, str], choice: dict[str, Any] | None,
                 usage_obj: dict[str, Any] | None) -> dict[str, Any]:
        """`ids` = (response id, created unix time, model); `choice` None gives the usage-only chunk."""
        rid, created, model = ids
        choices = [] if choice is None else [{"index": 0, "logprobs": None, **choice}]
        return {"id": rid, "object": kind, "created": created, "model": model, "choices": choices, "usage": usage_obj}

    def full_choice(self, text: str, finish_reason: str) -> dict[str, Any]:
        return {"text": text, "finish_reason": finish_reason}

    def delta_choice(self, text: str, first: bool, finish_reason: str | None) -> dict[str, Any]:
        return {"text": text, "finish_reason": finish_reason}


class ChatResponseShape(ResponseShape):
    """Response bodies of /v1/chat/completions (chat.completion and chat.completion.chunk)."""

    kind = "chat.completion"
    chunk_kind = "chat.completion.chunk"

    def full_choice(self, text: str, finish_reason: str) -> dict[str, Any]:
        return {"message": {"role": "assistant", "content": text}, "finish_reason": finish_reason}

    def delta_choice(self, text: str, first: bool, finish_reason: str | None) -> dict[str, Any]:
        delta: dict[str, Any] = {"role": "assistant", "content": text} if first else {"content": text}
        return {"delta": delta if text or first else {}, "finish_reason": finish_reason}
