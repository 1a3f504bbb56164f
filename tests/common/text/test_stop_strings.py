"""Stop strings: the reply ends before the first one, even one that straddles pieces, and the engine
ends the request on the token that completes it."""

import pytest

from radixmesh.common.text.stop_strings import StopCheck, StopStrings
from radixmesh.common.text.tokenizer import ByteTokenizer
from radixmesh.node_agent.engine.config import EngineConfig
from radixmesh.node_agent.engine.engine import Engine
from radixmesh.node_agent.engine.request import Request, RequestId
from radixmesh.proto.serve.limits import InvalidRequest
from radixmesh.proto.serve.sampling import MAX_STOP_CHARS, MAX_STOP_STRINGS, FinishReason, SamplingParams
from tests.support.tiny_model import tiny_model


def test_a_stop_string_split_over_pieces_is_held_back_then_cut() -> None:
    stops = StopStrings(("\nEND",))
    assert stops.push("answer 42\nE") == StopCheck("answer 42", False)
    assert stops.push("N") == StopCheck("", False)
    assert stops.push("D and more") == StopCheck("", True)
    assert stops.push("later") == StopCheck("", True) and stops.flush() == ""


def test_a_false_start_is_released_when_it_cannot_begin_a_stop() -> None:
    stops = StopStrings(("abc",))
    assert stops.push("xab") == StopCheck("x", False)
    assert stops.push("x") == StopCheck("abx", False)
    assert stops.push("a") == StopCheck("", False) and stops.flush() == "a"


def test_the_earliest_of_several_stops_wins() -> None:
    assert StopStrings(("zz", "b")).push("abczz") == StopCheck("a", True)


def test_the_engine_ends_a_request_on_the_token_that_completes_a_stop_string() -> None:
    tokenizer = ByteTokenizer()
    model = tiny_model(seed=3)
    prompt = tuple(tokenizer.encode("The stop string test: "))
    engine = Engine(model, EngineConfig(block_size=4), tokenizer=tokenizer)
    [free] = engine.generate([Request(RequestId("free"), prompt, SamplingParams(max_tokens=24, ignore_eos=True))])
    text = tokenizer.decode(list(free.output_token_ids))
    ids = free.output_token_ids

    def tokens_to(stop: str) -> int:
        return next(n for n in range(1, len(ids) + 1) if stop in tokenizer.decode(list(ids[:n])))

    # A stop string from the reply itself (one character that first shows up after some tokens, with
    # more tokens after it), so the stopped request must end early.
    stop = next(c for c in text if c != "\ufffd" and 1 < tokens_to(c) < len(ids))
    upto = tokens_to(stop)
    params = SamplingParams(max_tokens=24, ignore_eos=True, stop=("\x00never", stop))
    [out] = engine.generate([Request(RequestId("stopped"), prompt, params)])
    assert (out.output_token_ids, out.finish_reason) == (free.output_token_ids[:upto], FinishReason.STOP)
    engine.check_invariants()


def test_stop_strings_without_a_tokenizer_are_refused_and_bounded() -> None:
    engine = Engine(tiny_model(seed=3), EngineConfig(block_size=4))
    with pytest.raises(InvalidRequest, match="tokenizer"):
        engine.submit(Request(RequestId("r"), (5, 6, 7), SamplingParams(stop=("x",))))
    assert not engine.has_work
    for stop in (("",), ("x" * (MAX_STOP_CHARS + 1),), ("a",) * (MAX_STOP_STRINGS + 1)):
        with pytest.raises(ValueError, match="stop"):
            SamplingParams(stop=stop)
