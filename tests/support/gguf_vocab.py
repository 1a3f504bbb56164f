"""A tiny GGUF holding only tokenizer metadata (and optionally a chat template), written by tests."""

from pathlib import Path

from gguf import GGUFWriter

from radixmesh.common.text.gguf_tokenizer import byte_alphabet


def write_gguf(path: Path, *, model: str = "gpt2", pre: str = "smollm", chat_template: str | None = None) -> Path:
    """A byte-level BPE vocabulary: 256 byte letters, merges for "he", "hel", "hello", "Ġw", two
    control tokens (<|im_start|> is BOS, <|im_end|> EOS), one user-defined token and one control
    token outside the byte alphabet."""
    letters = list(byte_alphabet().values())
    merges = ["h e", "he l", "hel l", "hell o", "Ġ w"]
    extra = ["he", "hel", "hell", "hello", "Ġw"]
    specials = ["<|im_start|>", "<|im_end|>", "<think>", "<ctrl ✓>"]
    tokens = [*letters, *extra, *specials]
    types = [1] * (len(letters) + len(extra)) + [3, 3, 4, 3]
    w = GGUFWriter(str(path), "llama")
    w.add_tokenizer_model(model)
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index("<|im_start|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    if chat_template is not None:
        w.add_chat_template(chat_template)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
