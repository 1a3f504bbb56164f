"""The one retry schedule (common/backoff.py): doubling from initial_s, capped at max_s."""

import pytest

from radixmesh.common.backoff import Backoff


def test_pauses_double_per_failure_up_to_the_cap() -> None:
    assert [Backoff(0.1, 0.5).pause(n) for n in range(1, 6)] == [0.1, 0.2, 0.4, 0.5, 0.5]


def test_a_failure_count_past_any_float_still_gives_the_cap() -> None:
    assert Backoff(0.1, 10.0).pause(10**6) == 10.0


@pytest.mark.parametrize(("initial_s", "max_s"), [(0.0, 1.0), (2.0, 1.0), (-1.0, 1.0)])
def test_backoff_refuses_pauses_out_of_order(initial_s: float, max_s: float) -> None:
    with pytest.raises(ValueError, match="initial_s"):
        Backoff(initial_s, max_s)
