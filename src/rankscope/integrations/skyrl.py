"""SkyRL integration: rankscope as the policy profiler of SkyRL's trainer, in every Ray worker.

SkyRL's trainer drives one profiler in each policy worker: ``start_profile`` before the
loop, ``profile_step`` after each global step's training, ``stop_profile`` at the end,
all built from ``trainer.policy.torch_profiler_config`` when its ``enable`` is true.
``install()``, called in the driver before SkyRL starts Ray, makes that profiler
rankscope's::

    import rankscope.integrations.skyrl as rs
    rs.install()                      # before initialize_ray(cfg)
    # or, with SkyRL's own entry point:
    python -m rankscope.integrations.skyrl skyrl.train.entrypoints.main_base \\
        trainer.policy.torch_profiler_config.enable=true \\
        trainer.policy.torch_profiler_config.save_path=/abs/path ...

``install()`` adds Ray's ``worker_process_setup_hook`` (``install_worker``) to the
``runtime_env`` of SkyRL's ``ray.init`` (a hook of the user's own is run after it), with
the RANKSCOPE_* variables of the driver; Ray runs the hook in every worker process before
its actor's modules are imported. Ray started already cannot be given the hook: that is
a ConfigError. ``install_worker`` replaces, as each is imported, SkyRL's ``Profiler``
class by rankscope's and wraps the worker methods the trainer calls.

What is mapped from ``torch_profiler_config``:

- The phase timer runs on every rank of the policy group, every step sampled as the
  timer's config says: the straggler analysis compares ranks. ``ranks`` are the ranks
  that record trace windows, on the schedule ``skip_first``, ``wait``, ``warmup``,
  ``active``, ``repeat`` counted in ``profile_step`` calls (SkyRL's meaning).
- ``activities``, ``record_shapes``, ``profile_memory``, ``with_stack``, ``with_flops``,
  ``with_modules`` are the trace's options of the same names. ``export_type: stacks``
  has no rankscope meaning (a window is a Kineto trace) and is refused naming the field.
- ``save_path`` holds the run directory, ``<save_path>/rankscope``.
- ``install(config)``'s own ProfileConfig fields win over the mapped ones; the
  RANKSCOPE_* variables win over both. ``RANKSCOPE_TRACE=0`` keeps the timer alone.

SkyRL refuses ``enable`` with FSDP under colocation (its offload swaps parameters a
torch profiler holds). With the trace off (``RANKSCOPE_TRACE=0`` or
``install({"trace": {"enable": False}})``) nothing holds them: the check is left out
then, and kept otherwise (a trace window holds them as SkyRL's profiler does).

Phases, each the worker method of that name: ``forward`` (the policy's log probs),
``forward_backward`` and ``optim_step`` (each mini-batch), ``weight_sync``
(``broadcast_to_inference_engines``), ``offload`` and ``backload`` (colocation),
``save_checkpoint``, ``save_hf_model``; the time from one call's end to the next
call's start is ``after_<phase>`` (kind "comm"; ``after_<phase>_<n>`` after the n-th
call of a phase in a step, a mini-batch's, so that no comm phase repeats within a step,
which the analysis reads as a pipeline's sends): the controller gathers every rank's
results before it goes on, so the ranks that wait for a slow one wait there, and the
rollout runs there (in the inference engines, not the policy workers). A step is the
time between ``profile_step`` calls, numbered from 0 at ``start_profile`` (a worker is
not told SkyRL's global step). Timings are flushed every step: Ray kills the
actors when training ends.

A fault inside rankscope is logged once and turns it off in that process; training goes
on. A config value with no rankscope meaning raises ConfigError naming SkyRL's field.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.machinery
import inspect
import json
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from types import ModuleType
from typing import Any

from .._errors import ConfigError
from .._intake import as_config
from .._log import get_logger
from .._profiler import Profiler
from ..config._config import ProfileConfig
from ._common import ProcessRun, enter_phase, leave_phase, merged, plain

__all__ = ["AFTER", "PHASES", "SkyRLProfiler", "config_from_profiler", "install", "install_worker"]

logger = get_logger(__name__)

PHASES = {
    "forward": "forward",
    "forward_backward": "forward_backward",
    "optim_step": "optim_step",
    "broadcast_to_inference_engines": "weight_sync",
    "offload_to_cpu": "offload",
    "backload_to_gpu": "backload",
    "save_checkpoint": "save_checkpoint",
    "save_hf_model": "save_hf_model",
}
"""The worker methods timed, and their phase names."""

AFTER = "after_"
"""The phase from a call's end to the next call, ``after_<phase>`` (see the module)."""

HOOK = "rankscope.integrations.skyrl.install_worker"
"""Ray's ``worker_process_setup_hook`` that ``install()`` adds."""

CONFIG_VARIABLE = "RANKSCOPE_SKYRL_CONFIG"
"""Where ``install(config)`` passes its own fields to the workers (JSON)."""

THEN_VARIABLE = "RANKSCOPE_SKYRL_THEN"
"""The user's own setup hook (a module path), run after rankscope's."""

_FIELD = "trainer.policy.torch_profiler_config"
_PROFILER = "skyrl.backends.skyrl_train.utils.profiler"
_WORKER = "skyrl.backends.skyrl_train.workers.worker"
_CONFIG = "skyrl.train.config.config"


def install(config: object = None) -> None:
    """In SkyRL's driver, before it starts Ray: every Ray worker gets rankscope as its
    policy profiler (see the module). `config` is rankscope's own (a ProfileConfig or a
    mapping of its fields), over what ``torch_profiler_config`` maps to. Calling it
    again replaces the config."""
    import ray

    if ray.is_initialized():
        raise ConfigError(
            "ray",
            "initialized",
            "Ray not started yet: call install() before SkyRL's initialize_ray (or "
            "ray.init), so that every worker gets rankscope's setup hook",
        )
    if config is not None:
        os.environ[CONFIG_VARIABLE] = json.dumps(as_config(config).to_dict())
    install_worker()
    if not getattr(ray.init, "_rankscope", False):
        ray.init = _with_hook(ray.init)


def _with_hook(init: Callable[..., Any]) -> Callable[..., Any]:
    """`ray.init` that gives its runtime_env rankscope's setup hook and variables."""

    @functools.wraps(init)
    def run(*args: Any, **kwargs: Any) -> Any:
        env = dict(kwargs.get("runtime_env") or {})
        theirs = env.get("worker_process_setup_hook")
        variables = dict(env.get("env_vars") or {})
        if theirs not in (None, HOOK):
            if not isinstance(theirs, str):
                raise ConfigError(
                    "runtime_env.worker_process_setup_hook",
                    theirs,
                    "a module path (rankscope's hook runs it after its own)",
                )
            variables[THEN_VARIABLE] = theirs
        for name, value in os.environ.items():
            if name.startswith("RANKSCOPE_"):
                variables.setdefault(name, value)
        env.update(worker_process_setup_hook=HOOK, env_vars=variables)
        kwargs["runtime_env"] = env
        return init(*args, **kwargs)

    run._rankscope = True  # type: ignore[attr-defined]
    return run


def install_worker() -> None:
    """Ray's setup hook, in each worker process: SkyRL's policy profiler and worker
    methods become rankscope's as their modules are imported (now where they are).
    Calling it again does nothing."""
    _after_import(_PROFILER, _patch_profiler)
    _after_import(_WORKER, _patch_worker)
    _after_import(_CONFIG, _patch_config)
    then = os.environ.pop(THEN_VARIABLE, None)
    if then:
        module, _, name = then.rpartition(".")
        getattr(importlib.import_module(module), name)()


# -- patching SkyRL as it is imported -----------------------------------------------------


class _Patched(importlib.abc.Loader):
    """A module's own loader, then `patch` on the module it made."""

    def __init__(self, loader: importlib.abc.Loader, patch: Callable[[ModuleType], None]) -> None:
        self.loader, self.patch = loader, patch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        self.patch(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_data, ...: the module's own
        return getattr(self.loader, name)


class _OnImport(importlib.abc.MetaPathFinder):
    """Patches module `name` right after it is imported, once."""

    def __init__(self, name: str, patch: Callable[[ModuleType], None]) -> None:
        self.name, self.patch = name, patch

    def find_spec(
        self, fullname: str, path: Any = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _Patched(spec.loader, self.patch)
                return spec
        return None


def _after_import(name: str, patch: Callable[[ModuleType], None]) -> None:
    module = sys.modules.get(name)
    if module is not None:
        patch(module)
    elif not any(isinstance(f, _OnImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _OnImport(name, patch))


def _patch_profiler(module: ModuleType) -> None:
    """SkyRL's ``build_profiler_from_policy_cfg`` makes rankscope's profiler."""
    if getattr(module, "Profiler", None) is not SkyRLProfiler:
        setattr(module, "Profiler", SkyRLProfiler)  # noqa: B010 - a module SkyRL owns


def _patch_worker(module: ModuleType) -> None:
    """The timed methods of SkyRL's workers, and of every worker class made later."""
    base = module.Worker
    if getattr(base, "_rankscope_installed", False):
        return
    for value in list(vars(module).values()):
        if isinstance(value, type) and issubclass(value, base):
            _time_methods(value)
    theirs = base.__dict__.get("__init_subclass__")

    def __init_subclass__(cls: type, /, **kwargs: Any) -> None:
        if theirs is not None:
            theirs.__func__(cls, **kwargs)
        else:
            super(base, cls).__init_subclass__(**kwargs)
        _time_methods(cls)

    base.__init_subclass__ = classmethod(__init_subclass__)
    base._rankscope_installed = True


def _patch_config(module: ModuleType) -> None:
    """SkyRL's FSDP-colocation check left out where no trace holds parameters."""
    cls = module.TorchProfilerConfig
    if getattr(cls.validate, "_rankscope", False):
        return
    validate = cls.validate

    @functools.wraps(validate)
    def run(self: Any, strategy: Any = None, *args: Any, **kwargs: Any) -> None:
        if strategy == "fsdp" and not _traces(self):
            strategy = None  # the check is about FSDP's parameter swap alone
        validate(self, strategy, *args, **kwargs)

    run._rankscope = True  # type: ignore[attr-defined]
    cls.validate = run


def _traces(config: Any) -> bool:
    """Whether rankscope would record trace windows for this SkyRL config."""
    try:
        return bool(config_from_profiler(config).with_env().trace.enable)
    except ConfigError:
        return True  # the worker will say what is wrong; keep SkyRL's check meanwhile


def _time_methods(cls: type) -> None:
    for method, phase in PHASES.items():
        func = cls.__dict__.get(method)
        if callable(func) and not getattr(func, "_rankscope", False):
            setattr(cls, method, _timed(phase, func))


def _timed(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    """`func` run as phase `name` in a worker whose profiler is rankscope's."""
    if inspect.iscoroutinefunction(func):

        @functools.wraps(func)
        async def run_async(self: Any, *args: Any, **kwargs: Any) -> Any:
            run = _running(self)
            if run is None:
                return await func(self, *args, **kwargs)
            with run.timed(name):
                return await func(self, *args, **kwargs)

        run_async._rankscope = True  # type: ignore[attr-defined]
        return run_async

    @functools.wraps(func)
    def run_sync(self: Any, *args: Any, **kwargs: Any) -> Any:
        run = _running(self)
        if run is None:
            return func(self, *args, **kwargs)
        with run.timed(name):
            return func(self, *args, **kwargs)

    run_sync._rankscope = True  # type: ignore[attr-defined]
    return run_sync


def _running(worker: Any) -> SkyRLProfiler | None:
    """The worker's rankscope profiler where it is timing and not inside a timed method
    already (a subclass's method that calls its base's is one phase)."""
    profiler = getattr(worker, "profiler", None)
    if isinstance(profiler, SkyRLProfiler) and profiler.profiler is not None:
        return None if profiler.inside else profiler
    return None


# -- the config ---------------------------------------------------------------------------


def config_from_profiler(config: Any, environ: Mapping[str, str] | None = None) -> ProfileConfig:
    """The ProfileConfig SkyRL's ``torch_profiler_config`` asks for (the module docstring
    says the mapping), with ``install(config)``'s fields over it; ConfigError names
    SkyRL's field whose value has no rankscope meaning."""
    env = os.environ if environ is None else environ
    own: dict[str, Any] = {}
    if env.get(CONFIG_VARIABLE):
        try:
            own = json.loads(env[CONFIG_VARIABLE])
        except ValueError as exc:
            raise ConfigError(CONFIG_VARIABLE, env[CONFIG_VARIABLE], "JSON") from exc
    mapped: dict[str, Any] = {"timer": {"enable": True, "ranks": "all", "flush_every_n_steps": 1}}
    save = getattr(config, "save_path", None)
    if not isinstance(save, (str, os.PathLike)) or not str(save):
        raise ConfigError(f"{_FIELD}.save_path", save, "an absolute local path")
    mapped["output_dir"] = os.path.join(str(save), "rankscope")
    if getattr(config, "enable", False):
        mapped["trace"] = _trace(config)
    out = ProfileConfig.from_dict(merged(mapped, own))
    out.with_env(environ)  # a bad RANKSCOPE_* value fails here, not at the first step
    return out


def _trace(config: Any) -> dict[str, Any]:
    export = getattr(config, "export_type", "chrome_trace")
    if export != "chrome_trace":
        raise ConfigError(
            f"{_FIELD}.export_type", export, "chrome_trace (a rankscope window is a Kineto trace)"
        )
    ranks = plain(getattr(config, "ranks", None))
    if (
        not ranks
        or not isinstance(ranks, list)
        or not all(type(r) is int and r >= 0 for r in ranks)
    ):
        raise ConfigError(f"{_FIELD}.ranks", ranks, "a non-empty list of ranks >= 0")
    activities = plain(getattr(config, "activities", None)) or ["cpu", "cuda"]
    if not isinstance(activities, list) or not all(isinstance(a, str) for a in activities):
        raise ConfigError(f"{_FIELD}.activities", activities, 'a list of "cpu" and "cuda"')
    trace: dict[str, Any] = {
        "enable": True,
        "ranks": ranks,
        "activities": [a.lower() for a in activities],
        "schedule": {
            name: getattr(config, name)
            for name in ("skip_first", "wait", "warmup", "active", "repeat")
            if hasattr(config, name)
        },
    }
    for name in ("record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules"):
        if hasattr(config, name):
            trace[name] = bool(getattr(config, name))
    return trace


# -- the profiler SkyRL holds -------------------------------------------------------------


class SkyRLProfiler(ProcessRun):
    """What SkyRL's policy worker holds as ``self.profiler``, made by SkyRL's
    ``build_profiler_from_policy_cfg``: its start, step and stop run rankscope's Profiler,
    and the worker's timed methods open its phases."""

    _WHAT = "SkyRL integration"

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.enable = bool(getattr(config, "enable", False))
        self.config = config_from_profiler(config)  # ConfigError is the user's to see
        self.inside = False  # a timed method is running
        # The open phase (OnePhase) is after_<phase>, from a method's call to the next.
        self._calls: dict[str, int] = {}  # each phase's calls in the step so far

    def check(self) -> bool:
        return self.profiler is not None

    def get_kernel_summary(self) -> None:
        """SkyRL's last-window kernel table: rankscope's is ``rankscope kernels RUN_DIR``."""
        return None

    def start(self) -> None:
        if self.off or self.profiler is not None:
            return
        try:
            profiler = Profiler(self.config)
            profiler.start()
            self.profiler = profiler
            self._stop_at_exit()
        except Exception as exc:
            self._fault("start", exc)

    def step(self) -> None:
        if self.off or self.profiler is None:
            return
        try:
            self._close()  # the step's edge lies inside after_<phase>: the rest is not timed
            self._calls = {}
            self.profiler.step()
        except Exception as exc:
            self._fault("step", exc)

    def stop(self) -> None:
        if self.profiler is not None:
            try:
                self._finish(interrupted=False)
            except Exception as exc:
                self._fault("stop", exc)

    @contextlib.contextmanager
    def timed(self, name: str) -> Iterator[None]:
        """Phase `name` around the body, the gap after it opened when it ends."""
        phase = self._enter(name)
        try:
            yield
        except BaseException as exc:
            self._leave(name, phase, exc)
            raise
        self._leave(name, phase, None)

    def _enter(self, name: str) -> AbstractContextManager[Any] | None:
        """Phase `name` entered (the open gap closed); None where rankscope is off."""
        self.inside = True
        if self.off or self.profiler is None:
            return None
        try:
            self._close()
            return enter_phase(self.profiler, name, "compute")
        except Exception as exc:
            self._fault(name, exc)
            return None

    def _leave(
        self, name: str, phase: AbstractContextManager[Any] | None, exc: BaseException | None
    ) -> None:
        """Leave phase `name` and open the gap after it."""
        self.inside = False
        if phase is None or self.off or self.profiler is None:
            return
        try:
            leave_phase(phase, exc)
            self._open(self._gap_name(name), "comm")
        except Exception as fault:
            self._fault("leaving a phase", fault)

    def _gap_name(self, name: str) -> str:
        """``after_<name>``, and ``after_<name>_<n>`` after its n-th call in a step (a
        mini-batch's): a comm phase that repeats within a step is a pipeline's send or
        recv to the analysis, and the controller's gathers are not."""
        n = self._calls[name] = self._calls.get(name, 0) + 1
        return AFTER + name + (f"_{n}" if n > 1 else "")


def _main(argv: list[str]) -> int:
    """``python -m rankscope.integrations.skyrl MODULE ARGS...``: install(), then run
    SkyRL's entry module MODULE as ``python -m MODULE ARGS...`` would."""
    import runpy

    if not argv or argv[0].startswith("-"):
        sys.stderr.write(
            "usage: python -m rankscope.integrations.skyrl MODULE [ARGS...]\n"
            "  (MODULE: SkyRL's entry point, e.g. skyrl.train.entrypoints.main_base)\n"
        )
        return 2
    install()
    sys.argv = list(argv)
    runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
