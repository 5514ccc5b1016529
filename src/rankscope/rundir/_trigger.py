"""The trigger protocol: the files `rankscope trigger` writes and the ranks answer.

::

    RUN_DIR/triggers/<id>.json                  a trigger: record steps start..start+steps-1 on ranks
    RUN_DIR/triggers/<id>/rank-00003.json       rank 3's answer: accepted (and its window) or declined

Files are the whole protocol: no collective, no daemon. A trigger names an absolute
start step, so every selected rank that sees it in time starts the same window at the
same step. Both files are written under a hidden temporary name and renamed into
place, so a reader never sees half of one, and never through a link below RUN_DIR
(see `_files`): a trigger id is a plain name. Both sides use it: the capture's watcher
reads triggers and writes answers (capture/_trigger.py), the CLI's client writes
triggers and reads answers (cli/_trigger_client.py). Imports no torch.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._errors import ConfigError
from ..config._config import TimerConfig
from ..config._ranks import RankSet, parse_ranks
from ..config._trace import TraceConfig
from ._files import read_regular, write_atomic
from ._layout import TRIGGER_SUFFIX, ack_path, step_window_name, trigger_path, trigger_tag
from ._listing import RunDir

__all__ = [
    "ID_ACCEPTED",
    "TRIGGER_VERSION",
    "Trigger",
    "ack_path",
    "answered",
    "check_trigger_id",
    "config_in_meta",
    "new_trigger_id",
    "parse_trigger",
    "rank_listens",
    "read_acks",
    "read_trigger",
    "trigger_dir",
    "trigger_id_of",
    "trigger_path",
    "why_not_listening",
    "write_ack",
    "write_trigger",
]

TRIGGER_VERSION = 1

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_ID_MAX = 128
ID_ACCEPTED = (
    f'a plain name: 1 to {_ID_MAX} ASCII letters, digits, "-", "_" or ".", starting with a '
    'letter or digit, without ".."'
)
_MAX_BYTES = 64 << 10  # a trigger is a few hundred bytes; anything far larger is not one


def trigger_dir(run_dir: str | os.PathLike[str]) -> Path:
    """RUN_DIR/triggers, where triggers and the ranks' answers are."""
    return RunDir(run_dir).triggers_dir


# (what is wrong, what to say), in the order a reader would look.
_ID_RULES: tuple[tuple[Callable[[str], bool], str], ...] = (
    (lambda v: not v, "is empty"),
    (lambda v: "\0" in v, "holds a NUL"),
    (lambda v: "/" in v or "\\" in v, 'holds a "/" or "\\" (a path, not a name)'),
    (lambda v: ".." in v, 'holds ".."'),
    (lambda v: v.startswith("."), 'starts with "."'),
    (lambda v: len(v) > _ID_MAX, f"is longer than {_ID_MAX} characters"),
    (lambda v: not _ID.fullmatch(v), 'holds a character other than letters, digits, "-", "_", "."'),
)


def check_trigger_id(value: object) -> str | None:
    """What is wrong with `value` as a trigger id; None for a good one (see ID_ACCEPTED).

    An id names a file and a folder in RUN_DIR/triggers and ends the window's name, so
    it must be a plain name there: no "/", no "..", no leading ".", no NUL.
    """
    if not isinstance(value, str):
        return "is missing" if value is None else f"is a {type(value).__name__}, not a string"
    return next((why for bad, why in _ID_RULES if bad(value)), None)


def trigger_id_of(name: str) -> str | None:
    """The id a trigger file's name gives; None for a name no trigger file has."""
    return name[: -len(TRIGGER_SUFFIX)] if name.endswith(TRIGGER_SUFFIX) else None


def why_not_listening(enable: object, target: object, every: object) -> str | None:
    """Why a rank with this trace config checks for no triggers; None when it checks.

    The one statement of which ranks listen, for the capture and for the CLI (which
    reads the values from each rank's meta file). Every rank listens, in trace.ranks
    or not: a trigger may name any rank.
    """
    if enable is not True:
        return "trace.enable is false"
    if target != "step":
        return f"trace.target is {target!r} (triggers record steps)"
    if not isinstance(every, int) or isinstance(every, bool) or every <= 0:
        return "trace.trigger_check_every_n_steps is 0"
    return None


_SECTIONS = {"trace": TraceConfig, "timer": TimerConfig}


def config_in_meta(meta: object, section: str) -> dict[str, Any]:
    """One section ("trace", "timer") of a rank's config as its meta file holds it, each
    field the file leaves out at the config's default: the job built its config through
    these dataclasses, so their defaults are the one statement of what it ran with."""
    config = meta.get("config") if isinstance(meta, dict) else None
    given = config.get(section) if isinstance(config, dict) else None
    defaults = dataclasses.asdict(_SECTIONS[section]())
    return {**defaults, **(given if isinstance(given, dict) else {})}


def rank_listens(meta: dict[str, Any] | None) -> str | None:
    """`why_not_listening` for a rank as its meta file (RUN_DIR/meta) describes it."""
    if meta is None:
        return "no meta file (the rank neither traces nor times, or has not started)"
    config = meta.get("config")
    if not isinstance(config, dict) or not isinstance(config.get("trace"), dict):
        return "its meta file holds no trace config"
    trace = config_in_meta(meta, "trace")
    every = trace["trigger_check_every_n_steps"]
    why = why_not_listening(trace["enable"], trace["target"], every)
    device = meta.get("device")
    if why is None and trace["tool"] == "nsys" and not str(device).startswith("cuda"):
        return f"trace.tool is 'nsys' and the rank has no CUDA device ({device})"
    return why


@dataclass(frozen=True, slots=True)
class Trigger:
    """A request to record steps start..start+steps-1 on the ranks `ranks` names."""

    id: str
    start: int
    steps: int
    ranks: str
    """A rank spec in canonical form ("all", "0-3,8")."""
    created: str | None = None
    """When it was written (UTC, ISO 8601); None in a hand-written file that omits it."""
    tag: str | None = None
    """What the window's name ends with, where not `trigger-<id>`: a peer asked by a slow
    rank (`capture/_pair.py`) records into that rank's window, `slow-<phase>`."""
    asked_by: int | None = None
    """The rank whose anomaly detector wrote this trigger for a peer; None for `rankscope trigger`."""

    def __post_init__(self) -> None:
        problem = check_trigger_id(self.id)
        if problem is not None:
            raise ConfigError("trigger id", self.id, ID_ACCEPTED, problem)
        # A tag ends a folder name, so it is held to the id's rules.
        problem = None if self.tag is None else check_trigger_id(self.tag)
        if problem is not None:
            raise ConfigError("trigger tag", self.tag, ID_ACCEPTED, problem)

    @property
    def last(self) -> int:
        return self.start + self.steps - 1

    @property
    def window(self) -> str:
        """The window directory the selected ranks write: step-AAAAAA-BBBBBB-trigger-<id>."""
        return step_window_name(self.start, self.last, self.window_tag)

    @property
    def window_tag(self) -> str:
        """What the window's name ends with: `tag`, else `trigger-<id>`."""
        return trigger_tag(self.id) if self.tag is None else self.tag

    @property
    def rank_set(self) -> RankSet:
        return parse_ranks(self.ranks, "ranks")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "v": TRIGGER_VERSION,
            "id": self.id,
            "start": self.start,
            "steps": self.steps,
            "ranks": self.ranks,
            "created": self.created,
        }
        if self.tag is not None:
            out["tag"] = self.tag
        if self.asked_by is not None:
            out["asked_by"] = self.asked_by
        return out


def new_trigger_id() -> str:
    """A name that sorts by creation time and does not collide: 20261123-113000-a1b2c3."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


def parse_trigger(data: object, file_id: str | None = None) -> Trigger:
    """A Trigger from the JSON of a trigger file; ValueError says what is wrong.

    `file_id` is the id the file name gives, which the content must repeat.
    """

    def need_int(key: str, minimum: int) -> int:
        value = fields.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f'"{key}" is {value!r}; expected an int >= {minimum}')
        return value

    if not isinstance(data, dict):
        raise ValueError(f"not a JSON object but a {type(data).__name__}")
    fields: dict[str, Any] = data
    if fields.get("v") != TRIGGER_VERSION:
        raise ValueError(f'"v" is {fields.get("v")!r}; expected {TRIGGER_VERSION}')
    trigger_id = fields.get("id")
    problem = check_trigger_id(trigger_id)
    if problem is not None or not isinstance(trigger_id, str):
        raise ValueError(f'"id" is {trigger_id!r}, which {problem}; expected {ID_ACCEPTED}')
    if file_id is not None and trigger_id != file_id:
        raise ValueError(f'"id" is {trigger_id!r} but the file is named {file_id}{TRIGGER_SUFFIX}')
    start = need_int("start", 1)
    steps = need_int("steps", 1)
    try:
        ranks = parse_ranks(fields.get("ranks"), "ranks").spec()
    except ConfigError as exc:
        raise ValueError(f'"ranks": {exc}') from None
    created = fields.get("created")
    tag = fields.get("tag")
    problem = None if tag is None else check_trigger_id(tag)
    if problem is not None:
        raise ValueError(f'"tag" is {tag!r}, which {problem}; expected {ID_ACCEPTED}')
    asked_by = fields.get("asked_by")
    if asked_by is not None:
        asked_by = need_int("asked_by", 0)
    return Trigger(
        trigger_id,
        start,
        steps,
        ranks,
        created if isinstance(created, str) else None,
        tag,
        asked_by,
    )


def read_trigger(path: Path) -> Trigger:
    """Read and check one trigger file; ValueError (or OSError) says what is wrong.

    Only a regular file is read, and not through a link at its name.
    """
    raw = read_regular(path, _MAX_BYTES)
    if len(raw) > _MAX_BYTES:
        raise ValueError(f"larger than {_MAX_BYTES} bytes")
    try:
        data = json.loads(raw)
    except ValueError as exc:  # UnicodeDecodeError is a ValueError too
        raise ValueError(f"not valid JSON ({exc})") from None
    return parse_trigger(data, trigger_id_of(path.name))


def _write_json(run_dir: str | os.PathLike[str], path: Path, data: dict[str, Any]) -> None:
    """Write `data` under a hidden temporary name and rename it into place, inside RUN_DIR."""
    text = json.dumps(data, indent=1) + "\n"
    write_atomic(run_dir, path, text.encode("utf-8"), str(os.getpid()))


def write_trigger(run_dir: str | os.PathLike[str], trigger: Trigger) -> Path:
    """Write RUN_DIR/triggers/<id>.json atomically; OSError propagates."""
    path = trigger_path(run_dir, trigger.id)
    _write_json(run_dir, path, trigger.to_dict())
    return path


def write_ack(
    run_dir: str | os.PathLike[str], trigger: Trigger, rank: int, answer: dict[str, Any]
) -> None:
    """Write (or replace) this rank's answer to `trigger`; OSError propagates, also when a
    link below RUN_DIR stands where the answer goes (nothing is written then)."""
    path = ack_path(run_dir, trigger.id, rank)
    data = {
        "v": TRIGGER_VERSION,
        "id": trigger.id,
        "rank": rank,
        **answer,
        "time_ns": time.time_ns(),
    }
    _write_json(run_dir, path, data)


def answered(run_dir: str | os.PathLike[str], trigger_id: str, rank: int) -> bool:
    """True when RUN_DIR/triggers/<id>/rank-NNNNN.json is a regular file in a real folder:
    a link at either is no answer (and the answer written in its place is refused)."""
    path = ack_path(run_dir, trigger_id, rank)
    try:
        folder, answer = os.lstat(path.parent), os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(folder.st_mode) and stat.S_ISREG(answer.st_mode)


def read_acks(run_dir: str | os.PathLike[str], trigger_id: str) -> dict[int, dict[str, Any]]:
    """The ranks' answers to one trigger, by rank; unreadable answers are left out."""
    out: dict[int, dict[str, Any]] = {}
    for answer in RunDir(run_dir).trigger_answers(trigger_id):
        try:
            data = json.loads(answer.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("rank") == answer.rank:
            out[answer.rank] = data
    return out
