"""OpenAI's `stop` strings on streamed text: the reply ends where the first stop string begins.

The router sees the reply as detokenized pieces. A stop string may straddle pieces, so the tail of
the text that could still be the start of one is held back until later text decides it:

    text so far   "... the answer is 42\\nEN"      stop = ("\\nEND",)
    released      "... the answer is 42"           held: "\\nEN" (a prefix of "\\nEND")

No stop string can begin inside released text: when it was released, the part of it a stop string
would start in was not a prefix of any stop string.

The router runs StopStrings on the pieces it streams; the engine runs StopText on each token it
samples, so it ends a request on the token that completes a stop string (as vLLM's output processor
does) and reports it like any other finished one, with its usage and cache statistics.
"""

from dataclasses import dataclass
from typing import NamedTuple

from radixmesh.common.text.tokenizer import TextStream, Tokenizer


class StopCheck(NamedTuple):
    text: str
    """Text now safe to send."""
    stopped: bool
    """A stop string was found: `text` ends right before it and nothing follows."""


class StopStrings:
    """Finds the first of `stops` (non-empty strings) in text pushed piece by piece."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        assert all(stops), "stop strings are non-empty"
        self._stops = stops
        self._held = ""
        self._stopped = False

    def push(self, piece: str) -> StopCheck:
        """Text `piece` appended to the reply; what may be sent now. Nothing after a stop."""
        if self._stopped:
            return StopCheck("", True)
        text = self._held + piece
        cut = min((i for i in (text.find(s) for s in self._stops) if i >= 0), default=-1)
        if cut >= 0:
            self._held, self._stopped = "", True
            return StopCheck(text[:cut], True)
        keep = max((k for s in self._stops for k in range(min(len(s) - 1, len(text)), 0, -1)
                    if text.endswith(s[:k])), default=0)
        self._held = text[len(text) - keep:]
        return StopCheck(text[: len(text) - keep], False)

    def flush(self) -> str:
        """The reply ended without a stop: the held-back text."""
        held, self._held = self._held, ""
        return "" if self._stopped else held


@dataclass(slots=True)
class StopText:
    """A request's output decoded as it is sampled, checked against its stop strings."""

    text: TextStream
    stops: StopStrings

    @classmethod
    def start(cls, tokenizer: Tokenizer, stops: tuple[str, ...]) -> "StopText":
        return cls(tokenizer.stream(), StopStrings(stops))

    def push(self, token: int) -> bool:
        """`token` was sampled; whether the output now contains a stop string."""
        return self.stops.push(self.text.push([token])).stopped
