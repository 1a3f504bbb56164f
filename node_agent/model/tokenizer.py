"""Tokenizers: byte-level by default (works offline, any text), or a local HF `tokenizer.json`."""

import logging
from pathlib import Path
from typing import Protocol

from tokenizers import Tokenizer as HFTokenizerImpl

from radixmesh.node_agent.model.config import BYTE_VOCAB_SIZE

logger = logging.getLogger(__name__)


class Tokenizer(Protocol):
    """Text <-> token ids. `encode` never adds special tokens; callers add BOS when they want it."""

    @property
    def vocab_size(self) -> int: ...
    @property
    def eos_token_id(self) -> int | None: ...
    def encode(self, text: str) -> list[int]: ...
    def decode(self, token_ids: list[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255; 256 is BOS, 257 is EOS (dropped by decode)."""

    bos_token_id = 256

    @property
    def vocab_size(self) -> int:
        return BYTE_VOCAB_SIZE

    @property
    def eos_token_id(self) -> int | None:
        return 257

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, token_ids: list[int]) -> str:
        """Invalid UTF-8 (a sequence cut mid-character) decodes to U+FFFD instead of raising."""
        for t in token_ids:
            if not 0 <= t < BYTE_VOCAB_SIZE:
                raise ValueError(f"token id {t} is outside the byte vocabulary [0, {BYTE_VOCAB_SIZE})")
        return bytes(t for t in token_ids if t < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    """A Hugging Face `tokenizer.json` loaded from local disk with the `tokenizers` package."""

    def __init__(self, path: str | Path, eos_token: str | None = None) -> None:
        """`path` is the tokenizer.json file or its directory; `eos_token` names the stop token."""
        file = Path(path)
        if file.is_dir():
            file = file / "tokenizer.json"
        if not file.is_file():
            raise ValueError(f"no tokenizer.json at {file}")
        self._tok = HFTokenizerImpl.from_file(str(file))
        self._eos = self._tok.token_to_id(eos_token) if eos_token is not None else None
        if eos_token is not None and self._eos is None:
            raise ValueError(f"eos token {eos_token!r} is not in {file}")

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    @property
    def eos_token_id(self) -> int | None:
        return self._eos

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, token_ids: list[int]) -> str:
        return str(self._tok.decode(token_ids, skip_special_tokens=True))


def load_tokenizer(path: str | Path | None = None, eos_token: str | None = None) -> Tokenizer:
    """The byte tokenizer when `path` is None, else the local HF tokenizer at `path`."""
    if path is None:
        return ByteTokenizer()
    logger.info("loading tokenizer from %s", path)
    return HFTokenizer(path, eos_token)
