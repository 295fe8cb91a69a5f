"""Every ``runworker`` banner and stop line quoted in the docs and the README is one the code prints.

A quoted line is found by its start (``worker ID: queues``, ``N task(s) registered``, ``worker ID
stopped after``), in fenced blocks and in inline code; its values are read back and printed again
by the functions ``runworker`` prints with (``start_line``, ``tasks_line``,
``WorkerCounts.summary``); the page's line must be exactly that. A line that starts like one but
cannot be read back fails too, so a change of format fails here until every page quotes the new one.
"""

from __future__ import annotations

import re

import pytest

from django_leasequeue.management.commands.runworker import start_line, tasks_line
from django_leasequeue.worker.tally import WorkerCounts

from .fresh_project import FENCE, ROOT

PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])

LOOKS_LIKE = {
    "start": re.compile(r"worker \S+: queues "),
    "tasks": re.compile(r"\b\d+ task\(s\) registered"),
    "stop": re.compile(r"worker \S+ (?:stopped after|running for) \d"),
}
START = re.compile(r"worker (?P<id>\S+): queues (?P<queues>\S+), (?P<threads>\d+) thread\(s\), "
                   r"(?:async slots (?P<slots>\d+), )?lease (?P<lease>[\d.]+) s, "
                   r"(?P<execution>\w+) execution(?P<burst>, burst)?"
                   r"(?P<async>, asynchronous completions \(ASYNC_COMPLETIONS\))?; "
                   r"SIGTERM or Ctrl-C stops gracefully\.")
TASKS = re.compile(r"(?P<total>\d+) task\(s\) registered \((?P<native>\d+) native, (?P<framework>\d+) django\.tasks"
                   r"(?:; (?P<async>\d+) async)?\): "
                   r"(?P<listed>.+?)(?: and (?P<more>\d+) more)?|0 task\(s\) registered: none \(.*\)")
STOP = re.compile(r"worker (?P<id>\S+) (?P<state>stopped after|running for) (?P<elapsed>\d+\.\d) s: "
                  r"(?P<claimed>\d+) claimed, (?P<done>\d+) done, (?P<retried>\d+) retried, "
                  r"(?P<dead>\d+) dead-lettered, (?P<lost>\d+) lease lost, (?P<released>\d+) released"
                  r"(?:, (?P<snoozed>\d+) snoozed)?(?:, (?P<cancelled>\d+) cancelled)?"
                  r"(?:, \d+ (?:unsettled \(their leases expire\)|in hand))?")


def quoted(text: str) -> list[str]:
    """The lines of the fenced blocks and the inline code spans (a span's line breaks as spaces)."""
    found = [line for match in FENCE.finditer(text) for line in match.group(3).splitlines()]
    prose = FENCE.sub("", text)
    found += [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", prose)]
    return found


def samples() -> list[tuple[str, str, str]]:
    """(page, kind, the quoted text from the line's start) of every banner or stop line quoted."""
    out = []
    for page in PAGES:
        for line in quoted(page.read_text()):
            for kind, looks in LOOKS_LIKE.items():
                match = looks.search(line)
                if match:
                    out.append((str(page.relative_to(ROOT)), kind, line[match.start():].rstrip()))
    return out


def printed(kind: str, sample: str) -> str:
    """What the code prints for the values ``sample`` quotes (fails when they cannot be read)."""
    if kind == "start":
        m = START.fullmatch(sample)
        assert m, f"not the banner's first line as runworker prints it: {sample!r}"
        queues = None if m["queues"] == "*" else m["queues"].split(",")
        return start_line(m["id"], queues, int(m["threads"]), float(m["lease"]), m["execution"], bool(m["burst"]),
                          async_completions=bool(m["async"]), async_slots=int(m["slots"] or 0))
    if kind == "tasks":
        m = TASKS.fullmatch(sample)
        assert m, f"not the banner's tasks line as runworker prints it: {sample!r}"
        if m["total"] is None:
            return tasks_line([], 0)
        listed = m["listed"].split(", ")
        marked = {name.removesuffix(" (async)") for name in listed if name.endswith(" (async)")}
        more = [f"~more {n}" for n in range(int(m["more"] or 0))]
        names = [name.removesuffix(" (async)") for name in listed] + more
        assert int(m["native"]) + int(m["framework"]) == int(m["total"]), f"the kinds do not add up: {sample!r}"
        # The async tasks not listed are among the "more" (a count below the marked ones differs).
        async_names = marked | set(more[:max(0, int(m["async"] or 0) - len(marked))])
        return tasks_line(names, int(m["native"]), async_names=async_names)
    m = STOP.fullmatch(sample)
    assert m, f"not the stop line as runworker prints it: {sample!r}"
    counts = WorkerCounts(claimed=int(m["claimed"]), done=int(m["done"]), retried=int(m["retried"]),
                          dead_lettered=int(m["dead"]), lease_lost=int(m["lost"]), released=int(m["released"]),
                          snoozed=int(m["snoozed"] or 0), cancelled=int(m["cancelled"] or 0),
                          elapsed=float(m["elapsed"]))
    # Printed again from the counts, an unsettled count that does not match the others differs.
    return counts.summary(m["id"], stopped=m["state"] == "stopped after")


SAMPLES = samples()


def test_the_pages_quote_banners_and_stop_lines():
    kinds = {(page, kind) for page, kind, _ in SAMPLES}
    for page in ("README.md", "docs/howto/django-tasks.md"):
        assert {(page, "start"), (page, "tasks"), (page, "stop")} <= kinds, page
    assert ("docs/reference/commands.md", "stop") in kinds


@pytest.mark.parametrize(("page", "kind", "sample"), SAMPLES,
                         ids=[f"{page}:{kind}:{n}" for n, (page, kind, _) in enumerate(SAMPLES)])
def test_a_quoted_line_is_what_runworker_prints(page, kind, sample):
    assert printed(kind, sample) == sample, page


@pytest.mark.parametrize(("kind", "sample"), [
    ("start", "worker vm:1:A: queues *, 2 thread(s), lease 30.0 s, thread execution; "
              "SIGTERM or Ctrl-C stops gracefully."),  # the lease as the old log line printed it
    ("tasks", "3 task(s) registered: a, b, c"),  # before the kinds were counted
    ("tasks", "3 task(s) registered (1 native, 1 django.tasks): a, b, c"),
    ("tasks", "3 task(s) registered (3 native, 0 django.tasks; 1 async): a (async), b (async), c"),
    ("tasks", "2 task(s) registered (2 native, 0 django.tasks): a (async), b"),  # marked, not counted
    ("start", "worker vm:1:A: queues *, 2 thread(s), async slots 0, lease 30 s, thread execution; "
              "SIGTERM or Ctrl-C stops gracefully."),  # no slots are not shown
    ("stop", "worker vm:1:A stopped after 2.0 s: 3 claimed, 1 done, 0 retried, 0 dead-lettered, 0 lease lost, "
             "0 released"),  # 2 claims with no outcome: the code prints them as unsettled
])
def test_an_outdated_or_inconsistent_sample_is_caught(kind, sample):
    looks = LOOKS_LIKE[kind].search(sample)
    assert looks is not None, "recognised as a quoted line of its kind"
    with pytest.raises(AssertionError):
        assert printed(kind, sample[looks.start():]) == sample[looks.start():]
