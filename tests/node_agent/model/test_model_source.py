"""`--model SPEC` resolution, weights identity, and where an agent's model runs."""

import json
from pathlib import Path

import pytest
import torch

from radixmesh.common.text.tokenizer import ByteTokenizer
from radixmesh.node_agent.engine.config import EngineConfig
from radixmesh.node_agent.engine.engine import Engine
from radixmesh.node_agent.engine.request import Request, RequestId
from radixmesh.node_agent.model.config import NAMED_CONFIGS, named_config
from radixmesh.node_agent.model.source import SMOLLM2, ModelSource, random_source, resolve_model
from radixmesh.node_agent.model.weights import random_model
from radixmesh.node_agent.placement import place_model
from radixmesh.proto.serve.sampling import FinishReason, SamplingParams
from tests.support.checkpoint import save_checkpoint

SMALL = named_config("tiny", hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
                     num_key_value_heads=1, max_position_embeddings=64)


def test_random_models_say_so_in_their_names_and_have_byte_tokenizers() -> None:
    source = resolve_model("random-tiny", seed=3)
    assert (source.name, source.weights, source.seed) == ("random-tiny", None, 3)  # the served name says random
    assert source.config == named_config("tiny")
    assert isinstance(source.tokenizer(), ByteTokenizer)
    assert source.identity() != resolve_model("random-tiny", seed=4).identity()  # other weights, other blocks


@pytest.mark.parametrize("shape", sorted(NAMED_CONFIGS))
def test_a_bare_shape_is_refused_naming_its_random_spec(shape: str) -> None:
    # issue 40: `llama3-8b` served noise under a real model's name; a random model now says so.
    with pytest.raises(ValueError, match=rf"{shape!r} is a shape, not a model: --model random-{shape} serves seeded "
                                         r"random weights"):
        resolve_model(shape)


def test_a_checkpoint_directory_is_named_and_identified_by_its_files(tmp_path: Path) -> None:
    save_checkpoint(random_model(SMALL, seed=1), tmp_path / "m1")
    save_checkpoint(random_model(SMALL, seed=2), tmp_path / "m2")
    one, two = resolve_model(str(tmp_path / "m1")), resolve_model(str(tmp_path / "m2"))
    assert one.name == "m1" and one.config == two.config == SMALL
    assert one.identity().startswith("hf-") and one.identity() != two.identity()
    assert one.identity() == resolve_model(str(tmp_path / "m1")).identity()
    loaded = one.load()
    assert torch.equal(loaded.model.embed_tokens.weight, random_model(SMALL, seed=1).model.embed_tokens.weight)


@pytest.mark.parametrize("spec", ["gpt-5", "/nonexistent/model", "weights.bin"])
def test_an_unknown_model_names_the_valid_ones(spec: str) -> None:
    with pytest.raises(ValueError, match=f"valid: .*{SMOLLM2}"):
        resolve_model(spec)


def test_a_hub_id_is_refused_with_what_to_do_instead() -> None:
    # vLLM and SGLang download `org/name`; radixmesh never does (issue 40): say how to get a directory.
    with pytest.raises(ValueError, match=r"looks like a Hugging Face hub id: radixmesh never downloads; fetch it "
                                         r"with `huggingface-cli download HuggingFaceTB/SmolLM2-135M-Instruct"):
        resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct")
    with pytest.raises(ValueError, match=r"random-tiny \(seeded random weights\)"):
        resolve_model("gpt-5")


def test_a_directory_without_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no config.json"):
        resolve_model(str(tmp_path))


def test_random_source_of_a_given_shape() -> None:
    source = random_source(SMALL, seed=7, name="small")
    assert source == ModelSource("small", SMALL, None, 7)


def test_the_cpu_runs_float32_by_default_and_bad_placements_are_refused() -> None:
    placed = place_model()
    if torch.cuda.is_available():
        assert (placed.device.type, placed.dtype) == ("cuda", torch.bfloat16)
    else:
        assert (placed.device.type, placed.dtype) == ("cpu", torch.float32)
        with pytest.raises(ValueError, match="sees no GPU"):
            place_model("cuda")
    assert place_model("cpu", "bfloat16").dtype == torch.bfloat16
    with pytest.raises(ValueError, match="dtype must be"):
        place_model("cpu", "int8")
    with pytest.raises(ValueError, match="device must be"):
        place_model("mps")


def test_every_eos_of_generation_config_ends_a_sequence(tmp_path: Path) -> None:
    model = random_model(SMALL, seed=1)
    save_checkpoint(model, tmp_path / "m")
    source = resolve_model(str(tmp_path / "m"))
    assert source.eos_token_ids() == ()
    prompt = tuple(range(3, 19))
    free = Engine(model, EngineConfig(block_size=4)).generate(
        [Request(RequestId("a"), prompt, SamplingParams(max_tokens=4, ignore_eos=True))])
    first = free[0].output_token_ids[0]
    generation = {"eos_token_id": [SMALL.eos_token_id, first]}
    (tmp_path / "m" / "generation_config.json").write_text(json.dumps(generation))
    assert source.eos_token_ids() == (SMALL.eos_token_id, first)
    engine = Engine(model, EngineConfig(block_size=4, eos_token_ids=source.eos_token_ids()))
    [out] = engine.generate([Request(RequestId("b"), prompt, SamplingParams(max_tokens=4))])
    assert (out.output_token_ids, out.finish_reason) == ((first,), FinishReason.STOP)
    [ignored] = engine.generate([Request(RequestId("c"), prompt, SamplingParams(max_tokens=4, ignore_eos=True))])
    assert ignored.output_token_ids == free[0].output_token_ids
