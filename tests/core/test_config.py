"""Tests for rankscope.config._config: validation at construction, dict/YAML round trips."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

import rankscope
from rankscope import (
    AutoTrigger,
    ConfigError,
    MemoryConfig,
    ProfileConfig,
    RankscopeError,
    Schedule,
    TimerConfig,
    TraceConfig,
)
from rankscope.config._trace import ACTIVITIES

SCHEDULE_FIELDS = ("skip_first", "wait", "warmup", "active", "repeat")
TRACE_BOOLS = ("enable", "record_shapes", "profile_memory", "with_stack", "with_flops")
TRACE_BOOLS_ALL = (*TRACE_BOOLS, "with_modules", "gzip")
CLOUD_SCHEMES = ("s3", "gs", "gcs", "hdfs", "az", "abfs", "abfss")


@pytest.fixture(autouse=True)
def _cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Relative output dirs (the default included) resolve against the working directory.
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path.resolve() / "run"


def _names_field(err: ConfigError, field: str, value: object) -> None:
    """The error names the field and the value it received, and says what is accepted."""
    assert err.field == field
    assert str(err).startswith(f"{field}={value!r} is not valid")
    assert err.accepted
    assert f"accepted: {err.accepted}" in str(err)


# -- ConfigError ----------------------------------------------------------------------


def test_config_error_is_a_value_error_and_a_rankscope_error() -> None:
    assert issubclass(ConfigError, ValueError)
    assert issubclass(ConfigError, RankscopeError)


@pytest.mark.parametrize(
    ("problem", "message"),
    [
        (None, "trace.ranks='x' is not valid; accepted: a rank"),
        ("empty", "trace.ranks='x' is not valid: empty; accepted: a rank"),
    ],
)
def test_config_error_message(problem: str | None, message: str) -> None:
    err = ConfigError("trace.ranks", "x", "a rank", problem)
    assert str(err) == message
    assert (err.field, err.value, err.accepted, err.problem) == (
        "trace.ranks",
        "x",
        "a rank",
        problem,
    )


def test_config_error_under_prefixes_the_field() -> None:
    cause = KeyError("k")
    err = ConfigError("schedule.active", 0, "an int >= 1", "too small")
    err.__cause__ = cause
    outer = err.under("trace")
    assert outer.field == "trace.schedule.active"
    assert (outer.value, outer.accepted, outer.problem) == (0, "an int >= 1", "too small")
    assert outer.__cause__ is cause
    assert str(outer).startswith("trace.schedule.active=0 is not valid: too small")


# -- defaults ------------------------------------------------------------------------


def test_schedule_defaults() -> None:
    s = Schedule()
    assert (s.skip_first, s.wait, s.warmup, s.active, s.repeat) == (0, 0, 1, 1, 1)


def test_trace_defaults() -> None:
    t = TraceConfig()
    assert t.enable is False
    assert t.ranks == "0"
    assert t.rank_set.ranks == frozenset({0})
    assert t.schedule == Schedule()
    assert t.target == "step"
    assert t.target_phase is None
    assert t.activities is None
    for name in ("record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules"):
        assert getattr(t, name) is False, name
    assert t.gzip is True


def test_profile_defaults(tmp_path: Path) -> None:
    cfg = ProfileConfig()
    assert cfg.output_dir == str(tmp_path.resolve() / "runs" / "rankscope")
    assert cfg.trace == TraceConfig()


@pytest.mark.parametrize(
    ("cls", "kwargs"),
    [(Schedule, {"active": 2}), (TraceConfig, {"enable": True}), (ProfileConfig, {})],
)
def test_configs_are_frozen(cls: type, kwargs: dict[str, Any]) -> None:
    obj = cls(**kwargs)
    name = dataclasses.fields(obj)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(obj, name, getattr(obj, name))


@pytest.mark.parametrize(("cls", "arg"), [(Schedule, 1), (TraceConfig, True), (ProfileConfig, "x")])
def test_configs_are_keyword_only(cls: type, arg: object) -> None:
    with pytest.raises(TypeError):
        cls(arg)


def test_configs_are_hashable_and_compare_by_value(run_dir: Path) -> None:
    a = ProfileConfig(output_dir=run_dir, trace=TraceConfig(activities=["cpu"], ranks=[0, 8]))
    b = ProfileConfig(output_dir=str(run_dir), trace=TraceConfig(activities=("cpu",), ranks="0,8"))
    assert a == b
    assert hash(a) == hash(b)


# -- Schedule --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"skip_first": 0, "wait": 0, "warmup": 0, "active": 1, "repeat": 0},
        {"skip_first": 10, "wait": 5, "warmup": 3, "active": 20, "repeat": 4},
        {"active": 1},
    ],
)
def test_schedule_accepts(kwargs: dict[str, int]) -> None:
    s = Schedule(**kwargs)
    for name, value in kwargs.items():
        assert getattr(s, name) == value


@pytest.mark.parametrize(
    ("name", "value", "minimum"),
    [
        *[(name, None, 1 if name == "active" else 0) for name in SCHEDULE_FIELDS],
        *[(name, -1, 1 if name == "active" else 0) for name in SCHEDULE_FIELDS],
        ("active", 0, 1),
        ("active", -5, 1),
        ("wait", 1.0, 0),
        ("warmup", "1", 0),
        ("repeat", True, 0),
        ("active", True, 1),
        ("skip_first", [1], 0),
    ],
)
def test_schedule_rejects(name: str, value: object, minimum: int) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"schedule.{name}")) as info:
        Schedule(**{name: value})
    _names_field(info.value, f"schedule.{name}", value)
    assert info.value.accepted == f"an int >= {minimum}"


# -- TraceConfig -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ranks", "canonical", "members"),
    [
        (0, "0", {0}),
        ("0", "0", {0}),
        ("0,8,16", "0,8,16", {0, 8, 16}),
        ("0-7", "0-7", set(range(8))),
        ("0-7,16", "0-7,16", {*range(8), 16}),
        ("16, 0-3", "0-3,16", {0, 1, 2, 3, 16}),
        ("0,1,2,3", "0-3", {0, 1, 2, 3}),
        ([0, 8], "0,8", {0, 8}),
        ((8, 0), "0,8", {0, 8}),
        ("all", "all", None),
        ("ALL", "all", None),
    ],
)
def test_trace_ranks(ranks: object, canonical: str, members: set[int] | None) -> None:
    t = TraceConfig(ranks=ranks)
    assert t.ranks == canonical
    if members is None:
        assert t.rank_set.everything
    else:
        assert t.rank_set.ranks == frozenset(members)
        assert not t.rank_set.everything


@pytest.mark.parametrize(
    "ranks",
    [
        "all,0",
        [0, "all"],
        "0,0",
        "0-7,4",
        [3, 3],
        -1,
        "-2",
        [1, -1],
        "",
        "  ",
        [],
        "x",
        "0-",
        True,
        False,
        None,
        1.5,
        {0},
    ],
)
def test_trace_ranks_rejects(ranks: object) -> None:
    with pytest.raises(ConfigError, match=re.escape("trace.ranks")) as info:
        TraceConfig(ranks=ranks)
    _names_field(info.value, "trace.ranks", ranks)


@pytest.mark.parametrize(
    ("target", "phase"),
    [
        ("step", None),
        ("caller", None),
        ("phase:forward", "forward"),
        ("phase: backward ", "backward"),
        ("phase:a:b", "a:b"),
    ],
)
def test_trace_target(target: str, phase: str | None) -> None:
    t = TraceConfig(target=target)
    assert t.target == target
    assert t.target_phase == phase


@pytest.mark.parametrize(
    "target", ["", "steps", "Step", "phase", "phase:", "phase:  ", "forward", None, 1]
)
def test_trace_target_rejects(target: object) -> None:
    with pytest.raises(ConfigError, match=re.escape("trace.target")) as info:
        TraceConfig(target=target)
    _names_field(info.value, "trace.target", target)
    assert "phase:NAME" in info.value.accepted


@pytest.mark.parametrize(
    ("activities", "parsed"),
    [
        (None, None),
        (["cpu"], ("cpu",)),
        ("cpu", ("cpu",)),
        (("cpu", "cuda"), ("cpu", "cuda")),
        (["CUDA", " Cpu "], ("cuda", "cpu")),
        (["xpu"], ("xpu",)),
        (["cpu", "cpu", "CPU"], ("cpu",)),
        (list(ACTIVITIES), ACTIVITIES),
    ],
)
def test_trace_activities(activities: object, parsed: tuple[str, ...] | None) -> None:
    assert TraceConfig(activities=activities).activities == parsed


@pytest.mark.parametrize(
    ("activities", "problem"),
    [
        ([], None),
        ((), None),
        ("", "unknown activity ''"),
        (["gpu"], "unknown activity 'gpu'"),
        (["cpu", "tpu"], "unknown activity 'tpu'"),
        ([1], "unknown activity 1"),
        ([None], "unknown activity None"),
        ({"cpu"}, None),
        (5, None),
    ],
)
def test_trace_activities_rejects(activities: object, problem: str | None) -> None:
    with pytest.raises(ConfigError, match=re.escape("trace.activities")) as info:
        TraceConfig(activities=activities)
    _names_field(info.value, "trace.activities", activities)
    for name in ACTIVITIES:
        assert name in info.value.accepted
    if problem is not None:
        assert problem in str(info.value)


@pytest.mark.parametrize("name", TRACE_BOOLS_ALL)
@pytest.mark.parametrize("value", [1, 0, "true", "yes", None, 1.0])
def test_trace_bool_fields_reject_non_bools(name: str, value: object) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"trace.{name}")) as info:
        TraceConfig(**{name: value})
    _names_field(info.value, f"trace.{name}", value)
    assert info.value.accepted == "True or False"


@pytest.mark.parametrize("name", TRACE_BOOLS_ALL)
@pytest.mark.parametrize("value", [True, False])
def test_trace_bool_fields_accept_bools(name: str, value: bool) -> None:
    assert getattr(TraceConfig(**{name: value}), name) is value


@pytest.mark.parametrize("schedule", [None, {"active": 2}, 3, "default"])
def test_trace_schedule_must_be_a_schedule(schedule: object) -> None:
    with pytest.raises(ConfigError, match=re.escape("trace.schedule")) as info:
        TraceConfig(schedule=schedule)
    _names_field(info.value, "trace.schedule", schedule)


# -- ProfileConfig: output_dir -----------------------------------------------------------


@pytest.mark.parametrize("as_path", [True, False])
def test_absolute_output_dir_is_kept_and_not_logged(
    run_dir: Path, as_path: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="rankscope")
    cfg = ProfileConfig(output_dir=run_dir if as_path else str(run_dir))
    assert cfg.output_dir == str(run_dir)
    assert isinstance(cfg.output_dir, str)
    assert not [r for r in caplog.records if "output_dir" in r.getMessage()]


@pytest.mark.parametrize(
    "relative", ["runs/exp1", "./runs/exp1", "runs/../runs/exp1", Path("runs/exp1")]
)
def test_relative_output_dir_is_resolved_and_logged(
    tmp_path: Path, relative: str | Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="rankscope")
    cfg = ProfileConfig(output_dir=relative)
    expected = str(tmp_path.resolve() / "runs" / "exp1")
    assert cfg.output_dir == expected
    assert Path(cfg.output_dir).is_absolute()
    logged = [r for r in caplog.records if r.name.startswith("rankscope")]
    assert len(logged) == 1
    assert logged[0].levelno == logging.INFO
    assert expected in logged[0].getMessage()
    assert str(relative) in logged[0].getMessage()


def test_output_dir_expands_user() -> None:
    cfg = ProfileConfig(output_dir="~/rankscope-runs")
    assert cfg.output_dir == str(Path("~/rankscope-runs").expanduser().resolve())


def test_existing_output_dir_is_accepted(tmp_path: Path) -> None:
    assert ProfileConfig(output_dir=tmp_path).output_dir == str(tmp_path.resolve())


@pytest.mark.parametrize("value", [None, "", "   ", 5, True, b"/tmp/run", ["runs"]])
def test_output_dir_rejects_non_paths(value: object) -> None:
    with pytest.raises(ConfigError, match="output_dir") as info:
        ProfileConfig(output_dir=value)
    _names_field(info.value, "output_dir", value)
    assert "path" in info.value.accepted


@pytest.mark.parametrize("scheme", [*CLOUD_SCHEMES, "S3", "GS"])
def test_output_dir_rejects_cloud_uris(scheme: str) -> None:
    uri = f"{scheme}://bucket/runs/exp1"
    with pytest.raises(ConfigError, match="output_dir") as info:
        ProfileConfig(output_dir=uri)
    _names_field(info.value, "output_dir", uri)
    message = str(info.value)
    assert "torch.profiler" in message
    assert f"cannot write to {scheme.lower()}://" in message


@pytest.mark.parametrize("uri", ["http://host/run", "file:///tmp/run", "ftp://host/run"])
def test_output_dir_rejects_other_uris(uri: str) -> None:
    with pytest.raises(ConfigError, match="output_dir") as info:
        ProfileConfig(output_dir=uri)
    _names_field(info.value, "output_dir", uri)
    assert "URI" in str(info.value)


@pytest.mark.parametrize("below", ["", "sub", "sub/deeper"])
def test_output_dir_at_or_under_a_file_is_rejected(tmp_path: Path, below: str) -> None:
    taken = tmp_path / "taken"
    taken.write_text("not a directory")
    target = taken / below if below else taken
    with pytest.raises(ConfigError, match="output_dir") as info:
        ProfileConfig(output_dir=target)
    assert info.value.field == "output_dir"
    assert f"{taken.resolve()} exists and is not a directory" in str(info.value)


@pytest.mark.parametrize("trace", [None, {"enable": True}, Schedule(), "trace"])
def test_trace_must_be_a_trace_config(run_dir: Path, trace: object) -> None:
    with pytest.raises(ConfigError, match=r"^trace=") as info:
        ProfileConfig(output_dir=run_dir, trace=trace)
    _names_field(info.value, "trace", trace)


# -- ProfileConfig.check_world_size ----------------------------------------------------


@pytest.mark.parametrize(
    ("ranks", "world_size"), [("0", 1), ("0-7", 8), ("0,8,16", 32), ("all", 1), ([3], 4)]
)
def test_check_world_size_accepts(run_dir: Path, ranks: object, world_size: int) -> None:
    ProfileConfig(output_dir=run_dir, trace=TraceConfig(ranks=ranks)).check_world_size(world_size)


@pytest.mark.parametrize(
    ("ranks", "world_size", "missing"),
    [("0", 0, 0), ("0-8", 8, 8), ("0,8,16", 16, 16), ("0,8,16", 8, 8), ([4], 4, 4)],
)
def test_check_world_size_rejects(
    run_dir: Path, ranks: object, world_size: int, missing: int
) -> None:
    cfg = ProfileConfig(output_dir=run_dir, trace=TraceConfig(ranks=ranks))
    with pytest.raises(ConfigError, match=re.escape("trace.ranks")) as info:
        cfg.check_world_size(world_size)
    assert info.value.field == "trace.ranks"
    assert f"rank {missing} does not exist" in str(info.value)


# -- to_dict / from_dict -----------------------------------------------------------------


def _configs(root: Path) -> list[ProfileConfig]:
    return [
        ProfileConfig(output_dir=root / "a"),
        ProfileConfig(output_dir=root / "b", trace=TraceConfig(enable=True, ranks="all")),
        ProfileConfig(
            output_dir=root / "c",
            trace=TraceConfig(
                enable=True,
                ranks=[0, 8, 9, 10],
                schedule=Schedule(skip_first=10, wait=2, warmup=3, active=4, repeat=0),
                target="phase:forward",
                activities=["cuda", "cpu"],
                record_shapes=True,
                profile_memory=True,
                with_stack=True,
                with_flops=True,
                with_modules=True,
                gzip=False,
            ),
            timer=TimerConfig(
                enable=True,
                ranks="0-3",
                start_step=5,
                end_step=100,
                every_n_steps=3,
                flush_every_n_steps=7,
                max_pending_events=64,
            ),
        ),
    ]


def test_to_dict_shape(run_dir: Path) -> None:
    cfg = ProfileConfig(
        output_dir=run_dir,
        trace=TraceConfig(ranks=[16, 0, 1], activities=["cpu"], schedule=Schedule(active=3)),
    )
    assert cfg.to_dict() == {
        "output_dir": str(run_dir),
        "trace": {
            "enable": False,
            "ranks": "0-1,16",
            "schedule": {"skip_first": 0, "wait": 0, "warmup": 1, "active": 3, "repeat": 1},
            "target": "step",
            "activities": ["cpu"],
            "tool": "torch",
            "record_shapes": False,
            "profile_memory": False,
            "with_stack": False,
            "with_flops": False,
            "with_modules": False,
            "gzip": True,
            "trigger_check_every_n_steps": 10,
            "trigger_max_steps": 5,
            "trigger_max_windows": 10,
            "on_signal": False,
            "auto": {
                "enable": False,
                "ratio": 1.5,
                "consecutive": 3,
                "window_steps": 2,
                "history_steps": 50,
                "warmup_steps": 20,
                "max_captures": 3,
                "cooldown_steps": 200,
                "phase": None,
                "ranks": None,
            },
        },
        "timer": {
            "enable": False,
            "ranks": "all",
            "start_step": 0,
            "end_step": None,
            "every_n_steps": 10,
            "flush_every_n_steps": 10,
            "max_pending_events": 4096,
            "health": True,
            "health_every_s": 5.0,
        },
        "memory": {
            "enable": False,
            "ranks": "0",
            "max_entries": 100000,
            "stacks": "python",
            "on_oom": True,
        },
        "hang": {"enable": True, "after_s": 180.0, "factor": 10.0, "heartbeat_s": 5.0},
    }


@pytest.mark.parametrize("index", range(3))
def test_dict_round_trip(tmp_path: Path, index: int) -> None:
    cfg = _configs(tmp_path.resolve())[index]
    data = cfg.to_dict()
    assert json.loads(json.dumps(data)) == data  # plain data only
    assert ProfileConfig.from_dict(data) == cfg
    assert ProfileConfig.from_dict(json.loads(json.dumps(data))) == cfg


@pytest.mark.parametrize("index", range(3))
def test_yaml_round_trip(tmp_path: Path, index: int) -> None:
    cfg = _configs(tmp_path.resolve())[index]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg.to_dict()), encoding="utf-8")
    assert ProfileConfig.from_yaml(path) == cfg
    assert ProfileConfig.from_yaml(str(path)) == cfg


def test_to_dict_is_a_copy(run_dir: Path) -> None:
    cfg = ProfileConfig(output_dir=run_dir)
    data = cfg.to_dict()
    data["trace"]["enable"] = True
    data["trace"]["schedule"]["active"] = 9
    assert cfg.trace.enable is False
    assert cfg.trace.schedule.active == 1


def test_from_dict_like_a_user_writes(tmp_path: Path) -> None:
    cfg = ProfileConfig.from_dict(
        {
            "output_dir": "runs/exp1",
            "trace": {
                "enable": True,
                "ranks": "0-7,16",
                "target": "phase:forward",
                "activities": ["cpu", "cuda"],
                "record_shapes": True,
                "schedule": {"skip_first": 10, "active": 3},
            },
        }
    )
    assert cfg == ProfileConfig(
        output_dir=tmp_path.resolve() / "runs" / "exp1",
        trace=TraceConfig(
            enable=True,
            ranks="0-7,16",
            target="phase:forward",
            activities=("cpu", "cuda"),
            record_shapes=True,
            schedule=Schedule(skip_first=10, active=3),
        ),
    )


@pytest.mark.parametrize(
    ("data", "trace"),
    [
        ({}, TraceConfig()),
        ({"trace": {}}, TraceConfig()),
        ({"trace": {"schedule": {}}}, TraceConfig()),
        ({"trace": {"enable": True}}, TraceConfig(enable=True)),
        ({"trace": {"schedule": {"repeat": 0}}}, TraceConfig(schedule=Schedule(repeat=0))),
        ({"trace": TraceConfig(ranks="all")}, TraceConfig(ranks="all")),
        ({"trace": {"schedule": Schedule(active=5)}}, TraceConfig(schedule=Schedule(active=5))),
    ],
)
def test_from_dict_partial(data: dict[str, Any], trace: TraceConfig) -> None:
    # ProfileConfig() is built here, not in the table: its default output_dir depends on the cwd.
    assert ProfileConfig.from_dict(data) == ProfileConfig(trace=trace)


@pytest.mark.parametrize(
    ("data", "field"),
    [
        # unknown keys, named by their dotted path
        ({"bogus": 1}, "bogus"),
        ({"schedule": {"active": 2}}, "schedule"),
        ({"trace": {"bogus": 1}}, "trace.bogus"),
        ({"trace": {"enabled": True}}, "trace.enabled"),
        ({"trace": {"schedule": {"bogus": 1}}}, "trace.schedule.bogus"),
        ({"trace": {"schedule": {"steps": 1}}}, "trace.schedule.steps"),
        # nested schedule values, named from the top
        ({"trace": {"schedule": {"active": 0}}}, "trace.schedule.active"),
        ({"trace": {"schedule": {"wait": -1}}}, "trace.schedule.wait"),
        ({"trace": {"schedule": {"warmup": None}}}, "trace.schedule.warmup"),
        ({"trace": {"schedule": {"repeat": "2"}}}, "trace.schedule.repeat"),
        ({"trace": {"schedule": None}}, "trace.schedule"),
        ({"trace": {"schedule": [1, 1]}}, "trace.schedule"),
        # trace values
        ({"trace": {"ranks": "0,0"}}, "trace.ranks"),
        ({"trace": {"enable": "yes"}}, "trace.enable"),
        ({"trace": {"activities": []}}, "trace.activities"),
        ({"trace": {"activities": ["gpu"]}}, "trace.activities"),
        ({"trace": {"target": "epoch"}}, "trace.target"),
        ({"trace": None}, "trace"),
        ({"trace": ["enable"]}, "trace"),
        # output dir
        ({"output_dir": None}, "output_dir"),
        ({"output_dir": "s3://bucket/run"}, "output_dir"),
    ],
)
def test_from_dict_errors_name_the_dotted_field(data: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{re.escape(field)}=") as info:
        ProfileConfig.from_dict(data)
    assert info.value.field == field


def test_unknown_key_error_lists_the_known_fields() -> None:
    with pytest.raises(ConfigError, match=re.escape("trace.schedule.bogus")) as info:
        ProfileConfig.from_dict({"trace": {"schedule": {"bogus": 1}}})
    assert "unknown field" in str(info.value)
    for name in SCHEDULE_FIELDS:
        assert name in info.value.accepted


@pytest.mark.parametrize("data", [None, [], ["output_dir"], "output_dir: x", 3])
def test_from_dict_needs_a_mapping(data: object) -> None:
    with pytest.raises(ConfigError, match=r"^config=") as info:
        ProfileConfig.from_dict(data)  # type: ignore[arg-type]
    _names_field(info.value, "config", data)


# -- from_yaml ---------------------------------------------------------------------------

USER_YAML = """\
output_dir: runs/exp1
trace:
  enable: true
  ranks: 0-7,16
  target: phase:forward
  activities: [cpu, cuda]
  record_shapes: true
  schedule:
    skip_first: 10
    wait: 1
    warmup: 2
    active: 3
    repeat: 2
"""


def _user_config(root: Path) -> ProfileConfig:
    return ProfileConfig(
        output_dir=root / "runs" / "exp1",
        trace=TraceConfig(
            enable=True,
            ranks="0-7,16",
            target="phase:forward",
            activities=["cpu", "cuda"],
            record_shapes=True,
            schedule=Schedule(skip_first=10, wait=1, warmup=2, active=3, repeat=2),
        ),
    )


def _indent(text: str) -> str:
    return "".join(f"  {line}\n" for line in text.splitlines())


def _write(tmp_path: Path, text: str, name: str = "config.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_from_yaml_like_a_user_writes(tmp_path: Path) -> None:
    cfg = ProfileConfig.from_yaml(_write(tmp_path, USER_YAML))
    assert cfg == _user_config(tmp_path.resolve())


def test_from_yaml_under_a_single_rankscope_key(tmp_path: Path) -> None:
    cfg = ProfileConfig.from_yaml(_write(tmp_path, "rankscope:\n" + _indent(USER_YAML)))
    assert cfg == _user_config(tmp_path.resolve())


@pytest.mark.parametrize(
    ("ranks", "canonical"),
    [("0", "0"), ("0,8,16", "0,8,16"), ("0-7", "0-7"), ("all", "all"), ("[0, 8]", "0,8")],
)
def test_from_yaml_rank_spellings(tmp_path: Path, ranks: str, canonical: str) -> None:
    path = _write(tmp_path, f"trace:\n  ranks: {ranks}\n")
    assert ProfileConfig.from_yaml(path).trace.ranks == canonical


@pytest.mark.parametrize("text", ["", "# nothing here\n", "rankscope:\n", "rankscope: {}\n"])
def test_from_yaml_empty_gives_defaults(tmp_path: Path, text: str) -> None:
    assert ProfileConfig.from_yaml(_write(tmp_path, text)) == ProfileConfig()


def test_from_yaml_key_picks_a_block(tmp_path: Path) -> None:
    text = "model:\n  layers: 12\nprofiler:\n" + _indent(USER_YAML) + "optimizer:\n  lr: 0.1\n"
    cfg = ProfileConfig.from_yaml(_write(tmp_path, text), key="profiler")
    assert cfg == _user_config(tmp_path.resolve())


def test_from_yaml_key_with_an_empty_block_gives_defaults(tmp_path: Path) -> None:
    path = _write(tmp_path, "model:\n  layers: 12\nprofiler:\n")
    assert ProfileConfig.from_yaml(path, key="profiler") == ProfileConfig()


def test_from_yaml_key_rankscope_is_explicit(tmp_path: Path) -> None:
    path = _write(tmp_path, "rankscope:\n  trace:\n    enable: true\n")
    assert ProfileConfig.from_yaml(path, key="rankscope").trace.enable is True


@pytest.mark.parametrize("text", ["model:\n  layers: 12\n", "", "- profiler\n"])
def test_from_yaml_missing_key(tmp_path: Path, text: str) -> None:
    with pytest.raises(ConfigError, match=r"^key='profiler'") as info:
        ProfileConfig.from_yaml(_write(tmp_path, text), key="profiler")
    assert info.value.field == "key"


def test_from_yaml_rankscope_beside_other_keys_is_an_unknown_field(tmp_path: Path) -> None:
    path = _write(tmp_path, "rankscope:\n  trace: {}\nmodel:\n  layers: 12\n")
    with pytest.raises(ConfigError, match=r"^rankscope=") as info:
        ProfileConfig.from_yaml(path)
    assert "unknown field" in str(info.value)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("trace:\n  schedule:\n    bogus: 1\n", "trace.schedule.bogus"),
        ("trace:\n  schedule:\n    active: 0\n", "trace.schedule.active"),
        ("rankscope:\n  trace:\n    schedule:\n      active: 0\n", "trace.schedule.active"),
        ("trace:\n  ranks: 0-7,4\n", "trace.ranks"),
        ("trace:\n  enable: maybe\n", "trace.enable"),
        ("trace:\n  bogus: true\n", "trace.bogus"),
        ("output_dir: gs://bucket/run\n", "output_dir"),
        ("output_dir:\n", "output_dir"),
    ],
)
def test_from_yaml_errors_name_the_dotted_field(tmp_path: Path, text: str, field: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{re.escape(field)}=") as info:
        ProfileConfig.from_yaml(_write(tmp_path, text))
    assert info.value.field == field


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n", "42\n"])
def test_from_yaml_top_level_must_be_a_mapping(tmp_path: Path, text: str) -> None:
    with pytest.raises(ConfigError, match=r"^config="):
        ProfileConfig.from_yaml(_write(tmp_path, text))


def test_from_yaml_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=r"^path=") as info:
        ProfileConfig.from_yaml(path)
    _names_field(info.value, "path", str(path))
    assert "readable" in info.value.accepted
    assert isinstance(info.value.__cause__, OSError)


def test_from_yaml_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^path="):
        ProfileConfig.from_yaml(tmp_path)


@pytest.mark.parametrize(
    "text",
    ["trace: [unclosed\n", "trace:\n  enable: true\n enable: false\n", "a: b: c\n", "\tx: 1\n"],
)
def test_from_yaml_invalid_yaml(tmp_path: Path, text: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError, match=r"^path=") as info:
        ProfileConfig.from_yaml(path)
    _names_field(info.value, "path", str(path))
    assert "valid YAML" in info.value.accepted
    assert isinstance(info.value.__cause__, yaml.YAMLError)


def test_from_yaml_not_utf8(tmp_path: Path) -> None:
    # A binary or Latin-1 file is not a YAML config either; it must not escape as UnicodeDecodeError.
    path = tmp_path / "config.yaml"
    path.write_bytes(b"\xff\xfe\x00output_dir: caf\xe9\n")
    with pytest.raises(ConfigError, match=r"^path="):
        ProfileConfig.from_yaml(path)


def test_output_dir_that_is_no_usable_path_is_named(tmp_path: Path) -> None:
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    for value in ("a\0b", "~nosuchuser-rankscope/x", str(loop / "x")):
        with pytest.raises(ConfigError, match=r"^output_dir=.*not a usable path") as info:
            ProfileConfig(output_dir=value)
        assert info.value.field == "output_dir"


# -- TimerConfig ------------------------------------------------------------------------


def test_timer_defaults() -> None:
    timer = TimerConfig()
    assert (timer.enable, timer.ranks, timer.start_step, timer.end_step) == (False, "all", 0, None)
    assert (timer.every_n_steps, timer.flush_every_n_steps) == (10, 10)
    assert timer.max_pending_events >= 2
    assert ProfileConfig().timer == timer


def test_every_timer_field_has_a_docstring() -> None:
    import inspect

    source = inspect.getsource(TimerConfig)
    for f in dataclasses.fields(TimerConfig):
        assert re.search(rf"^    {f.name}: .*\n    \"\"\"", source, re.M), f.name


@pytest.mark.parametrize(
    ("name", "value", "accepted"),
    [
        ("enable", 1, "True or False"),
        ("enable", None, "True or False"),
        ("start_step", -1, ">= 0"),
        ("start_step", None, ">= 0"),
        ("start_step", 1.0, ">= 0"),
        ("end_step", 0, "None or an int > start_step (0)"),
        ("end_step", -5, "None or an int > start_step"),
        ("end_step", "10", "None or an int > start_step"),
        ("end_step", True, "None or an int > start_step"),
        ("every_n_steps", 0, ">= 1"),
        ("every_n_steps", None, ">= 1"),
        ("flush_every_n_steps", 0, ">= 1"),
        ("max_pending_events", 1, ">= 2"),
        ("max_pending_events", None, ">= 2"),
    ],
)
def test_timer_rejects(name: str, value: object, accepted: str) -> None:
    with pytest.raises(ConfigError, match=rf"^timer\.{name}=") as info:
        TimerConfig(**{name: value})  # type: ignore[arg-type]
    assert info.value.field == f"timer.{name}"
    assert accepted in info.value.accepted


def test_timer_end_step_must_pass_the_start() -> None:
    assert TimerConfig(start_step=5, end_step=6).end_step == 6
    with pytest.raises(ConfigError, match=r"start_step \(5\)"):
        TimerConfig(start_step=5, end_step=5)


@pytest.mark.parametrize("ranks", ["all,0", "3,3", "-1", "", "x", [0, 0], None])
def test_timer_ranks_rejects(ranks: object) -> None:
    with pytest.raises(ConfigError, match=r"^timer\.ranks="):
        TimerConfig(ranks=ranks)  # type: ignore[arg-type]


def test_timer_ranks_beyond_the_world_size(run_dir: Path) -> None:
    cfg = ProfileConfig(output_dir=run_dir, timer=TimerConfig(ranks="0-7"))
    cfg.check_world_size(8)
    with pytest.raises(ConfigError, match=r"^timer\.ranks=") as info:
        cfg.check_world_size(4)
    assert "rank 4 does not exist" in str(info.value)


@pytest.mark.parametrize("timer", [None, {"enable": True}, TraceConfig(), "timer"])
def test_timer_must_be_a_timer_config(run_dir: Path, timer: object) -> None:
    with pytest.raises(ConfigError, match=r"^timer="):
        ProfileConfig(output_dir=run_dir, timer=timer)  # type: ignore[arg-type]


def test_timer_from_dict_like_a_user_writes(tmp_path: Path) -> None:
    cfg = ProfileConfig.from_dict(
        {"output_dir": "runs/x", "timer": {"enable": True, "every_n_steps": 1, "ranks": "0,8"}}
    )
    assert cfg.timer == TimerConfig(enable=True, every_n_steps=1, ranks=[0, 8])
    assert cfg.trace == TraceConfig()


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"timer": {"every": 5}}, "timer.every"),
        ({"timer": {"every_n_steps": 0}}, "timer.every_n_steps"),
        ({"timer": 5}, "timer"),
        ({"timer": {"ranks": "9-1"}}, "timer.ranks"),
    ],
)
def test_timer_from_dict_names_the_field(data: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        ProfileConfig.from_dict(data)
    assert info.value.field == field


# -- tool, auto.phase, memory -------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field", "says"),
    [
        ({"tool": "perf"}, "trace.tool", "'torch' or 'nsys'"),
        ({"tool": "nsys", "record_shapes": True}, "trace.record_shapes", "nsys's own flags"),
        ({"tool": "nsys", "with_stack": True}, "trace.with_stack", "torch.profiler option"),
        ({"tool": "nsys", "activities": ["cuda"]}, "trace.activities", "None with trace.tool"),
    ],
)
def test_nsys_rejects_what_only_torch_profiler_reads(
    kwargs: dict[str, object], field: str, says: str
) -> None:
    with pytest.raises(ConfigError) as info:
        TraceConfig(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field
    assert says in str(info.value)


def test_nsys_alone_is_accepted() -> None:
    assert TraceConfig(tool="nsys").tool == "nsys"


def test_auto_phase_needs_the_timer(run_dir: Path) -> None:
    auto = AutoTrigger(enable=True, phase="forward")
    with pytest.raises(ConfigError) as info:
        ProfileConfig(output_dir=run_dir, trace=TraceConfig(enable=True, auto=auto))
    assert info.value.field == "trace.auto.phase"
    assert "timer is off" in str(info.value)
    on = ProfileConfig(
        output_dir=run_dir,
        trace=TraceConfig(enable=True, auto=auto),
        timer=TimerConfig(enable=True),
    )
    assert on.trace.auto.phase == "forward"


@pytest.mark.parametrize("phase", ["", "  ", 3])
def test_auto_phase_must_name_a_phase(phase: object) -> None:
    with pytest.raises(ConfigError, match=r"auto\.phase"):
        AutoTrigger(phase=phase)  # type: ignore[arg-type]


def test_auto_ranks_default_to_the_trace_ranks() -> None:
    assert [r for r in range(8) if r in AutoTrigger().rank_set("0,3")] == [0, 3]
    assert [r for r in range(4) if r in AutoTrigger(ranks="all").rank_set("0")] == [0, 1, 2, 3]
    assert AutoTrigger(ranks=[5, 4, 3]).ranks == "3-5"


def test_memory_config_checks_its_fields(run_dir: Path) -> None:
    with pytest.raises(ConfigError, match=r"memory\.stacks"):
        MemoryConfig(stacks="cpp")
    with pytest.raises(ConfigError, match=r"memory\.max_entries"):
        MemoryConfig(max_entries=0)
    with pytest.raises(ConfigError, match=r"memory\.ranks"):
        ProfileConfig(output_dir=run_dir, memory=MemoryConfig(ranks="9")).check_world_size(4)
    cfg = ProfileConfig.from_dict({"output_dir": str(run_dir), "memory": {"enable": True}})
    assert cfg.memory == MemoryConfig(enable=True)
    with pytest.raises(ConfigError, match=r"memory\.depth"):
        ProfileConfig.from_dict({"memory": {"depth": 3}})


def test_nsys_refuses_an_uncompressed_trace_option() -> None:
    with pytest.raises(ConfigError, match=r"trace\.gzip=False .*nsys writes its own reports"):
        TraceConfig(tool="nsys", gzip=False)


def test_trace_options_left_idle_by_trace_enable_false_are_said_once(
    run_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from rankscope import Profiler

    trace = TraceConfig(on_signal=True, auto=AutoTrigger(enable=True))
    config = ProfileConfig(output_dir=run_dir, trace=trace)
    with caplog.at_level(logging.WARNING, logger="rankscope"):
        Profiler(config, rank=0, world_size=2)
        Profiler(config, rank=1, world_size=2)  # said by rank 0 only
    (warned,) = [r.getMessage() for r in caplog.records]
    assert warned.startswith("rankscope: trace.on_signal and trace.auto.enable set, but")
    assert "RANKSCOPE_TRACE=1" in warned
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rankscope"):
        Profiler(ProfileConfig(output_dir=run_dir), rank=0, world_size=1)
    assert caplog.records == []


@pytest.mark.parametrize(
    ("data", "field", "closest"),
    [
        ({"trace": {"shedule": {"active": 2}}}, "trace.shedule", "trace.schedule"),
        ({"trace": {"enabled": True}}, "trace.enabled", "trace.enable"),
        ({"timer": {"every_n_step": 5}}, "timer.every_n_step", "timer.every_n_steps"),
        ({"trace": {"schedule": {"warmpu": 1}}}, "trace.schedule.warmpu", "trace.schedule.warmup"),
        ({"trace": {"auto": {"ratoi": 2.0}}}, "trace.auto.ratoi", "trace.auto.ratio"),
        ({"hang": {"after": 60}}, "hang.after", "hang.after_s"),
        ({"outputdir": "runs/x"}, "outputdir", "output_dir"),
    ],
)
def test_a_misspelled_field_names_the_closest_as_a_misspelled_variable_does(
    data: dict[str, Any], field: str, closest: str
) -> None:
    with pytest.raises(ConfigError, match=rf"^{re.escape(field)}=") as info:
        ProfileConfig.from_dict(data)
    assert f"unknown field (did you mean {closest}?)" in str(info.value)
    assert info.value.field == field


def test_a_field_close_to_none_says_no_guess(tmp_path: Path) -> None:
    path = tmp_path / "profile.yaml"
    path.write_text("trace:\n  bogus: 1\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"^trace\.bogus=1 is not valid: unknown field;") as info:
        ProfileConfig.from_yaml(path)
    assert "did you mean" not in str(info.value)
    path.write_text("trace:\n  shedule:\n    active: 2\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"did you mean trace\.schedule\?"):
        ProfileConfig.from_yaml(path)


@pytest.mark.slow
def test_a_bad_config_in_a_torchrun_job_is_said_once_and_every_rank_stops(tmp_path: Path) -> None:
    # Every rank raises the same ConfigError in Profiler(); torchrun prints each one's
    # traceback, and the reason is said once, plainly, by rank 0.
    import os
    import subprocess
    import sys
    import time

    from rankscope.testing._gloo import free_port as _free_port

    from ..project.test_torchrun_example import EXAMPLE

    ranks = 4
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RANKSCOPE_")}
    # The ranks import the rankscope this test imports, wherever the job's cwd is.
    source = str(Path(rankscope.__file__).resolve().parents[1])
    clean["PYTHONPATH"] = os.pathsep.join(filter(None, [source, clean.get("PYTHONPATH")]))
    began = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc-per-node={ranks}",
            "--master-addr=127.0.0.1",
            f"--master-port={_free_port()}",
            str(EXAMPLE),
            "--steps=50",
            "--batch=8",
            f"--rankscope-output-dir={tmp_path / 'run'}",
        ],
        cwd=tmp_path,
        env={**clean, "OMP_NUM_THREADS": "1", "RANKSCOPE_TIMER_EVERY": "0"},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode != 0
    assert time.monotonic() - began < 120  # not a hang that a timeout ends
    said = [line for line in done.stderr.splitlines() if "rankscope: bad config" in line]
    assert len(said) == 1, done.stderr
    assert said[0].endswith(
        "rankscope: bad config, so every rank of this job stops: RANKSCOPE_TIMER_EVERY=0 is "
        "not valid; accepted: an int >= 1 (said by rank 0 alone)"
    )
    assert said[0].startswith("[rank0]:") or said[0].startswith("rankscope:")
    # No rank trained: the error was raised before the first step on each.
    assert not (tmp_path / "run" / "timings").exists()
    raised = {
        line.split("]")[0]
        for line in done.stderr.splitlines()
        if "ConfigError: RANKSCOPE_TIMER_EVERY=0" in line
    }
    assert raised, done.stderr  # a traceback names the error on the ranks torchrun let finish
    assert "done: 50 steps" not in done.stdout


@pytest.mark.parametrize(
    ("rank", "world_size", "said"), [(0, 4, 1), (1, 4, 0), (3, 4, 0), (0, 1, 0)]
)
def test_a_bad_config_is_logged_by_rank_0_of_a_job_alone(
    caplog: pytest.LogCaptureFixture, rank: int, world_size: int, said: int
) -> None:
    # One process alone has its traceback to read; a job's rank 0 says it for all ranks.
    with caplog.at_level(logging.ERROR, logger="rankscope"), pytest.raises(ConfigError):
        rankscope.Profiler(
            {"timer": {"every_n_steps": 0}}, rank=rank, world_size=world_size, environ={}
        )
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(lines) == said
    assert all("timer.every_n_steps=0 is not valid" in line for line in lines)
