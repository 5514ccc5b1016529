"""A pipeline's send and recv calls read from their names, where the names say which way
each call sends and receives (Megatron's: `recv_forward`, `send_forward_recv_backward`,
`send_forward_backward_recv_forward_backward`; a prefix such as `pp_` is fine).

A name is read word by word (split at anything not a letter): `send` or `recv`
(`receive`) says what the words after it do, `forward` (`fwd`) or `backward` (`bwd`) a
direction. A name with a direction and no `send` or `recv` before it (the `forward`
compute) is no call.

The forward flows from stage s to stage (s + 1) mod S, the backward from stage s to
(s - 1) mod S: the k-th forward that stage s sends in a step is the k-th forward that the
next stage receives. The wrap is what an interleaved schedule (virtual stages: a rank
runs chunks of several stages) needs: the last stage sends its first chunk's forward to
stage 0's second chunk. Without chunks the end stages send and receive nothing round the
wrap, and the rule is the plain pairing. Read from the order of the compute alone, an
interleaved step pairs wrongly, which is why named calls are read first."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ._replay import At

__all__ = ["Links", "directions", "links_from_names"]

_MODES = {"send": "send", "recv": "recv", "receive": "recv"}
_WAYS = {"forward": "forward", "fwd": "forward", "backward": "backward", "bwd": "backward"}
_STEP = {"forward": 1, "backward": -1}


@dataclass
class Links:
    """Which op of which stage takes its data from which."""

    recvs: dict[At, tuple[At, ...]] = field(default_factory=dict)
    """An op that receives -> the sends (or flowing ops) whose data it waits for."""
    gated: dict[At, At] = field(default_factory=dict)
    """A flowing op with no recv recorded before it -> the op whose data it waits for."""
    sends: set[At] = field(default_factory=set)
    """The ops that send (a call that sends and receives too is in `recvs` as well)."""


def directions(name: str) -> tuple[frozenset[str], frozenset[str]] | None:
    """The directions a call named `name` sends and receives (see the module), or None
    where the name says none."""
    mode = None
    out: dict[str, set[str]] = {"send": set(), "recv": set()}
    for word in re.split(r"[^a-z]+", name.lower()):
        if word in _MODES:
            mode = _MODES[word]
        elif word in _WAYS:
            if mode is None:
                return None
            out[mode].add(_WAYS[word])
    if not out["send"] and not out["recv"]:
        return None
    return frozenset(out["send"]), frozenset(out["recv"])


def links_from_names(templates: list[tuple[int, ...]], phases: list[str]) -> Links | str | None:
    """The links of `templates` (each stage's phase indices in the order they ran) read
    from the calls' names; None where no phase's name says a direction; why not where
    the stages send and receive a direction unequally often."""
    named = {p: said for t in templates for p in t if (said := directions(phases[p])) is not None}
    if not named:
        return None
    sent: dict[tuple[str, int], list[At]] = {}
    got: dict[tuple[str, int], list[At]] = {}
    links = Links()
    for s, template in enumerate(templates):
        for j, p in enumerate(template):
            if p not in named:
                continue
            out, into = named[p]
            for way in out:
                sent.setdefault((way, s), []).append((s, j))
                links.sends.add((s, j))
            for way in into:
                got.setdefault((way, s), []).append((s, j))
    stages = len(templates)
    for way, step in _STEP.items():
        for s in range(stages):
            to = (s + step) % stages
            sends, recvs = sent.get((way, s), []), got.get((way, to), [])
            if len(sends) != len(recvs):
                return (
                    f"stage {s} sends the {way} {len(sends)} times a step, and stage {to} "
                    f"receives it {len(recvs)} times (by the calls' names)"
                )
            for send, recv in zip(sends, recvs, strict=True):
                links.recvs[recv] = (*links.recvs.get(recv, ()), send)
    return links
