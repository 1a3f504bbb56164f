"""Tokenizers: byte-level for the tiny model (works offline, any text), or a real model's own
Hugging Face tokenizer, from a local checkpoint directory or from a GGUF file.

Every tokenizer also makes `TextStream`s: token ids in, only the new text out, for streaming replies.
"""

import codecs
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from tokenizers import Tokenizer as TokenizersImpl
from tokenizers.decoders import DecodeStream

from radixmesh.common.text.gguf_tokenizer import build_tokenizer, read_tokenizer_metadata

BYTE_VOCAB_SIZE = 258
"""256 byte values, then BOS (256) and EOS (257): the byte tokenizer's vocabulary."""

logger = logging.getLogger(__name__)


class TextStream(Protocol):
    """Incremental detokenization of one reply. `push` returns only the text the new ids complete;
    an id that ends mid-character is held back until later ids (or `flush`) complete it. The
    concatenation of every `push` and the final `flush` equals `decode` of all ids."""

    def push(self, token_ids: Sequence[int]) -> str: ...
    def flush(self) -> str:
        """The held-back text (U+FFFD for a cut character); the stream is finished afterwards."""
        ...


class Tokenizer(Protocol):
    """Text <-> token ids. `encode` never adds special tokens; callers add BOS when they want it.
    `decode` drops special tokens. `stop_token_ids` holds every id that ends a reply (all EOS ids)."""

    @property
    def vocab_size(self) -> int: ...
    @property
    def eos_token_id(self) -> int | None: ...
    @property
    def stop_token_ids(self) -> tuple[int, ...]: ...
    def encode(self, text: str) -> list[int]: ...
    def decode(self, token_ids: Sequence[int]) -> str: ...
    def stream(self) -> TextStream: ...


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255; 256 is BOS, 257 is EOS (dropped by decode)."""

    bos_token_id = 256

    @property
    def vocab_size(self) -> int:
        return BYTE_VOCAB_SIZE

    @property
    def eos_token_id(self) -> int | None:
        return 257

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        return (257,)

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, token_ids: Sequence[int]) -> str:
        """Invalid UTF-8 (a sequence cut mid-character) decodes to U+FFFD instead of raising."""
        return _bytes_of(token_ids).decode("utf-8", errors="replace")

    def stream(self) -> "ByteTextStream":
        return ByteTextStream()


def _bytes_of(token_ids: Sequence[int]) -> bytes:
    for t in token_ids:
        if not 0 <= t < BYTE_VOCAB_SIZE:
            raise ValueError(f"token id {t} is outside the byte vocabulary [0, {BYTE_VOCAB_SIZE})")
    return bytes(t for t in token_ids if t < 256)


class ByteTextStream:
    """ByteTokenizer's TextStream: an incremental UTF-8 decoder holds back a cut character."""

    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_ids: Sequence[int]) -> str:
        return str(self._utf8.decode(_bytes_of(token_ids)))

    def flush(self) -> str:
        return str(self._utf8.decode(b"", final=True))


class HFTextStream:
    """HFTokenizer's TextStream on `tokenizers.decoders.DecodeStream` (special tokens skipped)."""

    def __init__(self, tokenizer: TokenizersImpl) -> None:
        self._tok = tokenizer
        self._stream = DecodeStream(skip_special_tokens=True)
        self._ids: list[int] = []
        self._sent: list[str] = []

    def push(self, token_ids: Sequence[int]) -> str:
        pieces = []
        for t in token_ids:
            self._ids.append(t)
            piece = self._stream.step(self._tok, t)
            if piece is not None:
                pieces.append(piece)
        text = "".join(pieces)
        self._sent.append(text)
        return text

    def flush(self) -> str:
        # DecodeStream keeps a cut character to itself; the full decode renders it as U+FFFD.
        full = str(self._tok.decode(self._ids, skip_special_tokens=True))
        sent = "".join(self._sent)
        return full[len(sent):] if full.startswith(sent) else ""


class HFTokenizer:
    """A Hugging Face tokenizer (`tokenizers.Tokenizer`) with the ids a server needs.

    `add_bos_token` records whether the model's own tokenizer prepends BOS (informational: `encode`
    never adds special tokens)."""

    def __init__(self, tokenizer: TokenizersImpl, *, bos_token_id: int | None = None,
                 eos_token_id: int | None = None, stop_token_ids: Sequence[int] = (),
                 add_bos_token: bool = False) -> None:
        """`stop_token_ids` are extra EOS ids (generation_config.json may list several); the
        `eos_token_id` is always one of them."""
        size = tokenizer.get_vocab_size(with_added_tokens=True)
        for name, t in (("bos_token_id", bos_token_id), ("eos_token_id", eos_token_id),
                        *(("stop_token_ids", s) for s in stop_token_ids)):
            if t is not None and not 0 <= t < size:
                raise ValueError(f"{name} {t} is outside the vocabulary [0, {size})")
        self._tok = tokenizer
        self.bos_token_id = bos_token_id
        self._eos = eos_token_id
        first = () if eos_token_id is None else (eos_token_id,)
        self._stops = tuple(dict.fromkeys((*first, *stop_token_ids)))
        self.add_bos_token = add_bos_token

    @classmethod
    def from_pretrained_dir(cls, directory: str | Path, *, eos_token: str | None = None) -> "HFTokenizer":
        """A local HF checkpoint's tokenizer: tokenizer.json, plus tokenizer_config.json (bos/eos
        tokens, add_bos_token) and generation_config.json (eos_token_id, int or list) when present.
        `eos_token` overrides the EOS token by name. ValueError when a file is missing or a named
        token is not in the vocabulary."""
        root = Path(directory)
        file = root / "tokenizer.json" if root.is_dir() else root
        if not file.is_file():
            raise ValueError(f"no tokenizer.json at {file}")
        root = file.parent
        tok = TokenizersImpl.from_file(str(file))
        config = _json(root / "tokenizer_config.json")
        generation = _json(root / "generation_config.json")

        def token_id(name: str, token: object) -> int | None:
            if isinstance(token, dict):  # {"content": "<s>", ...}, an AddedToken's serialized form
                token = token.get("content")
            if not isinstance(token, str):
                return None
            found = tok.token_to_id(token)
            if found is None:
                raise ValueError(f"{name} {token!r} is not in {file}")
            return int(found)

        gen_eos = generation.get("eos_token_id")
        gen_eos_ids = [int(i) for i in (gen_eos if isinstance(gen_eos, list) else [gen_eos]) if isinstance(i, int)]
        eos = token_id("eos token", eos_token if eos_token is not None else config.get("eos_token"))
        if eos is None and gen_eos_ids:
            eos = gen_eos_ids[0]
        bos = token_id("bos token", config.get("bos_token"))
        if bos is None and isinstance(generation.get("bos_token_id"), int):
            bos = int(generation["bos_token_id"])
        return cls(tok, bos_token_id=bos, eos_token_id=eos, stop_token_ids=gen_eos_ids,
                   add_bos_token=bool(config.get("add_bos_token", False)))

    @classmethod
    def from_gguf(cls, path: str | Path) -> "HFTokenizer":
        """The tokenizer a GGUF file describes (byte-level BPE only; see gguf_tokenizer), with its
        bos/eos ids; ValueError for other tokenizer models."""
        meta = read_tokenizer_metadata(path)
        return cls(build_tokenizer(meta), bos_token_id=meta.bos_token_id, eos_token_id=meta.eos_token_id,
                   add_bos_token=meta.add_bos_token)

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    @property
    def eos_token_id(self) -> int | None:
        return self._eos

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        return self._stops

    def encode(self, text: str) -> list[int]:
        # encode_batch, not encode: only the batch calls release the GIL, and the router tokenizes in
        # a worker thread so that its event loop serves meanwhile (issue 38: encode of 4 MiB held the
        # GIL, and so the loop, for 10 s).
        return list(self._tok.encode_batch([text], add_special_tokens=False)[0].ids)

    def decode(self, token_ids: Sequence[int]) -> str:
        return str(self._tok.decode_batch([list(token_ids)], skip_special_tokens=True)[0])

    def stream(self) -> HFTextStream:
        return HFTextStream(self._tok)


def _json(file: Path) -> dict[str, Any]:
    """The JSON object in `file`, {} when there is no file; ValueError for anything else."""
    data = json.loads(file.read_text(encoding="utf-8")) if file.is_file() else {}
    if isinstance(data, dict):
        return data
    raise ValueError(f"{file} is not a JSON object")


def load_tokenizer(path: str | Path | None = None, eos_token: str | None = None) -> Tokenizer:
    """The byte tokenizer when `path` is None, a GGUF's tokenizer for a `.gguf` file, else the local
    HF tokenizer at `path` (a directory or its tokenizer.json)."""
    if path is None:
        return ByteTokenizer()
    logger.info("loading tokenizer from %s", path)
    if Path(path).suffix == ".gguf":
        if eos_token is not None:
            raise ValueError("eos_token cannot be overridden for a GGUF tokenizer")
        return HFTokenizer.from_gguf(path)
    return HFTokenizer.from_pretrained_dir(path, eos_token=eos_token)
