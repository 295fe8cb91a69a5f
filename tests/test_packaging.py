"""Packaging metadata that a release depends on (the build itself is checked by scripts/wheel-smoke,
which builds the sdist and wheel and installs the wheel in a fresh virtualenv)."""

import re
import tomllib
from pathlib import Path

import django_leasequeue

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_version_is_single_sourced_from_the_package():
    assert "version" not in PYPROJECT["project"]
    assert "version" in PYPROJECT["project"]["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "django_leasequeue.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+((a|b|rc)\d+)?", django_leasequeue.__version__)


def test_changelog_has_an_entry_for_this_version():
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert changelog.startswith("# Changelog")
    assert "## [Unreleased]" in changelog
    assert re.search(rf"^## \[{re.escape(django_leasequeue.__version__)}\] - ", changelog, re.M)


def test_license_and_classifiers():
    project = PYPROJECT["project"]
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    classifiers = set(project["classifiers"])
    for version in ("3.11", "3.12", "3.13"):
        assert f"Programming Language :: Python :: {version}" in classifiers
    for version in ("5.2", "6.0", "6.1"):
        assert f"Framework :: Django :: {version}" in classifiers
    assert project["requires-python"] == ">=3.11"
    assert {"Homepage", "Documentation", "Repository", "Changelog", "Issues"} <= set(project["urls"])


def test_only_the_app_is_packaged():
    assert PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"] == ["django_leasequeue*"]
    dev = " ".join(PYPROJECT["project"]["optional-dependencies"]["dev"])
    assert "build" in dev and "twine" in dev
