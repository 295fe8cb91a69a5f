"""The hand-written reference pages cover the code: every setting (with its real default), every
option of every management command, every lifecycle signal. A new key, option or signal fails
here until the page documents it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from django.core.management import get_commands, load_command_class

from django_leasequeue import signals
from django_leasequeue.conf import DEFAULTS

DOCS = Path(__file__).resolve().parent.parent.parent / "docs"
COMMANDS = ["runworker", "runreaper", "runscheduler", "syncschedules", "queuehealth", "leasequeue_queue"]
# Options every Django command has; the page leaves them out.
DJANGO_COMMON = {"-h", "--help", "--version", "-v", "--verbosity", "--settings", "--pythonpath", "--traceback",
                 "--no-color", "--force-color", "--skip-checks"}


def table_rows(text: str) -> dict[str, list[str]]:
    """Markdown table rows keyed by their first cell with the backticks removed."""
    rows = {}
    for line in text.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[cells[0].strip("`")] = cells[1:]
    return rows


def test_settings_page_lists_every_key_with_its_real_default():
    rows = table_rows((DOCS / "reference" / "settings.md").read_text())
    assert set(DEFAULTS) <= set(rows), f"undocumented settings: {sorted(set(DEFAULTS) - set(rows))}"
    for key, default in DEFAULTS.items():
        shown = re.match(r"`([^`]*)`", rows[key][0])
        assert shown, f"{key}: the default cell must start with the value in backticks"
        assert ast.literal_eval(shown.group(1)) == default, f"{key}: documented {shown.group(1)}, real {default!r}"


def sections(text: str) -> dict[str, str]:
    """``## name`` sections of a page, by name."""
    parts = re.split(r"^## ", text, flags=re.MULTILINE)
    return {part.split("\n", 1)[0].strip(): part for part in parts[1:]}


@pytest.mark.parametrize("name", COMMANDS)
def test_commands_page_lists_every_option(name):
    assert get_commands()[name] == "django_leasequeue"
    parser = load_command_class("django_leasequeue", name).create_parser("manage.py", name)
    section = sections((DOCS / "reference" / "commands.md").read_text()).get(name)
    assert section is not None, f"docs/reference/commands.md has no '## {name}' section"
    for action in parser._actions:
        options = [o for o in action.option_strings if o not in DJANGO_COMMON]
        for option in options:
            assert f"`{option}" in section, f"{name}: option {option} is not documented"
        if not action.option_strings and action.dest != "help":
            # positional arguments: their choices (leasequeue_queue's actions) are documented
            for choice in action.choices or []:
                assert f"`{choice}" in section, f"{name}: argument {choice!r} is not documented"


def test_signals_page_lists_every_signal():
    rows = table_rows((DOCS / "reference" / "signals.md").read_text())
    for event, signal in signals.SIGNALS.items():
        assert getattr(signals, f"job_{event}") is signal
        assert f"job_{event}" in rows, f"signal job_{event} is not documented"


def test_readme_links_resolve():
    """README.md is not part of the site (the strict build checks the site's links); its relative
    links into docs/ are checked here."""
    readme = DOCS.parent / "README.md"
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme.read_text())
    local = [link for link in links if "://" not in link]
    assert local, "README.md links to no local file"
    missing = [link for link in local if not (readme.parent / link).exists()]
    assert not missing, f"README.md links to missing files: {missing}"
