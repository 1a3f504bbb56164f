"""A request's output decoded as it is sampled, so the engine ends it on the token that completes a
stop string (as vLLM's output processor does): the agent then reports the request like any other
finished one, with its usage and cache statistics, instead of being aborted by the router."""

from dataclasses import dataclass

from radixmesh.node_agent.model.tokenizer import TextStream, Tokenizer
from radixmesh.proto.serve.stop_strings import StopStrings


@dataclass(slots=True)
class StopText:
    text: TextStream
    stops: StopStrings

    @classmethod
    def start(cls, tokenizer: Tokenizer, stops: tuple[str, ...]) -> "StopText":
        return cls(tokenizer.stream(), StopStrings(stops))

    def push(self, token: int) -> bool:
        """`token` was sampled; whether the output now contains a stop string."""
        return self.stops.push(self.text.push([token])).stopped
