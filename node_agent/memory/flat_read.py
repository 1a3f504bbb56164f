"""Reading many entries of a flat per-block list at once, for the pool's hot paths."""

from collections.abc import Sequence
from operator import itemgetter
from typing import Any


def read_many(values: list[Any], ids: Sequence[int]) -> tuple[Any, ...]:
    """``values[i]`` for each of `ids`, as a tuple.

    Two ids or more are read in one C call (itemgetter), several times cheaper per id than a Python
    loop or ``map(values.__getitem__, ids)``; the caller then counts or tests the tuple in C too.
    Negative ids index from the end, as with a list; an id past the end raises IndexError.
    """
    if len(ids) > 1:
        return itemgetter(*ids)(values)  # type: ignore[no-any-return]
    return tuple(values[i] for i in ids)
