"""rankscope inside verl (integrations/verl.py), through verl's own profiler classes.

verl installs from the package index (`make test-frameworks`); without it these tests
skip. The workers below are built as verl's are: a class that mixes in verl's
`DistProfilerExtension` around a `DistProfiler(rank, config=ProfilerConfig(...))` and
whose methods carry `@DistProfiler.annotate(role=...)`, defined after `install()` as
Ray's setup hook runs it before a worker's modules are imported. The ranks are real
gloo ranks; each PPO step is driven as verl's controller drives its workers: the
profiled steps bracketed by `start_profile(role="e2e", profile_step=N)` and
`stop_profile()`, the rollout (its batch's meta_info carries the step), then the log
probs and the update, whose gradients are all-reduced. A real local Ray cluster runs the
setup hook the way verl's `ray_kwargs.ray_init.runtime_env` passes it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

pytest.importorskip("verl")

from verl.utils.profiler import ProfilerConfig
from verl.utils.profiler.config import TorchProfilerToolConfig

from rankscope._errors import ConfigError
from rankscope.cli import main
from rankscope.integrations import verl as adapter
from rankscope.testing._gloo import GlooRanks

from .._helpers import measured_saving_ms

STEPS, SLOW_RANK, SLOW_FROM, SLEEP_S, PROFILED = 40, 1, 16, 0.02, 5


def _worker_class() -> type:
    """A worker as verl writes one, its class made after install() (as Ray imports it)."""
    from verl.utils.profiler import DistProfiler, DistProfilerExtension

    class Worker(DistProfilerExtension):
        def __init__(self, rank: int, world: int, out: str, slow: bool) -> None:
            self.rank, self.world, self.slow = rank, world, slow
            config = ProfilerConfig(
                tool="rankscope",
                enable=True,
                ranks=[],
                save_path=out,
                tool_config={"rankscope": {"timer": {"every_n_steps": 1}}},
            )
            DistProfilerExtension.__init__(self, DistProfiler(rank=rank, config=config))
            torch.manual_seed(0)
            self.model = torch.nn.Sequential(
                torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1)
            )
            self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)

        @DistProfiler.annotate(color="red", role="rollout_generate")
        def generate_sequences(self, prompts: Any) -> torch.Tensor:
            step = prompts.meta_info["global_steps"]
            if self.slow and self.rank == SLOW_RANK and step >= SLOW_FROM:
                time.sleep(SLEEP_S)
            return torch.randn(32, 64)

        @DistProfiler.annotate(color="blue", role="actor_compute_log_prob")
        def compute_log_prob(self, batch: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                return self.model(batch)

        @DistProfiler.annotate(color="red", role="actor_update")
        def update_actor(self, batch: torch.Tensor) -> None:
            self.opt.zero_grad()
            self.model(batch).square().mean().backward()
            for param in self.model.parameters():
                dist.all_reduce(param.grad)
                param.grad /= self.world
            self.opt.step()

    return Worker


class _Prompts:
    """verl's DataProto as the worker reads it: the controller sets meta_info."""

    def __init__(self, step: int) -> None:
        self.meta_info = {"global_steps": step}


def _verl_like_job(rank: int, world: int, out: str, slow: bool = True) -> None:
    adapter.install()
    worker = _worker_class()(rank, world, out, slow)
    truth = []
    for step in range(1, STEPS + 1):  # verl counts its steps from 1
        began = time.perf_counter()
        dist.barrier()  # the controller dispatches each call to every rank at once
        if step == PROFILED:
            worker.start_profile(role="e2e", profile_step=step)
        batch = worker.generate_sequences(_Prompts(step))
        dist.barrier()  # ...and gathers every rank's results before the next
        worker.compute_log_prob(batch)
        dist.barrier()
        worker.update_actor(batch)
        dist.barrier()
        if step == PROFILED:
            worker.stop_profile()
        truth.append(time.perf_counter() - began)
    (Path(out) / f"truth-{rank}.json").write_text(json.dumps(truth))


@pytest.fixture(scope="module")
def verl_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("verl-run")
    GlooRanks(tmp_path_factory.mktemp("gloo")).run(_verl_like_job, 3, str(out))
    return out


@pytest.fixture(scope="module")
def verl_clean_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("verl-clean")
    GlooRanks(tmp_path_factory.mktemp("gloo")).run(_verl_like_job, 3, str(out), False)
    return out


def _stragglers(run: Path, capsys: pytest.CaptureFixture[str]) -> Any:
    capsys.readouterr()
    assert main(["stragglers", str(run / "rankscope"), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_rank_slow_in_its_rollout_is_named_with_the_ranks_that_wait_and_priced(
    verl_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = _stragglers(verl_run, capsys)
    slow = [f for f in report["findings"] if f["role"] == "slow"]
    waits = {f["rank"] for f in report["findings"] if f["role"] == "waits"}
    assert [(f["rank"], f["phase"]) for f in slow] == [(SLOW_RANK, "rollout_generate")], report
    assert waits == {0, 2}, report["findings"]
    assert SLOW_FROM <= slow[0]["since_step"] <= SLOW_FROM + 2
    truth = json.loads((verl_run / f"truth-{SLOW_RANK}.json").read_text())
    saving = measured_saving_ms(truth, slice(5, SLOW_FROM - 1), slice(SLOW_FROM + 2, None))
    price = slow[0]["cost"]["step_ms_saved"]
    assert 0.7 <= price / saving <= 1.4, (price, saving)


def test_the_same_job_clean_gets_no_finding_and_the_profiled_step_is_traced_on_rank_0(
    verl_clean_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = _stragglers(verl_clean_run, capsys)
    assert report["findings"] == [] and report.get("imbalance", []) == [], report["findings"]
    capsys.readouterr()
    query = "select phase, count(distinct step) as steps, min(step) as first from timings group by phase"
    assert main(["sql", str(verl_clean_run / "rankscope"), query, "--json"]) == 0
    rows = {r["phase"]: (r["steps"], r["first"]) for r in json.loads(capsys.readouterr().out)}
    # A worker's step ends where the next begins: the run's last is never written.
    roles = ("rollout_generate", "actor_compute_log_prob", "actor_update")
    for phase in (*roles, *(adapter.AFTER + role for role in roles)):
        assert rows[phase] == (STEPS - 1, 1), (phase, rows)
    # verl's global_profiler.steps: the controller's start/stop around step PROFILED.
    traces = verl_clean_run / "rankscope" / "traces"
    window = f"step-{PROFILED:06d}-{PROFILED:06d}-verl"
    assert sorted(p.name for p in traces.iterdir()) == [window]
    assert sorted(p.name for p in (traces / window).glob("rank-*.pt.trace.json*")) == [
        "rank-00000.pt.trace.json.gz"
    ]


def test_verls_profiler_fields_map_onto_rankscopes(tmp_path: Path) -> None:
    torch_tool = TorchProfilerToolConfig(contents=["cuda", "stack", "memory"])
    config = ProfilerConfig(
        tool="rankscope",
        enable=True,
        ranks=[0, 2],
        save_path=str(tmp_path),
        tool_config={"torch": torch_tool},
    )
    mapped = adapter.config_from_profiler(config, environ={})
    assert mapped.output_dir == str(tmp_path / "rankscope")
    trace = mapped.trace
    assert (trace.enable, trace.ranks, trace.target) == (True, "0,2", "caller")
    assert list(trace.activities or []) == ["cuda"]
    assert trace.with_stack and trace.profile_memory and not trace.record_shapes
    assert mapped.timer.enable and mapped.timer.ranks == "all"
    # verl's defaults: ranks [] is rank 0; all_ranks every rank; not enabled: no trace.
    assert (
        adapter.config_from_profiler(
            ProfilerConfig(tool="rankscope", enable=True, ranks=[], save_path=str(tmp_path)), {}
        ).trace.ranks
        == "0"
    )
    assert (
        adapter.config_from_profiler(
            ProfilerConfig(tool="rankscope", enable=True, all_ranks=True, save_path=str(tmp_path)),
            {},
        ).trace.ranks
        == "all"
    )
    off = ProfilerConfig(tool="rankscope", save_path=str(tmp_path))
    assert not adapter.config_from_profiler(off, {}).trace.enable
    # rankscope's own section wins over what is mapped.
    own = ProfilerConfig(
        tool="rankscope",
        save_path=str(tmp_path),
        tool_config={"rankscope": {"output_dir": str(tmp_path / "own")}},
    )
    assert adapter.config_from_profiler(own, {}).output_dir == str(tmp_path / "own")


@pytest.mark.parametrize(
    ("over", "field"),
    [
        (
            {"tool_config": {"torch": TorchProfilerToolConfig(discrete=True)}},
            "profiler.tool_config.torch.discrete",
        ),
        ({"ranks": [0, -1]}, "profiler.ranks"),
    ],
)
def test_a_verl_value_with_no_rankscope_meaning_names_its_field(
    tmp_path: Path, over: dict[str, Any], field: str
) -> None:
    config = ProfilerConfig(tool="rankscope", enable=True, save_path=str(tmp_path), **over)
    with pytest.raises(ConfigError) as info:
        adapter.config_from_profiler(config, environ={})
    assert info.value.field == field


def test_other_tools_keep_verls_own_profilers(tmp_path: Path) -> None:
    adapter.install()
    adapter.install()  # twice: once
    from verl.utils.profiler import DistProfiler

    torch_profiler = DistProfiler(
        rank=0,
        config=ProfilerConfig(tool="torch", enable=False),
        tool_config=TorchProfilerToolConfig(),
    )
    assert getattr(torch_profiler, "_rankscope", None) is None
    assert not torch_profiler.check_enable()  # verl's own answer
    ours = DistProfiler(rank=3, config=ProfilerConfig(tool="rankscope", save_path=str(tmp_path)))
    assert ours.check_enable() and ours.check_this_rank() and ours.check_this_step()


def _ray_actor_job(out: str) -> list[str]:
    import ray

    @ray.remote
    class Actor:
        def run(self, rank: int) -> str:
            from verl.utils.profiler import profile

            return str(getattr(profile.DistProfiler, "_rankscope_installed", False))

    actors = [Actor.remote() for _ in range(2)]
    return ray.get([a.run.remote(r) for r, a in enumerate(actors)])


def test_rays_setup_hook_installs_it_in_every_worker(tmp_path: Path) -> None:
    ray = pytest.importorskip("ray")
    hook = "rankscope.integrations.verl.install"
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        runtime_env={"worker_process_setup_hook": hook},
        log_to_driver=False,
    )
    try:
        assert _ray_actor_job(str(tmp_path)) == ["True", "True"]
    finally:
        ray.shutdown()
