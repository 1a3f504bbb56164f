"""Chat templates: how /v1/chat/completions turns messages into one prompt.

`PlainChatTemplate` is the documented template of the tiny model: each message renders on its own
(`<|role|>\\n{content}<|end|>\\n`), then the generation header `<|assistant|>\\n`, so the prompt of
turn k is a prefix of turn k+1's whenever the client sends the reply back unchanged: a
conversation's history is a growing shared prefix, which is what the prefix cache reuses.

`JinjaChatTemplate` is a real model's own template (Jinja source from tokenizer_config.json, a
chat_template.jinja file or a GGUF's `tokenizer.chat_template`), rendered as transformers'
`apply_chat_template(messages, tokenize=False, add_generation_prompt=True)` renders it.
"""

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

from radixmesh.common.text.gguf_tokenizer import read_tokenizer_metadata

ROLES = ("system", "user", "assistant")
GENERATION_HEADER = "<|assistant|>\n"
END = "<|end|>\n"


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: str
    """One of ROLES."""
    content: str

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {self.role!r}")


class ChatTemplate(Protocol):
    def render(self, messages: Sequence[ChatMessage]) -> str:
        """The prompt for the assistant's next reply (generation header included). ValueError for an
        empty conversation or one the template refuses (its `raise_exception`)."""
        ...


def render_message(message: ChatMessage) -> str:
    return f"<|{message.role}|>\n{message.content}{END}"


class PlainChatTemplate:
    """The documented template above."""

    def render(self, messages: Sequence[ChatMessage]) -> str:
        """The prompt for the assistant's next reply; ValueError for an empty conversation."""
        if not messages:
            raise ValueError("a chat needs at least one message")
        return "".join(render_message(m) for m in messages) + GENERATION_HEADER


class JinjaChatTemplate:
    """A model's Jinja chat template in an immutable sandbox, with transformers' environment:
    trim_blocks, lstrip_blocks, loop controls, `{% generation %}` blocks (rendered as their body),
    `raise_exception`, `strftime_now`, a `tojson` that does not HTML-escape, a `dict` constructor and
    a `namespace` that refuses underscore names. The template sees `messages` (role/content dicts),
    `add_generation_prompt=True`, `tools=None`, `documents=None`, `bos_token`, `eos_token` and
    `special_tokens` (more names, e.g. unk_token/pad_token)."""

    def __init__(self, source: str, *, bos_token: str | None, eos_token: str | None,
                 special_tokens: dict[str, str] | None = None) -> None:
        """jinja2.TemplateSyntaxError for a template that does not parse."""
        self.source = source
        self._template = _environment().from_string(source)
        tokens = dict(special_tokens or {})
        tokens.update({k: v for k, v in (("bos_token", bos_token), ("eos_token", eos_token)) if v is not None})
        self._tokens = tokens

    def render(self, messages: Sequence[ChatMessage]) -> str:
        if not messages:
            raise ValueError("a chat needs at least one message")
        chat = [{"role": m.role, "content": m.content} for m in messages]
        try:
            return str(self._template.render(messages=chat, tools=None, documents=None,
                                             add_generation_prompt=True, **self._tokens))
        except _TemplateRefused as e:
            raise ValueError(f"the chat template refused the conversation: {e}") from e


class _TemplateRefused(jinja2.exceptions.TemplateError):
    """What `raise_exception(message)` raises (transformers raises a plain TemplateError)."""


def _raise_exception(message: str) -> None:
    raise _TemplateRefused(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Jinja's own tojson HTML-escapes (<, >, &, '): templates expect plain JSON.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _TemplateDict:
    """`dict(...)` inside templates, without exposing the dict type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """`namespace(...)` that refuses underscore-prefixed attributes (no reaching CPython internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # Jinja's Namespace signature trick
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot store underscore-prefixed attributes on a namespace: {name!r}")


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for training masks; rendering a
    prompt only needs its body."""

    tags = {"generation"}  # noqa: RUF012 -- jinja2.ext.Extension declares it a plain set attribute

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body).set_lineno(lineno)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now, dict=_TemplateDict(),
                       namespace=_TemplateNamespace)
    return env


def chat_template_from_pretrained_dir(directory: str | Path) -> JinjaChatTemplate:
    """A local HF checkpoint's template: chat_template.jinja, else tokenizer_config.json's
    `chat_template` (a string, or a list of named templates of which "default" is used), with the
    bos/eos tokens tokenizer_config.json names. ValueError when there is none."""
    root = Path(directory)
    config_file = root / "tokenizer_config.json"
    config = _json_object(config_file)
    jinja_file = root / "chat_template.jinja"
    source: object = jinja_file.read_text(encoding="utf-8") if jinja_file.is_file() else config.get("chat_template")
    if isinstance(source, list):
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        source = named.get("default")
    tokens = {name: _token_text(config.get(name)) for name in ("bos_token", "eos_token", "unk_token", "pad_token")}
    if isinstance(source, str):
        return JinjaChatTemplate(source, bos_token=tokens.pop("bos_token"), eos_token=tokens.pop("eos_token"),
                                 special_tokens={k: v for k, v in tokens.items() if v is not None})
    raise ValueError(f"no chat template in {root} (chat_template.jinja or tokenizer_config.json)")


def _json_object(file: Path) -> dict[str, Any]:
    """The JSON object in `file`, {} when there is no file; ValueError for anything else."""
    data = json.loads(file.read_text(encoding="utf-8")) if file.is_file() else {}
    if isinstance(data, dict):
        return data
    raise ValueError(f"{file} is not a JSON object")


def _token_text(token: object) -> str | None:
    if isinstance(token, dict):  # an AddedToken's serialized form
        token = token.get("content")
    return token if isinstance(token, str) else None


def chat_template_from_gguf(path: str | Path) -> JinjaChatTemplate:
    """A GGUF's `tokenizer.chat_template`, with the file's bos/eos (and unk/pad) tokens; ValueError
    when it has none."""
    meta = read_tokenizer_metadata(path)
    if meta.chat_template is None:
        raise ValueError(f"{path} has no chat template (tokenizer.chat_template)")

    def text(token_id: int | None) -> str | None:
        return meta.tokens[token_id] if token_id is not None and 0 <= token_id < len(meta.tokens) else None

    extra = {"unk_token": text(meta.unk_token_id), "pad_token": text(meta.pad_token_id)}
    return JinjaChatTemplate(meta.chat_template, bos_token=text(meta.bos_token_id), eos_token=text(meta.eos_token_id),
                             special_tokens={k: v for k, v in extra.items() if v is not None})
