"""Tests for rankscope.config._ranks: rank specs (`parse_ranks`, `RankSet`) and `detect_rank_info`."""

from __future__ import annotations

import re
import socket
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from rankscope import ConfigError, RankInfo, detect_rank_info
from rankscope.config._ranks import RankSet, parse_ranks

FIELD = "trace.ranks"


@pytest.fixture(autouse=True)
def _no_torch_distributed(monkeypatch: pytest.MonkeyPatch) -> None:
    # Detection looks for an initialised torch.distributed in sys.modules; hide any that an
    # earlier test in the session imported so these tests see only the environ they pass.
    monkeypatch.delitem(sys.modules, "torch.distributed", raising=False)


# -- parse_ranks: accepted specs -------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "ranks"),
    [
        (0, {0}),
        (5, {5}),
        ("0", {0}),
        ("  3  ", {3}),
        ("0,8,16", {0, 8, 16}),
        (" 0 , 8 ,16 ", {0, 8, 16}),
        ("0-7", set(range(8))),
        ("3-3", {3}),
        ("0-7,16", {*range(8), 16}),
        ("16,0-3", {0, 1, 2, 3, 16}),
        ("0-1,4-5", {0, 1, 4, 5}),
        ([0, 8], {0, 8}),
        ((8, 0), {0, 8}),
        ([3], {3}),
        (["0-3", 8], {0, 1, 2, 3, 8}),
        (["2", "4"], {2, 4}),
    ],
)
def test_parse_explicit_ranks(spec: object, ranks: set[int]) -> None:
    parsed = parse_ranks(spec, FIELD)
    assert parsed == RankSet(everything=False, ranks=frozenset(ranks))
    assert not parsed.everything


@pytest.mark.parametrize("spec", ["all", "ALL", "All", "  all  ", ["all"], ("all",)])
def test_parse_all(spec: object) -> None:
    parsed = parse_ranks(spec, FIELD)
    assert parsed.everything
    assert parsed.spec() == "all"
    assert 0 in parsed
    assert 12345 in parsed


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        # "all" combined with explicit ranks
        ("all,0", "cannot be combined"),
        ("0,all", "cannot be combined"),
        (["all", 3], "cannot be combined"),
        ("all,all", "cannot be combined"),
        # duplicates, including overlapping ranges
        ("0,0", "rank 0 is given twice"),
        ([8, 8], "rank 8 is given twice"),
        ("0-7,5", "rank 5 is given twice"),
        ("0-3,2-5", "rank 2 is given twice"),
        (["0-3", 3], "rank 3 is given twice"),
        # negative ranks
        (-1, "rank -1 is negative"),
        ("-1", "negative"),
        ([0, -2], "rank -2 is negative"),
        ("-1-3", "negative"),
        # empty
        ("", "empty"),
        ("   ", "empty"),
        ([], "empty"),
        ((), "empty"),
        ("0,,8", "empty item"),
        ("0,", "empty item"),
        (",0", "empty item"),
        # garbage
        ("abc", "not a rank or a range"),
        ("0-", "not a rank or a range"),
        ("1.5", "not a rank or a range"),
        ("+1", "not a rank or a range"),
        ("0-7-9", "not a rank or a range"),
        ("0..7", "not a rank or a range"),
        ("7-0", "runs backwards"),
        (1.0, "not a rank spec"),
        (None, "not a rank spec"),
        ({0, 8}, "not a rank spec"),
        ({"ranks": 0}, "not a rank spec"),
        ([0, None], "None is not a rank"),
        ([0, 1.0], "1.0 is not a rank"),
        ([[0, 1]], "is not a rank"),
        # bools are ints to Python, never ranks here
        (True, "a bool is not a rank"),
        (False, "a bool is not a rank"),
        ([True], "True is not a rank"),
        ([0, False], "False is not a rank"),
    ],
)
def test_parse_rejects(spec: object, problem: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(FIELD)) as info:
        parse_ranks(spec, FIELD)
    err = info.value
    assert err.field == FIELD
    assert err.value == spec
    assert problem in str(err)
    assert "accepted:" in str(err)
    assert '"all"' in err.accepted


@pytest.mark.parametrize("field", ["trace.ranks", "RANKSCOPE_TRACE_RANKS", "ranks"])
def test_parse_error_names_the_given_field(field: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"{field}='0,0'")):
        parse_ranks("0,0", field)


def test_config_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=re.escape(FIELD)):
        parse_ranks("garbage", FIELD)


@pytest.mark.parametrize("spec", [b"0", b"0,1", bytearray(b"0")])
def test_parse_rejects_bytes(spec: object) -> None:
    # bytes are a Sequence of ints: b"0" must not silently become rank 48.
    with pytest.raises(ConfigError, match=re.escape(FIELD)):
        parse_ranks(spec, FIELD)


@pytest.mark.parametrize("spec", ["\u00b2", "0-\u00b2"])
def test_parse_non_ascii_digits_is_a_config_error(spec: str) -> None:
    # str.isdigit() accepts "²", which int() then refuses: the error must still name the field.
    with pytest.raises(ConfigError, match=re.escape(FIELD)):
        parse_ranks(spec, FIELD)


# -- RankSet ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ranks", "spec"),
    [
        ({0}, "0"),
        ({0, 2}, "0,2"),
        ({1, 2}, "1-2"),
        ({0, 1, 2, 3, 8}, "0-3,8"),
        ({16, *range(8)}, "0-7,16"),
        ({0, 2, 3, 4, 9, 10}, "0,2-4,9-10"),
        ({100, 7}, "7,100"),
    ],
)
def test_spec_is_sorted_with_runs_folded(ranks: set[int], spec: str) -> None:
    rank_set = RankSet(everything=False, ranks=frozenset(ranks))
    assert rank_set.spec() == spec
    # the canonical spelling parses back to the same set
    assert parse_ranks(spec, FIELD) == rank_set


@pytest.mark.parametrize(
    ("spec", "inside", "outside"),
    [
        ("0", [0], [1, -1, 8]),
        ("0-7,16", [0, 3, 7, 16], [8, 15, 17]),
        ([0, 8], [0, 8], [1, 7, 16]),
    ],
)
def test_contains(spec: object, inside: list[int], outside: list[int]) -> None:
    rank_set = parse_ranks(spec, FIELD)
    for rank in inside:
        assert rank in rank_set
    for rank in outside:
        assert rank not in rank_set


@pytest.mark.parametrize(
    ("spec", "world_size"),
    [("0", 1), ("0-7", 8), ("0,8,16", 17), ("all", 1), ("all", 4096), ([3], 4)],
)
def test_check_world_size_accepts(spec: object, world_size: int) -> None:
    parse_ranks(spec, FIELD).check_world_size(world_size, FIELD)


@pytest.mark.parametrize(
    ("spec", "world_size", "first_missing"),
    [
        ("0-8", 8, 8),
        ("0,8,16", 8, 8),
        ("16,32", 16, 16),
        ([1], 1, 1),
    ],
)
def test_check_world_size_rejects(spec: object, world_size: int, first_missing: int) -> None:
    rank_set = parse_ranks(spec, FIELD)
    with pytest.raises(ConfigError, match=re.escape(FIELD)) as info:
        rank_set.check_world_size(world_size, FIELD)
    err = info.value
    assert err.field == FIELD
    assert f"rank {first_missing} does not exist in a job of {world_size} ranks" in str(err)
    assert str(world_size) in err.accepted


# -- RankInfo -------------------------------------------------------------------------


def test_rank_info_fields() -> None:
    info = RankInfo(rank=3, local_rank=1, world_size=8, local_world_size=2, host="h")
    assert (info.rank, info.local_rank, info.world_size, info.local_world_size, info.host) == (
        3,
        1,
        8,
        2,
        "h",
    )


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"rank": -1}, "rank"),
        ({"local_rank": -1}, "local_rank"),
        ({"world_size": -1}, "world_size"),
        ({"local_world_size": -1}, "local_world_size"),
        ({"rank": True}, "rank"),
        ({"world_size": 2.0}, "world_size"),
        ({"rank": "0"}, "rank"),
        ({"rank": 0, "world_size": 0}, "world_size"),
        ({"rank": 4, "world_size": 4}, "rank"),
        ({"rank": 9, "world_size": 4}, "rank"),
    ],
)
def test_rank_info_rejects(overrides: dict[str, Any], field: str) -> None:
    values: dict[str, Any] = {
        "rank": 0,
        "local_rank": 0,
        "world_size": 4,
        "local_world_size": 4,
        "host": "h",
    }
    values.update(overrides)
    with pytest.raises(ConfigError, match=rf"^{field}=") as info:
        RankInfo(**values)
    assert info.value.field == field


# -- detect_rank_info --------------------------------------------------------------

TORCHRUN = {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}
SLURM = {"SLURM_PROCID": "6", "SLURM_LOCALID": "2", "SLURM_NTASKS": "16"}


def _tuple(info: RankInfo) -> tuple[int, int, int, int]:
    return info.rank, info.local_rank, info.world_size, info.local_world_size


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, (0, 0, 1, 1)),
        ({"PATH": "/usr/bin", "HOME": "/root"}, (0, 0, 1, 1)),
        (TORCHRUN, (5, 1, 8, 4)),
        ({"RANK": "3", "WORLD_SIZE": "4"}, (3, 3, 4, 4)),
        ({"RANK": " 2 ", "WORLD_SIZE": "4", "LOCAL_RANK": "0"}, (2, 0, 4, 4)),
        ({**SLURM, "SLURM_NTASKS_PER_NODE": "4"}, (6, 2, 16, 4)),
        ({**SLURM, "SLURM_TASKS_PER_NODE": "8(x2)"}, (6, 2, 16, 8)),
        ({**SLURM, "SLURM_TASKS_PER_NODE": "4,2"}, (6, 2, 16, 4)),
        ({**SLURM, "SLURM_TASKS_PER_NODE": "garbage"}, (6, 2, 16, 16)),
        (SLURM, (6, 2, 16, 16)),
        ({"SLURM_PROCID": "3", "SLURM_NTASKS": "4"}, (3, 3, 4, 4)),
        # torchrun inside a SLURM allocation sets both: torchrun wins
        ({**SLURM, **TORCHRUN}, (5, 1, 8, 4)),
        # half a launcher's variables is no launcher
        ({"RANK": "3"}, (0, 0, 1, 1)),
        ({"WORLD_SIZE": "8"}, (0, 0, 1, 1)),
        ({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, (0, 0, 1, 1)),
        ({"SLURM_PROCID": "3"}, (0, 0, 1, 1)),
        ({"SLURM_NTASKS": "4", "SLURM_LOCALID": "1"}, (0, 0, 1, 1)),
        # incomplete torchrun falls through to a complete SLURM
        ({**SLURM, "RANK": "1"}, (6, 2, 16, 16)),
    ],
)
def test_detect_from_environ(environ: dict[str, str], expected: tuple[int, ...]) -> None:
    info = detect_rank_info(environ=environ)
    assert _tuple(info) == expected
    assert info.host == socket.gethostname()


@pytest.mark.parametrize(
    ("environ", "rank", "world_size", "expected"),
    [
        # nothing detected: an explicit rank is also the local rank
        ({}, 3, 8, (3, 3, 8, 8)),
        ({}, 0, 4, (0, 0, 4, 4)),
        ({}, None, 4, (0, 0, 4, 4)),
        ({}, 0, None, (0, 0, 1, 1)),
        # explicit values override what the launcher says
        (TORCHRUN, 7, None, (7, 1, 8, 4)),
        (TORCHRUN, None, 16, (5, 1, 16, 4)),
        (TORCHRUN, 2, 3, (2, 1, 3, 4)),
        (SLURM, 0, 1, (0, 2, 1, 16)),
    ],
)
def test_detect_explicit_overrides(
    environ: dict[str, str],
    rank: int | None,
    world_size: int | None,
    expected: tuple[int, ...],
) -> None:
    info = detect_rank_info(rank=rank, world_size=world_size, environ=environ)
    assert (info.rank, info.world_size) == (expected[0], expected[2])
    assert _tuple(info) == expected


@pytest.mark.parametrize(
    ("environ", "rank", "world_size", "field"),
    [
        ({}, 1, None, "rank"),
        ({}, 4, 4, "rank"),
        ({}, 9, 8, "rank"),
        (TORCHRUN, 8, None, "rank"),
        (TORCHRUN, None, 5, "rank"),
        # a launcher's own variables that disagree are named as the variable
        ({"RANK": "8", "WORLD_SIZE": "8"}, None, None, "RANK"),
        ({"RANK": "-1", "WORLD_SIZE": "8"}, None, None, "RANK"),
        ({"RANK": "0", "WORLD_SIZE": "0"}, None, None, "WORLD_SIZE"),
        ({"SLURM_PROCID": "4", "SLURM_NTASKS": "4"}, None, None, "SLURM_PROCID"),
        ({}, -1, None, "rank"),
        ({}, None, 0, "world_size"),
        ({}, True, 2, "rank"),
    ],
)
def test_detect_rejects_impossible_ranks(
    environ: dict[str, str], rank: Any, world_size: Any, field: str
) -> None:
    with pytest.raises(ConfigError, match=rf"^{field}=") as info:
        detect_rank_info(rank=rank, world_size=world_size, environ=environ)
    assert info.value.field == field


@pytest.mark.parametrize(
    ("environ", "variable"),
    [
        ({"RANK": "zero", "WORLD_SIZE": "8"}, "RANK"),
        # int() takes these, but no launcher writes them
        ({"RANK": "1_0", "WORLD_SIZE": "20"}, "RANK"),
        ({"RANK": "\u0663", "WORLD_SIZE": "8"}, "RANK"),
        ({"RANK": "0", "WORLD_SIZE": "\uff18"}, "WORLD_SIZE"),
        ({"RANK": "0", "WORLD_SIZE": ""}, "WORLD_SIZE"),
        ({"RANK": "0", "WORLD_SIZE": "8", "LOCAL_RANK": "x"}, "LOCAL_RANK"),
        ({"RANK": "0", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "1.5"}, "LOCAL_WORLD_SIZE"),
        ({"SLURM_PROCID": "?", "SLURM_NTASKS": "4"}, "SLURM_PROCID"),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "four"}, "SLURM_NTASKS"),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_LOCALID": "a"}, "SLURM_LOCALID"),
        (
            {"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_NTASKS_PER_NODE": "2x"},
            "SLURM_NTASKS_PER_NODE",
        ),
    ],
)
def test_detect_names_a_bad_launcher_variable(environ: dict[str, str], variable: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{variable}=") as info:
        detect_rank_info(environ=environ)
    assert info.value.field == variable
    assert "integer" in info.value.accepted


def test_slurm_tasks_per_node_in_other_digits_falls_back_to_the_world_size() -> None:
    environ = {"SLURM_PROCID": "1", "SLURM_NTASKS": "4", "SLURM_TASKS_PER_NODE": "\u0662(x2)"}
    assert detect_rank_info(environ=environ).local_world_size == 4


def _fake_dist(rank: int, world: int, initialized: bool = True) -> SimpleNamespace:
    return SimpleNamespace(
        is_available=lambda: True,
        is_initialized=lambda: initialized,
        get_rank=lambda: rank,
        get_world_size=lambda: world,
    )


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        # an initialised process group wins over the launcher's RANK/WORLD_SIZE
        ({}, (3, 3, 4, 4)),
        ({"RANK": "0", "WORLD_SIZE": "2"}, (3, 0, 4, 2)),
        (
            {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"},
            (3, 1, 4, 2),
        ),
    ],
)
def test_detect_prefers_initialised_torch_distributed(
    monkeypatch: pytest.MonkeyPatch, environ: dict[str, str], expected: tuple[int, ...]
) -> None:
    monkeypatch.setitem(sys.modules, "torch.distributed", _fake_dist(rank=3, world=4))
    assert _tuple(detect_rank_info(environ=environ)) == expected


def test_detect_ignores_uninitialised_torch_distributed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(
        sys.modules, "torch.distributed", _fake_dist(rank=3, world=4, initialized=False)
    )
    assert _tuple(detect_rank_info(environ=TORCHRUN)) == (5, 1, 8, 4)
