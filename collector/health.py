"""A cluster's status and detail, derived from one probe report (pure; the rules below).

``derive(error, nodes, partitions) -> (status, detail)``:

- ``error`` set (the probe's ``sinfo`` failed, timed out or is missing): ``"unavailable"``, the
  detail is the error's first non-blank line, at most 200 characters.
- no nodes: ``"unavailable"``, ``"no compute nodes registered"``.
- any node not healthy, or any partition not ``up``: ``"degraded"``, with a detail such as
  ``"localhost drained (disk check), node2 down* (Not responding), node3 maint, +2 more;
  partitions gpu down, big inactive; no usable nodes"``:

  * the nodes first, in report order, each ``NAME STATE`` with Slurm's reason in parentheses when
    it has one (cut to 80 characters), at most three, then ``+N more``;
  * then ``partition NAME STATE`` (``partitions A STATE, B STATE`` for several), at most three,
    then ``+N more``;
  * the parts joined by ``"; "``, and ``"; no usable nodes"`` last when no node is healthy.
- otherwise ``"available"`` with no detail.

A node is healthy when its base state is active (``idle``, ``alloc``/``allocated``,
``mix``/``mixed``, ``comp``/``completing``, ``res``/``reserved``) and it carries no impairment
flag. The state is sinfo's ``%T`` text (``node_state_string`` in Slurm's
src/common/slurm_protocol_defs.c, lowercased), or ``%t``, or the ``+``-joined StateComplete form:

- one-character suffixes, all impairments: ``*`` not responding, ``~`` powered off, ``#``
  powering up, ``!`` pending power down, ``%`` powering down, ``$`` maintenance, ``@`` pending
  reboot, ``^`` reboot issued, ``-`` planned (a node planned for a job is not free for others, so not active);
- ``allocated+`` (allocated and completing) is healthy: a bare trailing ``+`` names no flag;
- ``+FLAG`` extras (``idle+drain``, ``mixed+maintenance``): impairments unless harmless
  (``completing``, ``reserved``/``res``, ``cloud``, ``dynamic_norm``, ``perfctrs``); an unknown
  flag is counted as an impairment, so it is named rather than hidden;
- every other base state is not active: ``drain``/``drained``/``draining``/``drng``, ``down``,
  ``fail``/``failing``, ``maint``, ``reboot``/``boot``, ``reboot_issued``, ``cancel_reboot``,
  ``planned``/``plnd``, ``future``/``futr``, ``unknown``/``unk``, ``inval``, ``cloud``,
  ``power_down``, ``power_up``, ``powering_down``, ``powered_down``, ``powering_up``, ``resume``,
  ``perfctrs``/``npc``, ``error`` and ``?``.

Node and partition reports are anything with ``name``/``state``/``reason`` (partitions:
``name``/``state``) attributes, or dicts with those keys. A node named twice (sinfo -N prints a
node once per partition) counts once, its first report; so does a partition named twice.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

AVAILABLE = "available"
DEGRADED = "degraded"
UNAVAILABLE = "unavailable"

ACTIVE_BASES = frozenset({"idle", "alloc", "allocated", "mix", "mixed", "comp", "completing",
                          "res", "reserved"})
IMPAIRMENT_SUFFIXES = "*~#!%$@^-"
HARMLESS_EXTRAS = frozenset({"completing", "reserved", "res", "cloud", "dynamic_norm", "perfctrs"})
ERROR_LIMIT = 200
REASON_LIMIT = 80
SHOWN = 3
NO_NODES = "no compute nodes registered"
NO_USABLE = "no usable nodes"


def _field(item: Any, name: str) -> Any:
    if isinstance(item, dict):
        return item.get(name)
    return getattr(item, name, None)


def node_is_healthy(state: str | None) -> bool:
    """Whether a node in this sinfo state can run jobs: an active base state and no impairment flag."""
    text = (state or "").strip().lower()
    base, *extras = text.split("+")
    if any(extra and extra not in HARMLESS_EXTRAS for extra in extras):
        return False
    return bool(base) and base[-1] not in IMPAIRMENT_SUFFIXES and base in ACTIVE_BASES


def first_line(error: str) -> str:
    """The first non-blank line of an error, at most 200 characters."""
    for line in error.splitlines():
        if line.strip():
            return line.strip()[:ERROR_LIMIT]
    return ""


def _listing(items: list[str]) -> str:
    shown = items[:SHOWN]
    if len(items) > SHOWN:
        shown.append(f"+{len(items) - SHOWN} more")
    return ", ".join(shown)


def _node_text(node: Any) -> str:
    text = f"{_field(node, 'name')} {(_field(node, 'state') or '').strip().lower() or 'unknown'}"
    reason = (_field(node, "reason") or "").strip()
    if reason:
        if len(reason) > REASON_LIMIT:
            reason = reason[:REASON_LIMIT - 1].rstrip() + "…"
        text += f" ({reason})"
    return text


def _unique(nodes: Iterable[Any]) -> list[Any]:
    seen: set[Any] = set()
    kept = []
    for node in nodes:
        name = _field(node, "name")
        if name not in seen:
            seen.add(name)
            kept.append(node)
    return kept


def derive(error: str | None, nodes: Iterable[Any], partitions: Iterable[Any]) -> tuple[str, str | None]:
    """The cluster's (status, detail) from one probe report, by the rules in this module's docstring."""
    # A blank error carries nothing to show; the probe always sends a non-blank one.
    if error is not None and error.strip():
        return UNAVAILABLE, first_line(error)
    nodes = _unique(nodes)
    if not nodes:
        return UNAVAILABLE, NO_NODES
    bad_nodes = [node for node in nodes if not node_is_healthy(_field(node, "state"))]
    bad_partitions = [part for part in _unique(partitions)
                      if (_field(part, "state") or "").strip().lower() != "up"]
    if not bad_nodes and not bad_partitions:
        return AVAILABLE, None
    parts = []
    if bad_nodes:
        parts.append(_listing([_node_text(node) for node in bad_nodes]))
    if bad_partitions:
        label = "partition" if len(bad_partitions) == 1 else "partitions"
        texts = [f"{_field(part, 'name')} {(_field(part, 'state') or '').strip().lower() or 'unknown'}"
                 for part in bad_partitions]
        parts.append(f"{label} {_listing(texts)}")
    if len(bad_nodes) == len(nodes):
        parts.append(NO_USABLE)
    return DEGRADED, "; ".join(parts)
