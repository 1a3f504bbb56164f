"""The chat template: how /v1/chat/completions turns messages into one prompt.

Each message renders on its own, independent of what follows it::

    <|role|>\\n{content}<|end|>\\n            e.g. <|user|>\\nHi<|end|>\\n

and the prompt is the messages in order followed by the generation header ``<|assistant|>\\n``.
Because a message's text never depends on later ones and the header is the start of the rendered
assistant reply, the prompt of turn k is a prefix of the prompt of turn k+1 whenever the client sends
the reply back unchanged: a conversation's history is a growing shared prefix, which is exactly
what the prefix cache reuses. Tenants that share a system prompt share its leading blocks too.
"""

from collections.abc import Sequence
from dataclasses import dataclass

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


def render_message(message: ChatMessage) -> str:
    return f"<|{message.role}|>\n{message.content}{END}"


def render_prompt(messages: Sequence[ChatMessage]) -> str:
    """The prompt for the assistant's next reply; ValueError for an empty conversation."""
    if not messages:
        raise ValueError("a chat needs at least one message")
    return "".join(render_message(m) for m in messages) + GENERATION_HEADER
