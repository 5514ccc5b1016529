"""rankscope inside SkyRL (integrations/skyrl.py), through SkyRL's own worker and profiler.

SkyRL installs from the package index (`make test-frameworks`); without it these tests
skip. The policy worker below is a subclass of SkyRL's `PolicyWorkerBase`, made after
`install_worker()` as Ray's setup hook runs it before a worker's modules are imported,
its profiler built by SkyRL's own `build_profiler_from_policy_cfg` from a real
`TorchProfilerConfig`, and driven through SkyRL's own `start_profile`, `profile_step`,
`stop_profile`. Its methods stand in for FSDP's (SkyRL's need a GPU and a model): the
log-prob forward, then per mini-batch forward_backward (gradients all-reduced) and
optim_step, then the async weight sync, each dispatched to every rank at once and
gathered before the next, as SkyRL's trainer does. The ranks are real gloo ranks; a real
local Ray cluster runs the setup hook that `install()` gives SkyRL's `ray.init`.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import typing
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

if sys.version_info < (3, 12):
    # SkyRL 0.3 says it runs on Python 3.11, but on 3.11 pydantic refuses the typing
    # TypedDict its worker's imports use; typing_extensions' serves (a test shim).
    import typing_extensions

    typing.TypedDict = typing_extensions.TypedDict  # type: ignore[misc]

pytest.importorskip("skyrl.backends.skyrl_train.workers.worker")

from skyrl.train.config.config import TorchProfilerConfig

from rankscope._errors import ConfigError
from rankscope.cli import main
from rankscope.integrations import skyrl as adapter
from rankscope.testing._gloo import GlooRanks

from .._helpers import measured_saving_ms

STEPS, SLOW_RANK, SLOW_FROM, SLEEP_S, MINI_BATCHES = 40, 1, 16, 0.02, 2


class _TrainerConfig:
    """The part of SkyRL's trainer config that its profiler builder reads."""

    def __init__(self, profiler: TorchProfilerConfig) -> None:
        self.policy = type("Policy", (), {"torch_profiler_config": profiler})()


def _worker_class() -> type:
    """A policy worker as SkyRL's FSDP one is: a PolicyWorkerBase subclass whose own
    methods override the base's, made after install_worker()."""
    from skyrl.backends.skyrl_train.utils.profiler import build_profiler_from_policy_cfg
    from skyrl.backends.skyrl_train.workers.worker import PolicyWorkerBase

    class Worker(PolicyWorkerBase):
        def __init__(self, rank: int, world: int, out: str, slow: bool) -> None:
            # Not SkyRL's __init__: it starts Ray's actor machinery.
            self.rank, self.world, self.slow, self.step_now = rank, world, slow, 0
            config = TorchProfilerConfig(
                enable=True, ranks=[0], save_path=out, skip_first=4, warmup=1, active=1
            )
            self.profiler = build_profiler_from_policy_cfg(_TrainerConfig(config))
            torch.manual_seed(0)
            self.model = torch.nn.Sequential(
                torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1)
            )
            self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)

        def forward(self, data: torch.Tensor) -> torch.Tensor:
            if self.slow and self.rank == SLOW_RANK and self.step_now >= SLOW_FROM:
                time.sleep(SLEEP_S)
            with torch.no_grad():
                return self.model(data)

        def forward_backward(self, data: torch.Tensor) -> float:
            self.opt.zero_grad()
            loss = self.model(data).square().mean()
            loss.backward()
            for param in self.model.parameters():
                dist.all_reduce(param.grad)
                param.grad /= self.world
            return float(loss)

        def optim_step(self) -> float:
            self.opt.step()
            return 0.0

        async def broadcast_to_inference_engines(self, *args: Any, **kwargs: Any) -> None:
            await asyncio.sleep(0.001)

    return Worker


def _skyrl_like_job(rank: int, world: int, out: str, slow: bool = True) -> None:
    os.environ[adapter.CONFIG_VARIABLE] = json.dumps({"timer": {"every_n_steps": 1}})
    adapter.install_worker()
    worker = _worker_class()(rank, world, out, slow)
    assert isinstance(worker.profiler, adapter.SkyRLProfiler)
    truth = []
    worker.start_profile()  # SkyRL's own RPC, before the loop
    for step in range(STEPS):
        began = time.perf_counter()
        worker.step_now = step
        dist.barrier()  # the trainer dispatches each call to every rank at once
        worker.forward(torch.randn(32, 64))
        dist.barrier()  # ...and gathers every rank's results before the next
        for _ in range(MINI_BATCHES):
            worker.forward_backward(torch.randn(16, 64))
            dist.barrier()
            worker.optim_step()
            dist.barrier()
        worker.profile_step()
        asyncio.run(worker.broadcast_to_inference_engines(None, None))
        dist.barrier()
        truth.append(time.perf_counter() - began)
    worker.stop_profile()
    (Path(out) / f"truth-{rank}.json").write_text(json.dumps(truth))


@pytest.fixture(scope="module")
def skyrl_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("skyrl-run")
    GlooRanks(tmp_path_factory.mktemp("gloo")).run(_skyrl_like_job, 3, str(out))
    return out


@pytest.fixture(scope="module")
def skyrl_clean_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("skyrl-clean")
    GlooRanks(tmp_path_factory.mktemp("gloo")).run(_skyrl_like_job, 3, str(out), False)
    return out


def _stragglers(run: Path, capsys: pytest.CaptureFixture[str]) -> Any:
    capsys.readouterr()
    assert main(["stragglers", str(run / "rankscope"), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_rank_slow_in_its_forward_is_named_with_the_ranks_that_wait_and_priced(
    skyrl_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = _stragglers(skyrl_run, capsys)
    slow = [f for f in report["findings"] if f["role"] == "slow"]
    waits = {f["rank"] for f in report["findings"] if f["role"] == "waits"}
    assert [(f["rank"], f["phase"]) for f in slow] == [(SLOW_RANK, "forward")], report
    assert not any("pipeline" in note for note in report["notes"]), report["notes"]
    assert waits == {0, 2}, report["findings"]
    assert SLOW_FROM - 1 <= slow[0]["since_step"] <= SLOW_FROM + 2
    truth = json.loads((skyrl_run / f"truth-{SLOW_RANK}.json").read_text())
    saving = measured_saving_ms(truth, slice(5, SLOW_FROM - 1), slice(SLOW_FROM + 2, None))
    price = slow[0]["cost"]["step_ms_saved"]
    assert 0.7 <= price / saving <= 1.4, (price, saving)


def test_the_same_job_clean_gets_no_finding_and_skyrls_schedule_traces_rank_0(
    skyrl_clean_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = _stragglers(skyrl_clean_run, capsys)
    assert report["findings"] == [] and report.get("imbalance", []) == [], report["findings"]
    capsys.readouterr()
    query = "select phase, count(distinct step) as steps, sum(1) as n from timings group by phase"
    assert main(["sql", str(skyrl_clean_run / "rankscope"), query, "--json"]) == 0
    rows = {r["phase"]: r["steps"] for r in json.loads(capsys.readouterr().out)}
    for phase in ("forward", "forward_backward", "optim_step", "weight_sync"):
        assert rows[phase] >= STEPS - 1, (phase, rows)
        assert rows[adapter.AFTER + phase] >= STEPS - 2, (phase, rows)
    # The second mini-batch's gaps have names of their own: no comm phase repeats in a
    # step, so the analysis does not take the job for a pipeline.
    for phase in ("forward_backward", "optim_step"):
        assert rows[f"{adapter.AFTER}{phase}_2"] >= STEPS - 2, (phase, rows)
    assert not any("pipeline" in note for note in report["notes"]), report["notes"]
    # SkyRL's schedule (skip_first=4, warmup=1, active=1) in profile_step calls, rank 0.
    traces = skyrl_clean_run / "rankscope" / "traces"
    windows = sorted(p.name for p in traces.iterdir())
    assert len(windows) == 1 and windows[0].startswith("step-000005-000005"), windows
    assert sorted(p.name for p in (traces / windows[0]).glob("rank-*.pt.trace.json*")) == [
        "rank-00000.pt.trace.json.gz"
    ]


def test_skyrls_profiler_fields_map_onto_rankscopes(tmp_path: Path) -> None:
    config = TorchProfilerConfig(
        enable=True,
        ranks=[0, 2],
        save_path=str(tmp_path),
        skip_first=3,
        wait=1,
        warmup=2,
        active=4,
        repeat=0,
        activities=["CUDA"],
        record_shapes=False,
        with_stack=False,
        profile_memory=True,
        with_flops=True,
    )
    mapped = adapter.config_from_profiler(config, environ={})
    assert mapped.output_dir == str(tmp_path / "rankscope")
    trace = mapped.trace
    assert (trace.enable, trace.ranks, trace.target) == (True, "0,2", "step")
    s = trace.schedule
    assert (s.skip_first, s.wait, s.warmup, s.active, s.repeat) == (3, 1, 2, 4, 0)
    assert list(trace.activities or []) == ["cuda"]
    assert trace.profile_memory and trace.with_flops
    assert not (trace.record_shapes or trace.with_stack or trace.with_modules)
    assert mapped.timer.enable and mapped.timer.ranks == "all"
    # install(config)'s own fields win over what is mapped; RANKSCOPE_* over both.
    own = {adapter.CONFIG_VARIABLE: json.dumps({"trace": {"enable": False}})}
    assert not adapter.config_from_profiler(config, own).trace.enable
    env = {**own, "RANKSCOPE_TRACE": "1"}
    assert adapter.config_from_profiler(config, env).with_env(env).trace.enable


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"export_type": "stacks"}, "export_type"),
        ({"ranks": [0, -1]}, "ranks"),
        ({"save_path": None}, "save_path"),
    ],
)
def test_a_skyrl_value_with_no_rankscope_meaning_names_its_field(
    tmp_path: Path, over: dict[str, Any], field: str
) -> None:
    fields = {"enable": True, "save_path": str(tmp_path), "with_stack": True, **over}
    with pytest.raises(ConfigError) as info:
        adapter.config_from_profiler(TorchProfilerConfig(**fields), environ={})
    assert info.value.field == f"trainer.policy.torch_profiler_config.{field}"


def test_skyrls_fsdp_colocation_check_stands_only_where_a_trace_holds_parameters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    adapter.install_worker()
    config = TorchProfilerConfig(enable=True, save_path=str(tmp_path))
    colocated = {"strategy": "fsdp", "colocate_all": True, "fsdp_cpu_offload": False}
    with pytest.raises(ValueError, match="colocation"):
        config.validate(**colocated)  # a trace window: SkyRL's reason holds
    monkeypatch.setenv("RANKSCOPE_TRACE", "0")
    config.validate(**colocated)  # the timer alone holds no parameter


def _hooked_actors() -> list[bool]:
    import ray

    @ray.remote
    class Actor:
        def run(self) -> bool:
            if sys.version_info < (3, 12):  # the shim at the top of this file, in Ray's worker
                import typing_extensions

                typing.TypedDict = typing_extensions.TypedDict  # type: ignore[misc]
            from skyrl.backends.skyrl_train.utils import profiler

            return profiler.Profiler is adapter.SkyRLProfiler and bool(
                os.environ.get("RANKSCOPE_TIMER_EVERY")
            )

    actors = [Actor.remote() for _ in range(2)]
    return ray.get([a.run.remote() for a in actors])


def test_install_gives_skyrls_ray_init_the_hook_that_reaches_every_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ray = pytest.importorskip("ray")
    monkeypatch.setenv("RANKSCOPE_TIMER_EVERY", "1")
    monkeypatch.setattr(ray, "init", ray.init)  # install() wraps it; put it back after
    adapter.install()
    ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {}}, log_to_driver=False)
    try:
        assert _hooked_actors() == [True, True]
        with pytest.raises(ConfigError) as info:
            adapter.install()  # Ray started: too late to reach the workers
        assert info.value.field == "ray"
    finally:
        ray.shutdown()


def test_a_setup_hook_of_the_users_own_runs_after_rankscopes() -> None:
    init = adapter._with_hook(lambda **kwargs: kwargs)
    given = {"worker_process_setup_hook": "my_project.setup", "env_vars": {"A": "1"}}
    env = init(runtime_env=given)["runtime_env"]
    assert env["worker_process_setup_hook"] == adapter.HOOK
    assert env["env_vars"]["A"] == "1"
    assert env["env_vars"][adapter.THEN_VARIABLE] == "my_project.setup"
    with pytest.raises(ConfigError) as info:
        init(runtime_env={"worker_process_setup_hook": print})
    assert info.value.field == "runtime_env.worker_process_setup_hook"


def test_the_launcher_installs_then_runs_skyrls_entry_module_with_its_arguments(
    tmp_path: Path,
) -> None:
    import subprocess

    (tmp_path / "entry_point.py").write_text(
        "import sys, ray\nprint(getattr(ray.init, '_rankscope', False), sys.argv[1:])\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    launch = [sys.executable, "-m", "rankscope.integrations.skyrl"]
    ran = subprocess.run(
        [*launch, "entry_point", "trainer.epochs=1"],
        check=False,
        env=env,
        capture_output=True,
        text=True,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "True ['trainer.epochs=1']"
    usage = subprocess.run(launch, check=False, env=env, capture_output=True, text=True)
    assert usage.returncode == 2 and "usage:" in usage.stderr
