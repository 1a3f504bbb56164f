"""A GGUF file's tokenizer metadata, and the `tokenizers.Tokenizer` it describes.

A GGUF carries no tokenizer.json: it stores the vocabulary, merges, token types and special ids under
llama.cpp's `tokenizer.ggml.*` keys. `build_tokenizer` rebuilds the same byte-level BPE that
transformers' GGUF converter (`transformers/integrations/gguf/gguf_tokenizer_mapping.py`) builds, so
ids match `AutoTokenizer.from_pretrained(dir, gguf_file=...)` exactly:

- vocabulary: the tokens in file order; a token written outside the GPT-2 byte alphabet is respelled
  as the alphabet letters of its UTF-8 bytes;
- BPE with the file's merges, no continuing-subword prefix or end-of-word suffix, no unk fusing;
- pre-tokenizer: GPT-2's ByteLevel (its own regex) unless `tokenizer.ggml.pre` names a split that
  transformers overrides (Llama-3, Qwen2 families); decoder: ByteLevel;
- CONTROL tokens (type 3) spelled in the byte alphabet become special added tokens (matched whole,
  dropped by decode); USER_DEFINED tokens (type 4) become plain added tokens.
"""

import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

from radixmesh.common.text.gguf_file import open_gguf

CONTROL = 3
USER_DEFINED = 4

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# `tokenizer.ggml.pre` -> the split regex run before ByteLevel; None keeps GPT-2's own regex.
# Names outside this table are refused rather than silently tokenized the GPT-2 way.
PRE_TOKENIZER_SPLITS: dict[str, str | None] = {
    "default": None,
    "gpt2": None,
    "smollm": None,  # transformers' converter has no override for it: GPT-2's regex
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
}


@dataclass(frozen=True, slots=True)
class GGUFTokenizerMetadata:
    """The `tokenizer.*` keys of one GGUF file."""

    model: str
    """`tokenizer.ggml.model`: "gpt2" is byte-level BPE, the only kind built here."""
    pre: str | None
    tokens: tuple[str, ...]
    token_types: tuple[int, ...]
    merges: tuple[str, ...]
    bos_token_id: int | None
    eos_token_id: int | None
    unk_token_id: int | None
    pad_token_id: int | None
    add_bos_token: bool
    chat_template: str | None
    """`tokenizer.chat_template`: Jinja source, or None when the file has none."""


def read_tokenizer_metadata(path: str | Path) -> GGUFTokenizerMetadata:
    """The tokenizer metadata of the GGUF at `path`; ValueError when it is not a readable GGUF.

    Cached per (path, size, mtime): decoding 49k vocabulary strings takes a while, and the tokenizer
    and the chat template read the same metadata."""
    file = Path(path).resolve()
    if not file.is_file():
        raise ValueError(f"no GGUF file at {file}")
    stat = os.stat(file)
    return _read(str(file), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _read(file: str, _size: int, _mtime_ns: int) -> GGUFTokenizerMetadata:
    reader = open_gguf(file)

    def value(key: str) -> object:
        field = reader.get_field(key)
        return None if field is None else field.contents()

    def strings(key: str) -> tuple[str, ...]:
        field = reader.get_field(key)
        # One decode per element straight from the parts: field.contents() does the same, slower.
        return () if field is None else tuple(bytes(field.parts[i]).decode("utf-8") for i in field.data)

    model = value("tokenizer.ggml.model")
    if model is None:
        raise ValueError(f"{file} has no tokenizer (no tokenizer.ggml.model)")
    types = value("tokenizer.ggml.token_type")
    ids = {name: value(f"tokenizer.ggml.{name}_token_id") for name in ("bos", "eos", "unknown", "padding")}
    pre, template = value("tokenizer.ggml.pre"), value("tokenizer.chat_template")
    return GGUFTokenizerMetadata(
        model=str(model),
        pre=pre if isinstance(pre, str) else None,
        tokens=strings("tokenizer.ggml.tokens"),
        token_types=tuple(int(t) for t in types) if isinstance(types, list) else (),
        merges=strings("tokenizer.ggml.merges"),
        bos_token_id=_id(ids["bos"]),
        eos_token_id=_id(ids["eos"]),
        unk_token_id=_id(ids["unknown"]),
        pad_token_id=_id(ids["padding"]),
        add_bos_token=bool(value("tokenizer.ggml.add_bos_token")),
        chat_template=template if isinstance(template, str) else None,
    )


def _id(value: object) -> int | None:
    return int(value) if isinstance(value, int) else None


@functools.cache
def byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character table (the one `convert_slow_tokenizer.bytes_to_unicode` has)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def build_tokenizer(meta: GGUFTokenizerMetadata) -> Tokenizer:
    """The byte-level BPE tokenizer `meta` describes; ValueError for other tokenizer models."""
    if meta.model != "gpt2":
        raise ValueError(f"only GPT-2-style byte-level BPE GGUF tokenizers (tokenizer.ggml.model 'gpt2') "
                         f"are supported, this file has {meta.model!r}")
    if meta.pre is not None and meta.pre not in PRE_TOKENIZER_SPLITS:
        raise ValueError(f"unsupported GGUF pre-tokenizer {meta.pre!r}; supported: "
                         f"{', '.join(sorted(PRE_TOKENIZER_SPLITS))}")
    if not meta.merges:
        raise ValueError("the GGUF's byte-level BPE tokenizer has no merges (tokenizer.ggml.merges)")
    spelling = byte_alphabet()
    alphabet = set(spelling.values())
    vocab = {_spell(t, alphabet, spelling): i for i, t in enumerate(meta.tokens)}
    merges = [_merge_pair(m) for m in meta.merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, dropout=None, continuing_subword_prefix="",
                               end_of_word_suffix="", fuse_unk=False))
    split = PRE_TOKENIZER_SPLITS.get(meta.pre or "default")
    if split is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    tok.decoder = decoders.ByteLevel()
    _add_special(tok, meta.tokens, meta.token_types, alphabet)
    return tok


def _spell(token: str, alphabet: set[str], spelling: dict[int, str]) -> str:
    return token if set(token) <= alphabet else "".join(spelling[b] for b in token.encode("utf-8"))


def _merge_pair(merge: str) -> tuple[str, str]:
    left, sep, right = merge.partition(" ")
    if not sep:
        raise ValueError(f"malformed GGUF merge {merge!r}: expected two tokens separated by a space")
    return left, right


def _add_special(tok: Tokenizer, tokens: Sequence[str], types: Sequence[int], alphabet: set[str]) -> None:
    # A control token written outside the byte alphabet is a llama.cpp mislabel; transformers skips
    # it (adding it would grow the vocabulary past the model's), and so do we.
    control = [AddedToken(t, normalized=False, special=True)
               for t, kind in zip(tokens, types, strict=False) if kind == CONTROL and set(t) <= alphabet]
    if control:
        tok.add_special_tokens(control)
    vocab = tok.get_vocab(with_added_tokens=True)
    user = [AddedToken(t, normalized=False, special=False)
            for t, kind in zip(tokens, types, strict=False) if kind == USER_DEFINED and t in vocab]
    if user:
        tok.add_tokens(user)
