from __future__ import annotations

import argparse
import logging
from pathlib import Path

import pytest

import rankscope
from rankscope.config._args import flag_name
from rankscope.config._config import config_fields
from rankscope.config._fields import field_docs


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="train.py")
    parser.add_argument("--lr", type=float, default=0.1)  # the script's own flags stay
    rankscope.add_arguments(parser)
    return parser


def _config(argv: list[str]) -> rankscope.ProfileConfig:
    return rankscope.ProfileConfig.from_args(_parser().parse_args(argv))


def test_no_flags_give_the_default_config() -> None:
    args = _parser().parse_args(["--lr", "0.5"])
    assert args.lr == 0.5
    assert rankscope.ProfileConfig.from_args(args) == rankscope.ProfileConfig()


def test_every_field_has_a_flag_with_its_docstring_as_help() -> None:
    fields = config_fields()
    assert len(fields) == 49  # a new field gets a flag without anyone writing one
    help_text = " ".join(_parser().format_help().split())
    for field in fields:
        assert flag_name(field) in help_text, field.name
        assert field.doc, f"{field.name} has no docstring"
        assert field.doc.split(" ")[0] in help_text
    assert field_docs(rankscope.Schedule)["active"].startswith("Steps recorded per window")


# A value other than the default for every field, written as on a command line.
_FLAGS = {
    "output_dir": ["{tmp}/run"],
    "trace.enable": [],
    "trace.ranks": ["0,2-3"],
    "trace.schedule.skip_first": ["2"],
    "trace.schedule.wait": ["3"],
    "trace.schedule.warmup": ["0"],
    "trace.schedule.active": ["4"],
    "trace.schedule.repeat": ["0"],
    "trace.target": ["phase:forward"],
    "trace.activities": ["cpu,cuda"],
    "trace.tool": ["nsys"],
    "trace.record_shapes": [],
    "trace.profile_memory": [],
    "trace.with_stack": [],
    "trace.with_flops": [],
    "trace.with_modules": [],
    "trace.gzip": None,  # on by default: --no-... turns it off
    "trace.trigger_check_every_n_steps": ["3"],
    "trace.trigger_max_steps": ["7"],
    "trace.trigger_max_windows": ["4"],
    "trace.on_signal": [],
    "trace.auto.enable": [],
    "trace.auto.ratio": ["2.5"],
    "trace.auto.consecutive": ["4"],
    "trace.auto.window_steps": ["3"],
    "trace.auto.history_steps": ["30"],
    "trace.auto.warmup_steps": ["10"],
    "trace.auto.max_captures": ["5"],
    "trace.auto.cooldown_steps": ["50"],
    "trace.auto.phase": ["forward"],
    "trace.auto.ranks": ["1-2"],
    "timer.enable": [],
    "timer.ranks": ["1,3"],
    "timer.start_step": ["5"],
    "timer.end_step": ["50"],
    "timer.every_n_steps": ["2"],
    "timer.flush_every_n_steps": ["7"],
    "timer.max_pending_events": ["99"],
    "timer.health": None,  # on by default: --no-... turns it off
    "timer.health_every_s": ["0.5"],
    "memory.enable": [],
    "memory.ranks": ["2"],
    "memory.max_entries": ["5000"],
    "memory.stacks": ["all"],
    "memory.on_oom": None,  # on by default: --no-... turns it off
    "hang.enable": None,
    "hang.after_s": ["30"],
    "hang.factor": ["4"],
    "hang.heartbeat_s": ["2.5"],
}
_EXPECTED = {
    "trace.target": "phase:forward",
    "trace.ranks": "0,2-3",
    "trace.activities": ("cpu", "cuda"),
    "trace.gzip": False,
    "trace.auto.ratio": 2.5,
    "trace.tool": "nsys",
    "trace.auto.phase": "forward",
    "trace.auto.ranks": "1-2",
    "timer.ranks": "1,3",
    "timer.health": False,
    "timer.health_every_s": 0.5,
    "memory.ranks": "2",
    "memory.stacks": "all",
    "memory.on_oom": False,
    "hang.enable": False,
    "hang.after_s": 30.0,
    "hang.factor": 4.0,
    "hang.heartbeat_s": 2.5,
}


def test_each_flag_sets_its_field_and_only_it(tmp_path: Path) -> None:
    assert set(_FLAGS) == {f.name for f in config_fields()}
    default = rankscope.ProfileConfig().to_dict()
    for field in config_fields():
        values = _FLAGS[field.name]
        flag = flag_name(field)
        argv = [flag.replace("--", "--no-", 1)] if values is None else [flag, *values]
        config = _config([a.format(tmp=tmp_path) for a in argv]).to_dict()
        got = config
        for key in field.path:
            got = got[key]
        if field.name in _EXPECTED:
            want = _EXPECTED[field.name]
        elif field.name == "output_dir":
            want = str(tmp_path / "run")
        elif values == []:
            want = True
        else:
            want = int(values[0])
        assert got == (list(want) if isinstance(want, tuple) else want), field.name
        # Everything else keeps its default.
        for other in config_fields():
            if other.name in (field.name, "output_dir"):
                continue
            a, b = config, default
            for key in other.path:
                a, b = a[key], b[key]
            assert a == b, (field.name, other.name)


def test_flags_override_the_yaml_file_and_the_rest_of_it_stays(tmp_path: Path) -> None:
    path = tmp_path / "profile.yaml"
    path.write_text(
        "output_dir: %s\ntimer: {enable: true, every_n_steps: 5}\n"
        "trace: {enable: true, ranks: '0,1', schedule: {wait: 2, active: 2}}\n" % (tmp_path / "r")
    )
    config = _config(["--rankscope-config", str(path), "--rankscope-timer-every-n-steps", "20"])
    assert config.timer.every_n_steps == 20
    assert config.timer.enable and config.trace.enable
    assert config.trace.ranks == "0-1"
    assert (config.trace.schedule.wait, config.trace.schedule.active) == (2, 2)
    assert config.output_dir == str(tmp_path / "r")
    turned_off = _config(["--rankscope-config", str(path), "--no-rankscope-timer-enable"])
    assert not turned_off.timer.enable and turned_off.trace.enable


def test_the_environment_still_wins_over_flags(tmp_path: Path) -> None:
    config = _config(["--rankscope-timer-every-n-steps", "20", "--rankscope-timer-enable"])
    profiler = rankscope.Profiler(
        config, rank=0, world_size=1, environ={"RANKSCOPE_TIMER_EVERY": "3"}
    )
    assert profiler.config.timer.every_n_steps == 3


def test_end_step_takes_none() -> None:
    config = _config(["--rankscope-timer-start-step", "4", "--rankscope-timer-end-step", "None"])
    assert config.timer.end_step is None and config.timer.start_step == 4


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rankscope-trace-schedule-active", "0"], "--rankscope-trace-schedule-active=0"),
        (["--rankscope-trace-ranks", "a-b"], "--rankscope-trace-ranks='a-b'"),
        (["--rankscope-trace-activities", "tpu"], "--rankscope-trace-activities="),
        (["--rankscope-timer-end-step", "0"], "--rankscope-timer-end-step=0"),
        (["--rankscope-output-dir", "s3://bucket/run"], "--rankscope-output-dir='s3://bucket/run'"),
    ],
)
def test_a_bad_value_names_the_flag(argv: list[str], message: str) -> None:
    with pytest.raises(rankscope.ConfigError) as caught:
        _config(argv)
    assert str(caught.value).startswith(message)


def test_a_value_of_the_wrong_type_is_argparse_s_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for argv in (["--rankscope-timer-every-n-steps", "ten"], ["--rankscope-timer-end-step", "x"]):
        with pytest.raises(SystemExit) as caught:
            _parser().parse_args(argv)
        assert caught.value.code == 2
        err = capsys.readouterr().err
        assert argv[0] in err and "Traceback" not in err


def test_a_bad_yaml_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(rankscope.ConfigError, match="path"):
        _config(["--rankscope-config", str(tmp_path / "missing.yaml")])
    bad = tmp_path / "bad.yaml"
    bad.write_text("timer: {every_n_steps: 0}\n")
    with pytest.raises(rankscope.ConfigError, match=r"timer\.every_n_steps=0"):
        _config(["--rankscope-config", str(bad)])


def test_none_on_a_flag_overrides_a_value_in_the_yaml_file(tmp_path: Path) -> None:
    path = tmp_path / "profile.yaml"
    path.write_text(
        "timer: {enable: true, end_step: 50}\n"
        "trace: {enable: true, activities: [cpu], auto: {phase: forward, ranks: all}}\n"
    )
    kept = _config(["--rankscope-config", str(path)])
    assert (kept.timer.end_step, kept.trace.auto.phase, kept.trace.auto.ranks) == (
        50,
        "forward",
        "all",
    )
    assert kept.trace.activities == ("cpu",)
    config = _config(
        [
            "--rankscope-config",
            str(path),
            "--rankscope-timer-end-step",
            "none",
            "--rankscope-trace-auto-phase",
            "none",
            "--rankscope-trace-auto-ranks",
            "None",
            "--rankscope-trace-activities",
            "none",
        ]
    )
    assert config.timer.end_step is None
    assert (config.trace.auto.phase, config.trace.auto.ranks) == (None, None)
    assert config.trace.activities is None


def test_an_output_dir_flag_is_the_only_one_resolved(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.INFO, logger="rankscope"):
        config = _config(["--rankscope-output-dir", "runs/mine"])
    assert config.output_dir == str(tmp_path / "runs" / "mine")
    resolved = [r.getMessage() for r in caplog.records if "resolved to" in r.getMessage()]
    assert resolved == [
        f"rankscope: output_dir 'runs/mine' resolved to {tmp_path / 'runs' / 'mine'}"
    ]
