"""Kineto-shaped traces with known answers, for tests and benchmarks: `write_trace` writes
one of a chosen size and returns the sums a reader must find in it; `write_run_traces`
writes a window's traces into a run directory. Neither imports torch.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..rundir._layout import trace_path
from ._synthetic import EPOCH_NS

__all__ = ["TraceTruth", "write_run_traces", "write_trace"]


@dataclass
class TraceTruth:
    """What a correct reader finds in a trace that `write_trace` wrote."""

    path: Path
    rank: int
    events: int = 0
    kernels: dict[str, list[float]] = field(default_factory=dict)
    """Per kernel name: [count, total us], over events with cat "kernel"."""
    cpu_self: dict[str, list[float]] = field(default_factory=dict)
    """Per CPU op name: [count, self us] (own time, nested ops taken out)."""
    flows: int = 0
    """Flow start events (each has exactly one finish)."""
    base_time_ns: int | None = None

    @property
    def kernel_total_us(self) -> float:
        return sum(total for _, total in self.kernels.values())


# Names of the shapes real kernels have: templates, operators, quotes, ampersands.
_KERNELS = (
    (
        "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
        "at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)"
    ),
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_cublas",
    (
        "void cutlass::Kernel2<cutlass_80_tensorop_s16816gemm_relu_bf16_64x64_32x6_tn_align8>"
        "(cutlass_80_tensorop_s16816gemm_relu_bf16_64x64_32x6_tn_align8::Params)"
    ),
    'void softmax_warp_forward<float, float, 10, "log" && x < y, </script>>(float*, float const*, int)',
    "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
)
_OPS = (("aten::linear", "aten::addmm"), ("aten::relu", "aten::clamp_min"), ("aten::mul", None))


def write_trace(
    path: str | os.PathLike[str],
    *,
    rank: int = 0,
    world_size: int = 1,
    size_bytes: int = 1 << 20,
    gpu: bool = True,
    base_time_ns: int | None = EPOCH_NS,
    seed: int = 0,
    compact: bool = False,
) -> TraceTruth:
    """Write a Kineto-shaped trace of about `size_bytes` (before compression).

    Each step holds ProfilerStep#N, CPU ops nested two deep, and (with `gpu`) their
    launches, kernels on two streams, a memcpy and flow arrows from launch to kernel.
    `.gz` names are compressed. With `base_time_ns`, `ts` counts from it (as newer
    Kineto writes); without, `ts` is absolute microseconds (as older Kineto did).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed * 7919 + rank)
    truth = TraceTruth(path=path, rank=rank, base_time_ns=base_time_ns)
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "wb") as raw, io.TextIOWrapper(raw, "utf-8") as out:
        header: dict[str, Any] = {
            "schemaVersion": 1,
            "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world_size},
        }
        if base_time_ns is not None:
            header["baseTimeNanoseconds"] = base_time_ns
        out.write("{\n")
        for key, value in header.items():
            out.write(f"  {json.dumps(key)}: {json.dumps(value)},\n")
        out.write('  "traceEvents": [\n')
        steps = _StepWriter(_EventWriter(out, compact, truth), rng, 4000 + rank, gpu)
        now = 1_000_000.0 if base_time_ns is not None else 1_790_000_000_000_000.0
        while steps.events.size < size_bytes:
            now = steps.step(now)
        out.write("\n  ],\n")
        out.write('  "displayTimeUnit": "ms",\n')
        out.write(f'  "traceName": {json.dumps(str(path))}\n}}\n')
    return truth


class _StepWriter:
    """Writes one ProfilerStep's events at a time, adding what it writes to the truth."""

    def __init__(self, events: _EventWriter, rng: random.Random, pid: int, gpu: bool) -> None:
        self.events = events
        self._truth = events.truth
        self._rng = rng
        self._pid = self._tid = pid
        self._gpu = gpu
        self._step = 0
        self._correlation = 1000
        for meta in _metadata(pid, pid, gpu):
            events.write(meta)

    def step(self, now: float) -> float:
        """Write the step that starts at `now`; returns when the next one starts."""
        step_start = now
        now += 5.0
        for outer, inner in _OPS * 4:
            now = self._op(outer, inner, now)
        if self._gpu:
            self._x("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", now, 12.5, pid=0, tid=7)
        self._x("user_annotation", f"ProfilerStep#{self._step}", step_start, now - step_start)
        self._step += 1
        return now + 10.0

    def _op(self, outer: str, inner: str | None, now: float) -> float:
        rng = self._rng
        outer_dur = round(rng.uniform(40, 400), 3)
        self._x("cpu_op", outer, now, outer_dur, _op_args(rng))
        if inner is None:
            _add(self._truth.cpu_self, outer, outer_dur)
        else:
            inner_dur = round(outer_dur * rng.uniform(0.5, 0.9), 3)
            inner_start = round(now + (outer_dur - inner_dur) / 2, 3)
            self._x("cpu_op", inner, inner_start, inner_dur, _op_args(rng))
            # Self times are taken from the durations as written.
            _add(self._truth.cpu_self, outer, round(outer_dur - inner_dur, 3))
            _add(self._truth.cpu_self, inner, inner_dur)
            if self._gpu:
                self._launch(round(inner_start + 1.0, 3))
        return round(now + outer_dur + rng.uniform(1, 20), 3)

    def _launch(self, at: float) -> None:
        rng = self._rng
        self._correlation += 1
        corr = self._correlation
        self._x(
            "cuda_runtime", "cudaLaunchKernel", at, 3.0, {"External id": corr, "correlation": corr}
        )
        name = rng.choice(_KERNELS)
        stream = 20 if name.startswith("nccl") else 7
        dur = round(rng.uniform(2, 900), 3)
        start = round(at + rng.uniform(5, 50), 3)
        args: dict[str, Any] = {
            "External id": corr,
            "device": 0,
            "stream": stream,
            "correlation": corr,
            "grid": [rng.randrange(1, 4096), 1, 1],
            "block": [128, 1, 1],
        }
        self._x("kernel", name, start, dur, args, pid=0, tid=stream)
        _add(self._truth.kernels, name, dur)
        self.events.write(_flow("s", corr, self._pid, self._tid, at))
        self.events.write(_flow("f", corr, 0, stream, start))
        self._truth.flows += 1

    def _x(
        self,
        cat: str,
        name: str,
        ts: float,
        dur: float,
        args: dict[str, Any] | None = None,
        *,
        pid: int | None = None,
        tid: int | None = None,
    ) -> None:
        event: dict[str, Any] = {
            "ph": "X",
            "cat": cat,
            "name": name,
            "pid": self._pid if pid is None else pid,
            "tid": self._tid if tid is None else tid,
            "ts": round(ts, 3),
            "dur": round(dur, 3),
        }
        if args:
            event["args"] = args
        self.events.write(event)


class _EventWriter:
    def __init__(self, out: io.TextIOWrapper, compact: bool, truth: TraceTruth) -> None:
        self._out = out
        self._compact = compact
        self.truth = truth
        self._first = True
        self.size = 0

    def write(self, event: dict[str, Any]) -> None:
        text = json.dumps(event) if self._compact else _pretty(event)
        if not self._first:
            text = ",\n" + text
        self._first = False
        self._out.write(text)
        self.size += len(text)
        self.truth.events += 1


def _pretty(event: dict[str, Any]) -> str:
    # Kineto's layout: one key per line, args nested one level deeper.
    lines = ["  {"]
    items = list(event.items())
    for i, (key, value) in enumerate(items):
        comma = "," if i < len(items) - 1 else ""
        if key == "args" and isinstance(value, dict) and value:
            inner = ",\n".join(f"      {json.dumps(k)}: {json.dumps(v)}" for k, v in value.items())
            lines.append(f'    "args": {{\n{inner}\n    }}{comma}')
        else:
            lines.append(f"    {json.dumps(key)}: {json.dumps(value)}{comma}")
    lines.append("  }")
    return "\n".join(lines)


def _flow(ph: str, flow_id: int, pid: int, tid: int, ts: float) -> dict[str, Any]:
    event: dict[str, Any] = {
        "ph": ph,
        "id": flow_id,
        "pid": pid,
        "tid": tid,
        "ts": round(ts, 3),
        "cat": "ac2g",
        "name": "ac2g",
    }
    if ph == "f":
        event["bp"] = "e"
    return event


def _op_args(rng: random.Random) -> dict[str, Any]:
    n = rng.choice((64, 128, 4096))
    return {
        "External id": rng.randrange(1, 10**6),
        "Record function id": 0,
        "Input Dims": [[n, n], [n]],
        "Input type": ["float", "float"],
        "Ev Idx": rng.randrange(10**5),
    }


def _metadata(pid: int, tid: int, gpu: bool) -> list[dict[str, Any]]:
    def meta(name: str, p: int, t: int, args: dict[str, Any]) -> dict[str, Any]:
        return {"ph": "M", "name": name, "pid": p, "tid": t, "ts": 0, "args": args}

    events = [
        meta("process_name", pid, 0, {"name": "python"}),
        meta("process_labels", pid, 0, {"labels": "CPU"}),
        meta("thread_name", pid, tid, {"name": f"thread {tid} (python)"}),
    ]
    if gpu:
        events += [
            meta("process_name", 0, 0, {"name": "python"}),
            meta("process_labels", 0, 0, {"labels": "GPU 0"}),
            meta("thread_name", 0, 7, {"name": "stream 7 "}),
            meta("thread_name", 0, 20, {"name": "stream 20 "}),
        ]
    return events


def _add(table: dict[str, list[float]], name: str, value: float) -> None:
    row = table.setdefault(name, [0, 0.0])
    row[0] += 1
    row[1] += value


def write_run_traces(
    run_dir: str | os.PathLike[str],
    window: str,
    ranks: Iterable[int],
    *,
    world_size: int,
    size_bytes: int = 1 << 18,
    **options: Any,
) -> list[TraceTruth]:
    """One trace per rank under RUN_DIR/traces/WINDOW, named as capture names them."""
    out = []
    for rank in ranks:
        path = trace_path(run_dir, window, rank, gzip=True)
        out.append(
            write_trace(path, rank=rank, world_size=world_size, size_bytes=size_bytes, **options)
        )
    return out
