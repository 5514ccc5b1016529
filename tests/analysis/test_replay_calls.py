"""Pipeline calls read from their names (analysis/pipeline/_replay_calls.py)."""

from __future__ import annotations

import pytest

from rankscope.analysis.pipeline._replay_calls import directions, links_from_names


@pytest.mark.parametrize(
    ("name", "sends", "receives"),
    [
        ("pp_recv_forward", set(), {"forward"}),
        ("send_backward", {"backward"}, set()),
        ("pp_send_forward_recv_backward", {"forward"}, {"backward"}),
        (
            "send_forward_backward_recv_forward_backward",
            {"forward", "backward"},
            {"forward", "backward"},
        ),
        ("P2P.Receive-Fwd", set(), {"forward"}),
    ],
)
def test_a_calls_name_says_which_way_it_sends_and_receives(
    name: str, sends: set[str], receives: set[str]
) -> None:
    assert directions(name) == (frozenset(sends), frozenset(receives))


@pytest.mark.parametrize("name", ["forward", "backward", "pp_send", "pp_recv", "optimizer", ""])
def test_a_name_with_no_direction_after_send_or_recv_is_no_call(name: str) -> None:
    assert directions(name) is None


def test_the_last_stages_forward_goes_round_to_stage_0_in_order() -> None:
    # Two stages, two chunks: stage 1 sends its first chunk's forward to stage 0's second.
    phases = ["forward", "send_forward", "recv_forward"]
    f, send, recv = 0, 1, 2
    stage0 = (f, send, f, send, recv, f, send, recv, f, send)
    stage1 = (recv, f, send, recv, f, send, recv, f, recv, f)
    links = links_from_names([stage0, stage1], phases)
    assert not isinstance(links, str) and links is not None
    # Stage 1's sends at 2 and 5 feed stage 0's recvs at 4 and 7, in order.
    assert links.recvs[0, 4] == ((1, 2),)
    assert links.recvs[0, 7] == ((1, 5),)
    assert links.recvs[1, 0] == ((0, 1),)
    assert links.recvs[1, 8] == ((0, 9),)


def test_calls_that_do_not_pair_say_which_stages_and_how_often() -> None:
    phases = ["forward", "send_forward", "recv_forward"]
    said = links_from_names([(0, 1, 0, 1), (2, 0)], phases)
    assert said == (
        "stage 0 sends the forward 2 times a step, and stage 1 receives it 1 times "
        "(by the calls' names)"
    )
    assert links_from_names([(0,), (0,)], phases) is None
