"""rankscope inside slime (integrations/slime.py), through slime's documented hooks.

slime is not on the package index (it installs from source with Megatron-LM and
SGLang), so no test here imports it. The job below calls the two functions exactly as
slime does: `init(args)` at the end of Megatron's initialisation, and
`before_train_step(args, rollout_id, step_id, model, optimizer, opt_param_scheduler)`
in `train_one_step` after the gradients are zeroed; `args` holds slime's and Megatron's
field names with their defaults. The ranks are real gloo ranks; each train step is
shaped as Megatron's schedule runs it without overlap: the batch, forward and backward,
then the model chunk's `config.finalize_model_grads_func` (here an all-reduce of every
gradient, as Megatron's data-parallel finish_grad_sync does), then `optimizer.step()`;
a rollout's train steps follow a short generation stand-in.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from rankscope._errors import ConfigError
from rankscope.cli import main
from rankscope.integrations import slime
from rankscope.testing._gloo import GlooRanks

from .._helpers import measured_saving_ms

ROLLOUTS, STEPS, SLOW_RANK, SLOW_FROM, SLEEP_S = 12, 8, 1, 6, 0.02


def _args(**over: Any) -> argparse.Namespace:
    """slime's arguments as its parser leaves them, the profiling ones at their defaults."""
    fields: dict[str, Any] = {
        "use_pytorch_profiler": False,
        "profile_step_start": 10,
        "profile_step_end": 12,
        "profile_ranks": [0],
        "profile_target": ["train_overall"],
        "record_memory_history": False,
        "memory_recorder": "torch",
        "memory_snapshot_num_steps": None,
        "memory_snapshot_dir": ".",
        "tensorboard_dir": None,
        "num_steps_per_rollout": None,
        "num_rollout": 3000,
        "rollout_batch_size": 16,
        "n_samples_per_prompt": 4,
        "global_batch_size": 8,  # 16 * 4 // 8: 8 train steps a rollout
        "custom_megatron_init_path": "rankscope.integrations.slime.init",
        "custom_megatron_before_train_step_hook_path": "rankscope.integrations.slime.before_train_step",
    }
    fields.update(over)
    return argparse.Namespace(**fields)


def _slime_like_job(rank: int, world: int, out: str, slow: bool = True) -> None:
    """Rank SLOW_RANK's get_batch takes 20 ms longer from rollout SLOW_FROM; not `slow`:
    the same job clean."""
    from importlib import import_module
    from types import SimpleNamespace

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def finalize_model_grads(chunks: list[Any], *_: Any) -> None:
        for chunk in chunks:
            for param in chunk.parameters():
                dist.all_reduce(param.grad)
                param.grad /= world

    model.config = SimpleNamespace(finalize_model_grads_func=finalize_model_grads)
    # slime's --custom-config-path YAML sets `rankscope` on args. The clean run says how
    # many rollouts there are (its last step ends the run); the other does not (its last
    # rollout's records are flushed at that rollout's end). Ranks exit without atexit,
    # as Ray's actors do.
    args = _args(
        rankscope={"output_dir": out, "timer": {"every_n_steps": 1}},
        num_rollout=None if slow else ROLLOUTS,
    )
    # What slime.utils.misc.load_function does with the two flags.
    hooks = {}
    for flag in ("custom_megatron_init_path", "custom_megatron_before_train_step_hook_path"):
        module, _, name = getattr(args, flag).rpartition(".")
        hooks[flag] = getattr(import_module(module), name)
    hooks["custom_megatron_init_path"](args)
    truth = []
    for rollout_id in range(ROLLOUTS):
        time.sleep(0.01)  # the rollout: generation and rewards, off the train step
        for step_id in range(STEPS):
            began = time.perf_counter()
            opt.zero_grad()
            hooks["custom_megatron_before_train_step_hook_path"](
                args, rollout_id, step_id, [model], opt, None
            )
            batch = torch.randn(32, 64)  # get_batch
            if slow and rank == SLOW_RANK and rollout_id >= SLOW_FROM:
                time.sleep(SLEEP_S)
            model(batch).square().mean().backward()
            model.config.finalize_model_grads_func([model])  # Megatron's schedule calls it
            opt.step()
            truth.append(time.perf_counter() - began)
    dist.barrier()
    (Path(out) / f"truth-{rank}.json").write_text(json.dumps(truth))


@pytest.fixture(scope="module")
def slime_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("slime-run")
    GlooRanks(tmp_path_factory.mktemp("gloo")).run(_slime_like_job, 3, str(out))
    return out


@pytest.fixture(scope="module")
def slime_clean_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("slime-clean")
    GlooRanks(tmp_path_factory.mktemp("gloo")).run(_slime_like_job, 3, str(out), False)
    return out


def _stragglers(run: Path, capsys: pytest.CaptureFixture[str]) -> Any:
    capsys.readouterr()
    assert main(["stragglers", str(run), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.serial  # a truth measured against the clock: other workers' load bends it
@pytest.mark.slow
def test_stragglers_names_the_rank_slow_in_its_data_and_the_ranks_that_wait(
    slime_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = _stragglers(slime_run, capsys)
    slow = [f for f in report["findings"] if f["role"] == "slow"]
    waits = {(f["rank"], f["phase"]) for f in report["findings"] if f["role"] == "waits"}
    assert [(f["rank"], f["phase"]) for f in slow] == [(SLOW_RANK, "data")], report["findings"]
    assert waits == {(0, "grad_sync"), (2, "grad_sync")}, report["findings"]
    capsys.readouterr()
    assert (
        main(["sql", str(slime_run), "select count(distinct step) as n from timings", "--json"])
        == 0
    )
    assert json.loads(capsys.readouterr().out) == [{"n": ROLLOUTS * STEPS}]
    # Steps are numbered by rollout: the onset is rollout SLOW_FROM's first train step.
    first = SLOW_FROM * STEPS
    assert first <= slow[0]["since_step"] <= first + 2
    truth = json.loads((slime_run / f"truth-{SLOW_RANK}.json").read_text())
    saving = measured_saving_ms(truth, slice(8, first), slice(first + 2, None))
    price = slow[0]["cost"]["step_ms_saved"]
    assert 0.7 <= price / saving <= 1.4, (price, saving)


@pytest.mark.slow
def test_the_same_job_clean_gets_no_finding_and_every_phase_is_timed(
    slime_clean_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = _stragglers(slime_clean_run, capsys)
    assert report["findings"] == [] and report.get("imbalance", []) == [], report["findings"]
    capsys.readouterr()
    query = "select phase, count(*) as n, count(distinct step) as steps from timings group by phase"
    assert main(["sql", str(slime_clean_run), query, "--json"]) == 0
    rows = {r["phase"]: (r["n"], r["steps"]) for r in json.loads(capsys.readouterr().out)}
    steps = ROLLOUTS * STEPS
    for phase in ("data", "forward_backward", "grad_sync", "optimizer"):
        assert rows[phase] == (3 * steps, steps), (phase, rows)
    assert set(rows) >= {"data", "forward_backward", "grad_sync", "optimizer", "between_steps"}


def test_megatron_profiling_fields_map_onto_rankscopes(tmp_path: Path) -> None:
    # Rollouts 3 and 4 traced, 8 train steps a rollout: train steps 24-39, one warm-up before.
    args = _args(
        use_pytorch_profiler=True,
        profile_step_start=3,
        profile_step_end=5,
        profile_ranks=[0, 2],
        record_memory_history=True,
        tensorboard_dir=str(tmp_path / "tb"),
    )
    config = slime.config_from_args(args, environ={})
    assert config.output_dir == str(tmp_path / "tb" / "rankscope")
    assert config.trace.enable and config.trace.ranks == "0,2"
    schedule = config.trace.schedule
    assert (schedule.skip_first, schedule.warmup, schedule.active, schedule.repeat) == (
        23,
        1,
        16,
        1,
    )
    assert config.memory.enable and config.memory.ranks == "0,2"
    assert config.timer.enable
    # slime's own profiler turns all four on; rankscope keeps them off unless asked.
    trace = config.trace
    assert not (trace.record_shapes or trace.with_stack or trace.profile_memory or trace.with_flops)
    # Megatron's default profile_ranks: rank 0 alone; rankscope's own section wins.
    own = slime.config_from_args(
        _args(use_pytorch_profiler=True, rankscope={"trace": {"ranks": "all", "with_stack": True}}),
        environ={},
    )
    assert own.trace.ranks == "all" and own.trace.with_stack
    assert slime.config_from_args(_args(use_pytorch_profiler=True), environ={}).trace.ranks == "0"
    # Nothing asked: the timer alone, in the default run directory.
    plain = slime.config_from_args(_args(), environ={})
    assert plain.timer.enable and not plain.trace.enable and not plain.memory.enable


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"use_pytorch_profiler": True, "profile_target": ["train_log_probs"]}, "profile_target"),
        ({"use_pytorch_profiler": True, "profile_step_end": 10}, "profile_step_end"),
        ({"use_pytorch_profiler": True, "profile_ranks": [-1]}, "profile_ranks"),
        ({"use_pytorch_profiler": True, "global_batch_size": 128}, "global_batch_size"),
        ({"record_memory_history": True, "memory_recorder": "memray"}, "memory_recorder"),
        (
            {"record_memory_history": True, "memory_snapshot_num_steps": 3},
            "memory_snapshot_num_steps",
        ),
        ({"rankscope": {"timer": {"every_n_steps": 0}}}, "every_n_steps"),
        ({"rankscope": 3}, "rankscope"),
    ],
)
def test_a_value_with_no_rankscope_meaning_names_slimes_field(
    over: dict[str, Any], field: str
) -> None:
    with pytest.raises(ConfigError, match=field):
        slime.config_from_args(_args(**over), environ={})


def test_a_fault_inside_rankscope_turns_it_off_and_training_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run = slime._SlimeRun()  # this process's run, apart from the module's own
    args = _args(rankscope={"output_dir": str(tmp_path / "run")})
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = model.weight.detach().clone()
    run.train_step(args, 0, 0, [model], opt)
    assert run.profiler is not None

    def broken() -> None:
        raise RuntimeError("disk full")

    run.profiler.step = broken  # type: ignore[method-assign]
    model(torch.ones(2, 4)).sum().backward()
    opt.step()  # rankscope's step fails inside it: the update still happens
    assert not torch.equal(model.weight, before)
    assert run.off and run.profiler is None
    assert "the slime integration is off for the rest of the run" in caplog.text
    assert "disk full" in caplog.text
    run.train_step(args, 0, 1, [model], opt)  # off: the hooks pass through
    opt.step()
