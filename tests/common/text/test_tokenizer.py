"""Tokenizers: the byte tokenizer, HF tokenizers from a checkpoint directory or a GGUF file, and
streaming detokenization. The SmolLM2 tests pin our GGUF tokenizer to transformers' own."""

import json
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from tokenizers import Tokenizer as TokenizersImpl
from tokenizers import models, pre_tokenizers

from radixmesh.common.text.tokenizer import ByteTokenizer, HFTokenizer, TextStream, load_tokenizer
from radixmesh.node_agent.model.source import smollm2_file
from tests.support.gguf_vocab import write_gguf

TEXTS = [
    "Hello, world!",
    "  leading, trailing   and multiple spaces  ",
    "digits 1234567890, 3.14159 and -42",
    "naïve café, déjà vu — Ünïcödé",
    "日本語のテキスト、中文文本",
    "emoji 😀🎉 and a family 👨‍👩‍👧 done",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "tabs\tand\nnewlines\r\n\n\nend",
    "don't, I'll, we're, they've",
    "<|endoftext|><repo_name>x<empty_output>",
    "a<|im_end|>b <|im_start| not quite special",
    "code: def f(x):\n    return x ** 2  # square",
    "Ω≈ç√∫˜µ≤≥÷ \u00a0nbsp",
    "",
    " ",
]


def streamed(stream: TextStream, token_ids: Sequence[int]) -> list[str]:
    """Each id pushed alone, then the final flush."""
    return [stream.push([t]) for t in token_ids] + [stream.flush()]


# --- byte tokenizer --------------------------------------------------------------------------------
def test_byte_tokenizer_round_trips_and_drops_bos_eos() -> None:
    tok = ByteTokenizer()
    ids = tok.encode("héllo ✓")
    assert ids == list("héllo ✓".encode()) and tok.decode([256, *ids, 257]) == "héllo ✓"
    assert (tok.bos_token_id, tok.eos_token_id, tok.stop_token_ids) == (256, 257, (257,))
    with pytest.raises(ValueError, match="outside the byte vocabulary"):
        tok.decode([300])


def test_byte_stream_holds_back_a_cut_character() -> None:
    ids = ByteTokenizer().encode("a€b")  # € is 3 bytes: e2 82 ac
    assert streamed(ByteTokenizer().stream(), ids) == ["a", "", "", "€", "b", ""]


def test_byte_stream_flush_emits_a_cut_character_as_replacement() -> None:
    tok = ByteTokenizer()
    ids = tok.encode("a€")[:-1]
    assert streamed(tok.stream(), ids) == ["a", "", "", "\ufffd"]
    assert "".join(streamed(tok.stream(), ids)) == tok.decode(ids)


def test_byte_stream_refuses_ids_outside_the_vocabulary() -> None:
    with pytest.raises(ValueError, match="outside the byte vocabulary"):
        ByteTokenizer().stream().push([1000])


# --- HF tokenizer from a checkpoint directory ------------------------------------------------------
def word_level_dir(tmp_path: Path, config: dict[str, object], generation: dict[str, object] | None) -> Path:
    vocab = {"[UNK]": 0, "<s>": 1, "</s>": 2, "<eot>": 3, "hello": 4, "world": 5}
    tok = TokenizersImpl(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    if generation is not None:
        (tmp_path / "generation_config.json").write_text(json.dumps(generation))
    return tmp_path


def test_pretrained_dir_reads_bos_eos_and_every_generation_eos(tmp_path: Path) -> None:
    root = word_level_dir(tmp_path, {"bos_token": {"content": "<s>"}, "eos_token": "</s>", "add_bos_token": True},
                          {"eos_token_id": [2, 3]})
    tok = HFTokenizer.from_pretrained_dir(root)
    assert (tok.bos_token_id, tok.eos_token_id, tok.stop_token_ids, tok.add_bos_token) == (1, 2, (2, 3), True)
    assert tok.encode("hello world") == [4, 5] and tok.vocab_size == 6


def test_pretrained_dir_takes_eos_from_generation_config_when_the_tokenizer_names_none(tmp_path: Path) -> None:
    tok = HFTokenizer.from_pretrained_dir(word_level_dir(tmp_path, {}, {"eos_token_id": 3, "bos_token_id": 1}))
    assert (tok.bos_token_id, tok.eos_token_id, tok.stop_token_ids, tok.add_bos_token) == (1, 3, (3,), False)


def test_pretrained_dir_refuses_an_unknown_eos_token(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'<eos>' is not in"):
        HFTokenizer.from_pretrained_dir(word_level_dir(tmp_path, {"eos_token": "<eos>"}, None))
    with pytest.raises(ValueError, match="no tokenizer.json"):
        HFTokenizer.from_pretrained_dir(tmp_path / "missing")


# --- HF tokenizer from a (tiny, written here) GGUF -------------------------------------------------
def test_gguf_tokenizer_builds_byte_level_bpe_with_special_tokens(tmp_path: Path) -> None:
    tok = HFTokenizer.from_gguf(write_gguf(tmp_path / "tiny.gguf"))
    start, end, think = 261, 262, 263
    assert (tok.bos_token_id, tok.eos_token_id, tok.stop_token_ids) == (start, end, (end,))
    ids = tok.encode("<|im_start|>hello w<think><|im_end|>")
    assert ids == [start, 259, 260, think, end]  # hello, Ġw: 256 letters then he, hel, hell, hello, Ġw
    assert tok.decode(ids) == "hello w<think>"  # control tokens dropped, user-defined kept
    assert tok.encode("<ctrl ✓>") != [264]  # mislabelled control token outside the alphabet: not added


def test_gguf_tokenizer_refuses_other_models_and_unknown_pre_tokenizers(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="only GPT-2-style byte-level BPE.*'llama'"):
        HFTokenizer.from_gguf(write_gguf(tmp_path / "spm.gguf", model="llama"))
    with pytest.raises(ValueError, match="unsupported GGUF pre-tokenizer 'mystery'"):
        HFTokenizer.from_gguf(write_gguf(tmp_path / "pre.gguf", pre="mystery"))
    with pytest.raises(ValueError, match="no GGUF file"):
        HFTokenizer.from_gguf(tmp_path / "missing.gguf")


def test_load_tokenizer_picks_by_path(tmp_path: Path) -> None:
    assert isinstance(load_tokenizer(), ByteTokenizer)
    assert isinstance(load_tokenizer(write_gguf(tmp_path / "tiny.gguf")), HFTokenizer)


# --- SmolLM2: ours against transformers' ----------------------------------------------------------
@pytest.fixture(scope="module")
def smollm2() -> HFTokenizer:
    return HFTokenizer.from_gguf(smollm2_file())


@pytest.fixture(scope="module")
def reference():  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    file = smollm2_file()
    return AutoTokenizer.from_pretrained(str(file.parent), gguf_file=file.name, local_files_only=True)


@pytest.mark.slow
def test_smollm2_ids_and_stop_tokens(smollm2: HFTokenizer) -> None:
    assert (smollm2.bos_token_id, smollm2.eos_token_id, smollm2.stop_token_ids) == (1, 2, (2,))
    assert smollm2.vocab_size == 49152 and not smollm2.add_bos_token
    assert smollm2.encode("<|im_start|>user") == [1, 4093]


@pytest.mark.slow
@pytest.mark.parametrize("text", TEXTS)
def test_smollm2_encode_and_decode_match_transformers(smollm2: HFTokenizer, reference, text: str) -> None:  # type: ignore[no-untyped-def]
    ids = smollm2.encode(text)
    assert ids == reference.encode(text, add_special_tokens=False)
    assert smollm2.decode(ids) == reference.decode(ids, skip_special_tokens=True)


@pytest.mark.slow
def test_smollm2_decodes_any_ids_like_transformers(smollm2: HFTokenizer, reference) -> None:  # type: ignore[no-untyped-def]
    ids = [*range(40), *range(200, 300, 3), *range(49100, 49152)]
    assert smollm2.decode(ids) == reference.decode(ids, skip_special_tokens=True)


@pytest.mark.slow
@pytest.mark.parametrize("text", ["naïve café 😀🎉👨‍👩‍👧 日本語", "<|im_start|>Ω≈ç√<|im_end|>"])
def test_smollm2_stream_equals_full_decode(smollm2: HFTokenizer, text: str) -> None:
    ids = smollm2.encode(text)
    assert "".join(streamed(smollm2.stream(), ids)) == smollm2.decode(ids)
    stream = smollm2.stream()
    assert stream.push(ids[:5]) + stream.push(ids[5:]) + stream.flush() == smollm2.decode(ids)


@pytest.mark.slow
def test_smollm2_stream_holds_back_then_flushes_a_cut_character(smollm2: HFTokenizer) -> None:
    ids = smollm2.encode("😀")  # 4 UTF-8 bytes over several byte-level tokens
    assert len(ids) > 1
    pieces = streamed(smollm2.stream(), ids[:-1])
    assert pieces[:-1] == [""] * (len(ids) - 1) and pieces[-1] == smollm2.decode(ids[:-1])
    assert "\ufffd" in pieces[-1]


def test_encoding_a_long_text_lets_other_threads_run(tmp_path: Path) -> None:
    """Issue 38 item 13: HF `encode` held the GIL throughout, so tokenizing in a worker thread still
    stalled the router's event loop for seconds. Another thread must keep running meanwhile."""
    tok = HFTokenizer.from_pretrained_dir(word_level_dir(tmp_path, {}, None))
    text = "hello world " * 150_000
    ticks, running = [0], [True]

    def tick() -> None:
        while running[0]:
            time.sleep(0.001)  # yields the GIL; counts how often this thread got it back
            ticks[0] += 1

    ticker = threading.Thread(target=tick)
    ticker.start()
    try:
        before = ticks[0]
        t0 = time.perf_counter()
        ids = tok.encode(text)
        elapsed = time.perf_counter() - t0
        during = ticks[0] - before
    finally:
        running[0] = False
        ticker.join()
    assert ids[:2] == [4, 5] and len(ids) == 300_000
    # Holding the GIL, the ticker gets at most a tick or two in; released, about one a millisecond.
    assert during >= max(10, elapsed * 1000 / 20), (during, elapsed)
