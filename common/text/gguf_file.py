"""One parse of a GGUF file per process: GGUFReader reads every metadata field (~4 s for SmolLM2's
49k-token vocabulary), and the config, the weights and the tokenizer all read the same file."""

import functools
import os
from pathlib import Path

from gguf import GGUFReader


def open_gguf(path: str | Path) -> GGUFReader:
    """The parsed GGUF at `path`, cached per (path, size, mtime); ValueError when it is not one."""
    file = Path(path).resolve()
    if not file.is_file():
        raise ValueError(f"no GGUF file at {file}")
    stat = os.stat(file)
    return _open(str(file), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=2)
def _open(file: str, _size: int, _mtime_ns: int) -> GGUFReader:
    try:
        return GGUFReader(file)
    except (ValueError, OSError) as e:
        raise ValueError(f"{file} is not a readable GGUF file: {e}") from e
