"""collector.health: the status and detail strings (its docstring's rules), for every Slurm node state and flag."""

from __future__ import annotations

import dataclasses

import pytest

from collector.health import derive
from collector.health import node_is_healthy


@dataclasses.dataclass
class Node:
    name: str
    state: str
    reason: str | None = None


@dataclasses.dataclass
class Partition:
    name: str
    state: str


UP = [Partition("debug", "up")]

# Active base states, in sinfo's %T (long) and %t (compact) forms.
HEALTHY = ["idle", "alloc", "allocated", "mix", "mixed", "comp", "completing", "res", "reserved",
           # allocated and completing at once: node_state_string's "ALLOCATED+"
           "allocated+", "IDLE", " mixed ",
           # StateComplete (+FLAG) forms whose extras do not impair
           "idle+cloud", "allocated+completing", "mixed+reserved", "idle+res", "idle+dynamic_norm",
           "idle+perfctrs"]

# Every other base state node_state_string / node_state_string_compact can print.
INACTIVE_BASES = ["drain", "drained", "draining", "drng", "down", "fail", "failing", "maint", "reboot",
                  "boot", "reboot_issued", "cancel_reboot", "planned", "plnd", "future", "futr",
                  "unknown", "unk", "inval", "cloud", "power_down", "power_up", "powering_down",
                  "powered_down", "powering_up", "resume", "perfctrs", "npc", "error", "?", ""]

# node_state_string's one-character flags: every one impairs an otherwise active node.
SUFFIXES = {"*": "not responding", "~": "powered off", "#": "powering up", "!": "pending power down",
            "%": "powering down", "$": "maintenance", "@": "pending reboot", "^": "reboot issued",
            "-": "planned"}

IMPAIRING_EXTRAS = ["drain", "fail", "maintenance", "maint", "not_responding", "power_down", "powered_down",
                    "powering_down", "power_up", "powering_up", "reboot_requested", "reboot_issued",
                    "invalid_reg", "planned", "dynamic_future", "resume", "some_new_flag"]


@pytest.mark.parametrize("state", HEALTHY)
def test_active_states_are_healthy(state):
    assert node_is_healthy(state)
    assert derive(None, [Node("n1", state)], UP) == ("available", None)


@pytest.mark.parametrize("state", INACTIVE_BASES)
def test_inactive_base_states_degrade(state):
    assert not node_is_healthy(state)


@pytest.mark.parametrize("base", ["idle", "allocated", "mixed", "completing", "reserved"])
@pytest.mark.parametrize("flag", sorted(SUFFIXES))
def test_each_suffix_flag_impairs(base, flag):
    state = base + flag
    assert not node_is_healthy(state)
    assert derive(None, [Node("n1", state), Node("n2", "idle")], UP) == ("degraded", f"n1 {state}")


@pytest.mark.parametrize("state", ["drained*", "down*", "drained~", "draining$", "down@", "maint*",
                                   "reboot^", "fail*", "failing*", "unknown*", "future#", "mixed*"])
def test_inactive_states_with_flags(state):
    assert not node_is_healthy(state)


@pytest.mark.parametrize("extra", IMPAIRING_EXTRAS)
def test_impairing_plus_extras(extra):
    state = f"idle+{extra}"
    assert not node_is_healthy(state)
    assert derive(None, [Node("n1", state, "why")], UP) == ("degraded", f"n1 {state} (why); no usable nodes")


@pytest.mark.parametrize(("nodes", "partitions", "expected"), [
    # The shapes the real cluster gave (tests/data/slurm), one node.
    ([Node("localhost", "drained", "test")], UP, "localhost drained (test); no usable nodes"),
    ([Node("localhost", "draining", "disk check")], UP, "localhost draining (disk check); no usable nodes"),
    ([Node("localhost", "down", "simulated outage")], UP, "localhost down (simulated outage); no usable nodes"),
    ([Node("localhost", "maint")], UP, "localhost maint; no usable nodes"),
    ([Node("localhost", "idle")], [Partition("debug", "down")], "partition debug down"),
    ([Node("localhost", "idle")], [Partition("debug", "inact")], "partition debug inact"),
    ([Node("localhost", "idle")], [Partition("debug", "up"), Partition("gpu", "down")], "partition gpu down"),
    # Several nodes: healthy ones are not named; at most three, then +N more.
    ([Node("a", "idle"), Node("b", "down*", "Not responding")], UP, "b down* (Not responding)"),
    ([Node("a", "drained", "test"), Node("b", "down*", "Not responding"), Node("c", "idle~"),
      Node("d", "mixed"), Node("e", "fail", "bad dimm"), Node("f", "idle#")], UP,
     "a drained (test), b down* (Not responding), c idle~, +2 more"),
    ([Node("a", "drained", "test"), Node("b", "down*", "Not responding"), Node("c", "idle~")], UP,
     "a drained (test), b down* (Not responding), c idle~; no usable nodes"),
    ([Node(f"n{i}", "down", "rack power") for i in range(1, 11)], UP,
     "n1 down (rack power), n2 down (rack power), n3 down (rack power), +7 more; no usable nodes"),
    # Partitions: singular and plural label, +N more, after the nodes.
    ([Node("a", "idle")], [Partition("p1", "down"), Partition("p2", "drain")], "partitions p1 down, p2 drain"),
    ([Node("a", "idle")], [Partition(f"p{i}", "down") for i in range(1, 6)],
     "partitions p1 down, p2 down, p3 down, +2 more"),
    ([Node("a", "drained", "test"), Node("b", "idle")], [Partition("gpu", "down")],
     "a drained (test); partition gpu down"),
    ([Node("localhost", "drained", "test"), Node("node2", "down*", "not responding"), Node("n3", "maint"),
      Node("n4", "fail"), Node("n5", "future")],
     [Partition("gpu", "down"), Partition("big", "inactive"), Partition("debug", "up")],
     "localhost drained (test), node2 down* (not responding), n3 maint, +2 more; "
     "partitions gpu down, big inactive; no usable nodes"),
    # A node listed once per partition counts once; so does a partition listed twice.
    ([Node("a", "drained", "x"), Node("a", "drained", "x"), Node("b", "idle")],
     [Partition("gpu", "down"), Partition("gpu", "down")], "a drained (x); partition gpu down"),
])
def test_degraded_detail(nodes, partitions, expected):
    assert derive(None, nodes, partitions) == ("degraded", expected)


def test_long_reason_is_cut():
    status, detail = derive(None, [Node("a", "drained", "x" * 300)], UP)
    assert status == "degraded"
    assert detail == "a drained (" + "x" * 79 + "…); no usable nodes"


def test_no_partitions_reported_is_fine():
    assert derive(None, [Node("a", "idle")], []) == ("available", None)


def test_dicts_work_like_objects():
    assert derive(None, [{"name": "a", "state": "down", "reason": None}], [{"name": "p", "state": "up"}]) == (
        "degraded", "a down; no usable nodes")


@pytest.mark.parametrize(("error", "expected"), [
    ("slurm_load_partitions: Unable to contact slurm controller (connect failure)",
     "slurm_load_partitions: Unable to contact slurm controller (connect failure)"),
    ("sinfo: command not found", "sinfo: command not found"),
    ("sinfo timed out after 20 s", "sinfo timed out after 20 s"),
    ("first line\nsecond line", "first line"),
    ("\n  \n  indented first  \nsecond", "indented first"),
    ("e" * 500, "e" * 200),
])
def test_error_is_unavailable_with_its_first_line(error, expected):
    # Nodes are ignored when the probe failed.
    assert derive(error, [Node("a", "idle")], UP) == ("unavailable", expected)


def test_no_nodes_is_unavailable():
    assert derive(None, [], UP) == ("unavailable", "no compute nodes registered")
    assert derive(None, [], []) == ("unavailable", "no compute nodes registered")
    # A blank error says nothing: judged by the nodes.
    assert derive("  ", [], []) == ("unavailable", "no compute nodes registered")
    assert derive("", [Node("a", "idle")], UP) == ("available", None)
