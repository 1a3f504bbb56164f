"""StopStrings: the reply ends before the first stop string, even one that straddles pieces."""

from radixmesh.cluster.router.stop_strings import StopCheck, StopStrings


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
