"""Tests for rankscope.config._env: RANKSCOPE_* overrides, boolean parsing, launcher variables."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from rankscope import ConfigError, ProfileConfig, TimerConfig, TraceConfig
from rankscope.config import _env
from rankscope.config._env import (
    KNOWN_VARIABLES,
    EnvOverride,
    config_overrides,
    launcher_ranks,
    parse_bool,
    unknown_variables,
)

BOOL_VARIABLES = {
    "RANKSCOPE_TRACE": "enable",
    "RANKSCOPE_RECORD_SHAPES": "record_shapes",
    "RANKSCOPE_WITH_FLOPS": "with_flops",
    "RANKSCOPE_WITH_STACK": "with_stack",
    "RANKSCOPE_PROFILE_MEMORY": "profile_memory",
}

TRUE_WORDS = ["1", "true", "TRUE", "True", "yes", "YES", "Yes", "on", "ON", "oN", " true ", "1\n"]
FALSE_WORDS = ["0", "false", "FALSE", "False", "no", "NO", "No", "off", "OFF", "oFf", " off "]
BAD_WORDS = ["", "  ", "2", "-1", "y", "n", "t", "f", "enable", "truee", "yes please", "none"]


@pytest.fixture(autouse=True)
def _cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # ProfileConfig() resolves its relative default output_dir against the working directory.
    monkeypatch.chdir(tmp_path)


# -- parse_bool ---------------------------------------------------------------------


@pytest.mark.parametrize("word", TRUE_WORDS)
def test_parse_bool_true(word: str) -> None:
    assert parse_bool("RANKSCOPE_TRACE", word) is True


@pytest.mark.parametrize("word", FALSE_WORDS)
def test_parse_bool_false(word: str) -> None:
    assert parse_bool("RANKSCOPE_TRACE", word) is False


@pytest.mark.parametrize("word", BAD_WORDS)
@pytest.mark.parametrize("variable", ["RANKSCOPE_TRACE", "RANKSCOPE_WITH_STACK"])
def test_parse_bool_rejects(variable: str, word: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"{variable}={word!r}")) as info:
        parse_bool(variable, word)
    assert info.value.field == variable
    assert info.value.value == word
    assert "1/true/yes/on" in str(info.value)
    assert "0/false/no/off" in str(info.value)


# -- config_overrides -------------------------------------------------------------


def test_no_overrides_in_an_empty_environment() -> None:
    assert config_overrides({}) == []


def test_unrelated_variables_are_ignored() -> None:
    environ = {"PATH": "/bin", "RANKSCOPE": "1", "RANKSCOPE_BOGUS": "1", "rankscope_trace": "1"}
    assert config_overrides(environ) == []


@pytest.mark.parametrize("variable", [*BOOL_VARIABLES, "RANKSCOPE_OUTPUT_DIR"])
@pytest.mark.parametrize("blank", ["", " ", "\t"])
def test_blank_variables_are_ignored(variable: str, blank: str) -> None:
    assert config_overrides({variable: blank}) == []


@pytest.mark.parametrize(
    ("variable", "raw", "path", "value"),
    [
        ("RANKSCOPE_OUTPUT_DIR", "/data/runs/x", ("output_dir",), "/data/runs/x"),
        ("RANKSCOPE_TRACE", "1", ("trace", "enable"), True),
        ("RANKSCOPE_TRACE", "off", ("trace", "enable"), False),
        ("RANKSCOPE_TRACE_RANKS", "0-7,16", ("trace", "ranks"), "0-7,16"),
        ("RANKSCOPE_RECORD_SHAPES", "yes", ("trace", "record_shapes"), True),
        ("RANKSCOPE_WITH_FLOPS", "TRUE", ("trace", "with_flops"), True),
        ("RANKSCOPE_WITH_STACK", "no", ("trace", "with_stack"), False),
        ("RANKSCOPE_PROFILE_MEMORY", "On", ("trace", "profile_memory"), True),
    ],
)
def test_each_override(variable: str, raw: str, path: tuple[str, ...], value: object) -> None:
    assert config_overrides({variable: raw}) == [EnvOverride(variable, path, value)]
    assert EnvOverride(variable, path, value).field == ".".join(path)


def test_all_overrides_together() -> None:
    environ = {
        "RANKSCOPE_OUTPUT_DIR": "/x",
        "RANKSCOPE_TRACE": "1",
        "RANKSCOPE_TRACE_RANKS": "all",
        "RANKSCOPE_RECORD_SHAPES": "1",
        "RANKSCOPE_WITH_FLOPS": "1",
        "RANKSCOPE_WITH_STACK": "1",
        "RANKSCOPE_PROFILE_MEMORY": "1",
    }
    found = config_overrides(environ)
    assert {o.variable for o in found} == set(environ)
    assert {o.field for o in found} == {
        "output_dir",
        "trace.enable",
        "trace.ranks",
        "trace.record_shapes",
        "trace.with_flops",
        "trace.with_stack",
        "trace.profile_memory",
    }


@pytest.mark.parametrize("variable", list(BOOL_VARIABLES))
@pytest.mark.parametrize("raw", ["2", "maybe", "enabled"])
def test_bad_bool_override_names_the_variable(variable: str, raw: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(variable)) as info:
        config_overrides({variable: raw})
    assert info.value.field == variable


# -- ProfileConfig.with_env / from_env -------------------------------------------------


def test_from_env_without_variables_is_the_default() -> None:
    assert ProfileConfig.from_env({}) == ProfileConfig()


def test_with_env_without_variables_returns_the_same_config(tmp_path: Path) -> None:
    cfg = ProfileConfig(output_dir=tmp_path / "run", trace=TraceConfig(enable=True, ranks="3"))
    assert cfg.with_env({}) is cfg
    assert cfg.with_env({"UNRELATED": "1", "RANKSCOPE_TRACE": ""}) is cfg


@pytest.mark.parametrize(("variable", "attr"), list(BOOL_VARIABLES.items()))
@pytest.mark.parametrize(("raw", "expected"), [("1", True), ("yes", True), ("off", False)])
def test_bool_variable_sets_its_field(variable: str, attr: str, raw: str, expected: bool) -> None:
    cfg = ProfileConfig.from_env({variable: raw})
    assert getattr(cfg.trace, attr) is expected
    # nothing else moves
    others = {a: getattr(cfg.trace, a) for a in BOOL_VARIABLES.values() if a != attr}
    assert others == {a: False for a in others}


@pytest.mark.parametrize(("variable", "attr"), list(BOOL_VARIABLES.items()))
def test_environment_wins_over_the_config(variable: str, attr: str, tmp_path: Path) -> None:
    on = ProfileConfig(output_dir=tmp_path, trace=TraceConfig(**{attr: True}))
    off = ProfileConfig(output_dir=tmp_path, trace=TraceConfig(**{attr: False}))
    assert getattr(on.with_env({variable: "0"}).trace, attr) is False
    assert getattr(off.with_env({variable: "1"}).trace, attr) is True


def test_with_env_keeps_fields_no_variable_names(tmp_path: Path) -> None:
    cfg = ProfileConfig(
        output_dir=tmp_path / "run",
        trace=TraceConfig(target="phase:forward", activities=["cpu"], gzip=False, ranks="0-3"),
    )
    out = cfg.with_env({"RANKSCOPE_TRACE": "1"})
    assert out.trace.enable is True
    assert out.output_dir == cfg.output_dir
    assert out.trace.target == "phase:forward"
    assert out.trace.activities == ("cpu",)
    assert out.trace.gzip is False
    assert out.trace.ranks == "0-3"
    assert out.trace.schedule == cfg.trace.schedule
    # the original is untouched
    assert cfg.trace.enable is False


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [("0", "0"), ("all", "all"), ("ALL", "all"), ("0,8,16", "0,8,16"), ("16,0-7", "0-7,16")],
)
def test_trace_ranks_variable(raw: str, canonical: str, tmp_path: Path) -> None:
    cfg = ProfileConfig(output_dir=tmp_path, trace=TraceConfig(ranks="5"))
    assert cfg.with_env({"RANKSCOPE_TRACE_RANKS": raw}).trace.ranks == canonical


@pytest.mark.parametrize("raw", ["garbage", "0,0", "0-7,3", "-1", "all,0", "7-0", "1.5"])
def test_bad_trace_ranks_variable_is_named(raw: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"RANKSCOPE_TRACE_RANKS={raw!r}")) as info:
        ProfileConfig.from_env({"RANKSCOPE_TRACE_RANKS": raw})
    assert info.value.field == "RANKSCOPE_TRACE_RANKS"
    assert "trace.ranks" not in info.value.field


def test_output_dir_variable(tmp_path: Path) -> None:
    target = tmp_path / "from-env"
    cfg = ProfileConfig(output_dir=tmp_path / "from-config")
    assert cfg.with_env({"RANKSCOPE_OUTPUT_DIR": str(target)}).output_dir == str(target.resolve())


def test_relative_output_dir_variable_is_resolved(tmp_path: Path) -> None:
    cfg = ProfileConfig.from_env({"RANKSCOPE_OUTPUT_DIR": "runs/env"})
    assert cfg.output_dir == str(tmp_path.resolve() / "runs" / "env")


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ("s3://bucket/run", "cannot write to s3://"),
        ("gs://bucket/run", "cannot write to gs://"),
        ("hdfs://nn/run", "cannot write to hdfs://"),
    ],
)
def test_bad_output_dir_variable_is_named(raw: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=re.escape("RANKSCOPE_OUTPUT_DIR")) as info:
        ProfileConfig.from_env({"RANKSCOPE_OUTPUT_DIR": raw})
    assert info.value.field == "RANKSCOPE_OUTPUT_DIR"
    assert problem in str(info.value)
    assert "torch.profiler" in str(info.value)


def test_output_dir_variable_naming_a_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "taken").write_text("x")
    with pytest.raises(ConfigError, match="RANKSCOPE_OUTPUT_DIR") as info:
        ProfileConfig.from_env({"RANKSCOPE_OUTPUT_DIR": str(tmp_path / "taken")})
    assert "not a directory" in str(info.value)


@pytest.mark.parametrize("variable", list(BOOL_VARIABLES))
def test_bad_bool_variable_in_with_env_is_named(variable: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{variable}='sure'"):
        ProfileConfig.from_env({variable: "sure"})


def test_full_environment(tmp_path: Path) -> None:
    environ = {
        "RANKSCOPE_OUTPUT_DIR": str(tmp_path / "run"),
        "RANKSCOPE_TRACE": "yes",
        "RANKSCOPE_TRACE_RANKS": "0-7,16",
        "RANKSCOPE_RECORD_SHAPES": "on",
        "RANKSCOPE_WITH_FLOPS": "true",
        "RANKSCOPE_WITH_STACK": "1",
        "RANKSCOPE_PROFILE_MEMORY": "TRUE",
    }
    cfg = ProfileConfig.from_env(environ)
    assert cfg == ProfileConfig(
        output_dir=tmp_path / "run",
        trace=TraceConfig(
            enable=True,
            ranks="0-7,16",
            record_shapes=True,
            with_flops=True,
            with_stack=True,
            profile_memory=True,
        ),
    )


# -- launcher_ranks ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, None),
        ({"RANK": "1"}, None),
        ({"SLURM_PROCID": "1"}, None),
        ({"RANK": "1", "WORLD_SIZE": "2"}, (1, 1, 2, 2)),
        (
            {"RANK": "9", "WORLD_SIZE": "16", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "8"},
            (9, 1, 16, 8),
        ),
        ({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1"}, (5, 1, 8, 8)),
        (
            {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_NTASKS_PER_NODE": "4"},
            (5, 5, 8, 4),
        ),
        (
            {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_TASKS_PER_NODE": "2(x4)"},
            (5, 5, 8, 2),
        ),
        (
            {"RANK": "0", "WORLD_SIZE": "2", "SLURM_PROCID": "5", "SLURM_NTASKS": "8"},
            (0, 0, 2, 2),
        ),
    ],
)
def test_launcher_ranks(environ: dict[str, str], expected: tuple[int, ...] | None) -> None:
    assert launcher_ranks(environ) == expected


# -- the timer's variables ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"RANKSCOPE_TIMER": "on"}, TimerConfig(enable=True)),
        ({"RANKSCOPE_TIMER": "0"}, TimerConfig(enable=False)),
        ({"RANKSCOPE_TIMER_RANKS": "0-3"}, TimerConfig(ranks="0-3")),
        ({"RANKSCOPE_TIMER_EVERY": " 5 "}, TimerConfig(every_n_steps=5)),
        (
            {
                "RANKSCOPE_TIMER": "yes",
                "RANKSCOPE_TIMER_EVERY": "1",
                "RANKSCOPE_TIMER_RANKS": "all",
            },
            TimerConfig(enable=True, every_n_steps=1),
        ),
    ],
)
def test_timer_variables(environ: dict[str, str], expected: TimerConfig) -> None:
    assert ProfileConfig.from_env(environ).timer == expected


def test_timer_variables_override_the_config(tmp_path: Path) -> None:
    config = ProfileConfig(output_dir=tmp_path, timer=TimerConfig(enable=False, every_n_steps=100))
    got = config.with_env({"RANKSCOPE_TIMER": "1", "RANKSCOPE_TIMER_EVERY": "2"})
    assert got.timer == TimerConfig(enable=True, every_n_steps=2)
    assert got.trace == config.trace


@pytest.mark.parametrize(
    ("variable", "raw"),
    [
        ("RANKSCOPE_TIMER", "maybe"),
        ("RANKSCOPE_TIMER_RANKS", "0,0"),
        ("RANKSCOPE_TIMER_RANKS", "all,1"),
        ("RANKSCOPE_TIMER_EVERY", "0"),
        ("RANKSCOPE_TIMER_EVERY", "ten"),
        ("RANKSCOPE_TIMER_EVERY", "1.5"),
        ("RANKSCOPE_TIMER_EVERY", "1_0"),
    ],
)
def test_bad_timer_variable_is_named(variable: str, raw: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{variable}=") as info:
        ProfileConfig.from_env({variable: raw})
    assert info.value.field == variable


# -- unknown RANKSCOPE_* variables ----------------------------------------------------------


@pytest.fixture
def fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forget which unknown variables this process warned about already."""
    monkeypatch.setattr(_env, "_warned", set())


def _env_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.usefixtures("fresh_warnings")
@pytest.mark.parametrize(
    ("variable", "closest"),
    [
        ("RANKSCOPE_TIMER_EVRY", "RANKSCOPE_TIMER_EVERY"),
        ("RANKSCOPE_TRACE_RANK", "RANKSCOPE_TRACE_RANKS"),
        ("RANKSCOPE_PROFILE_MEM", "RANKSCOPE_PROFILE_MEMORY"),
        ("RANKSCOPE_OUTPUTDIR", "RANKSCOPE_OUTPUT_DIR"),
    ],
)
def test_a_misspelled_variable_is_warned_about_once_naming_the_closest(
    caplog: pytest.LogCaptureFixture, variable: str, closest: str
) -> None:
    environ = {variable: "3"}
    with caplog.at_level(logging.WARNING, logger="rankscope"):
        assert ProfileConfig.from_env(environ) == ProfileConfig()
        ProfileConfig.from_env(environ)  # every Profiler reads it: still one warning
    (warned,) = _env_warnings(caplog)
    assert warned.startswith(f"rankscope: {variable}='3' is not a variable rankscope reads")
    assert f"did you mean {closest}?" in warned
    assert unknown_variables(environ) == {variable: closest}


@pytest.mark.usefixtures("fresh_warnings")
def test_an_unknown_variable_close_to_none_lists_the_config_variables(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="rankscope"):
        assert config_overrides({"RANKSCOPE_BOGUS": "1", "RANKSCOPE_TRACE": "1"}) != []
    (warned,) = _env_warnings(caplog)
    assert "RANKSCOPE_BOGUS='1'" in warned and "did you mean" not in warned
    assert "RANKSCOPE_TIMER_EVERY" in warned and "RANKSCOPE_WRITE_DOCS" not in warned


@pytest.mark.usefixtures("fresh_warnings")
def test_known_blank_and_other_variables_are_not_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    environ = {
        **{name: "1" for name in KNOWN_VARIABLES if name != "RANKSCOPE_OUTPUT_DIR"},
        "RANKSCOPE_TIMER_EVERY": "2",
        "RANKSCOPE_TRACE_RANKS": "0",
        "RANKSCOPE_MEMORY_RANKS": "0",
        "RANKSCOPE_TIMER_RANKS": "0",
        "RANKSCOPE_TIMER_EVRY": " ",  # set, but blank: ignored like a blank known one
        "RANKSCOPE": "1",
        "RANKSCOPEX_TRACE": "1",
        "rankscope_timer_evry": "1",
        "PATH": "/bin",
    }
    with caplog.at_level(logging.WARNING, logger="rankscope"):
        config_overrides(environ)
    assert _env_warnings(caplog) == []
    assert unknown_variables(environ) == {}


def test_every_variable_the_project_names_is_known() -> None:
    """The list the warning checks against is the list the source and the docs use."""
    root = Path(__file__).resolve().parents[2]
    named: set[str] = set()
    for path in [*(root / "src").rglob("*.py"), *(root / "docs").rglob("*.md")]:
        named.update(re.findall(r"RANKSCOPE_[A-Z][A-Z0-9_]*[A-Z0-9]", path.read_text()))
    assert named, "no RANKSCOPE_* variable found: the search is broken"
    example = {"RANKSCOPE_TIMER_EVRY"}  # the misspelling the docs show the warning for
    assert sorted(named - set(KNOWN_VARIABLES) - example) == []
