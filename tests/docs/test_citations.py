"""Every citation in the code, the tests and the docs resolves inside the repository.

Case ids (``C`` and two digits) are defined in docs/explanation/cases.md, each naming the tests that
hold it; nothing cites a document the repository does not ship or a tracker issue by number.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
CASES = ROOT / "docs" / "explanation" / "cases.md"
PACKAGE = ROOT / "django_leasequeue"
TESTS = ROOT / "tests"
DOCS = ROOT / "docs"

CASE_ID = re.compile(r"\bC\d\d\b")
CASE_HEADING = re.compile(r"^## (C\d\d)\b.*\{ #(c\d\d) \}$", re.MULTILINE)
TEST_NAME = re.compile(r"`(test_\w+)`")
# Built from parts so that this file does not match itself.
OUTSIDE_DOCUMENTS = tuple(name + ".md" for name in ("DESIGN", "CASES", "STYLE"))
SECTION_SIGN = "\u00a7"
# An issue number: ours (the word "issue" and a number) or a peer queue's (its name, "#" and a number).
PEERS = "Oban|River|Procrastinate|GoodJob|Graphile|pg-boss|Solid Queue|Celery"
ISSUE_NUMBER = re.compile(rf"\b(?:issues?\s+#?\d+|(?:{PEERS})\s+#\d+)", re.IGNORECASE)


def _citing_files() -> list[Path]:
    """Python files of the package and the tests, the docs pages and the README."""
    files = [*PACKAGE.rglob("*.py"), *TESTS.rglob("*.py"), *DOCS.rglob("*.md"), ROOT / "README.md"]
    return sorted(path for path in files if "__pycache__" not in path.parts)


def _defined_cases() -> dict[str, str]:
    """Case id -> the text of its entry in docs/explanation/cases.md."""
    text = CASES.read_text()
    headings = list(CASE_HEADING.finditer(text))
    return {match[1]: text[match.end():headings[i + 1].start() if i + 1 < len(headings) else len(text)]
            for i, match in enumerate(headings)}


def _test_functions() -> set[str]:
    names: set[str] = set()
    for path in TESTS.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test_"):
                names.add(node.name)
    return names


def test_case_headings_carry_their_own_anchor():
    for match in CASE_HEADING.finditer(CASES.read_text()):
        assert match[2] == match[1].lower(), match[0]


def test_every_cited_case_id_has_an_entry():
    defined = _defined_cases()
    missing: dict[str, list[str]] = {}
    for path in _citing_files():
        if path == CASES:
            continue
        for case in set(CASE_ID.findall(path.read_text())) - set(defined):
            missing.setdefault(case, []).append(str(path.relative_to(ROOT)))
    assert missing == {}


def test_every_case_entry_says_what_went_wrong_the_invariant_and_its_tests():
    for case, entry in _defined_cases().items():
        for part in ("**What went wrong.**", "**Invariant.**", "**Tests.**"):
            assert part in entry, f"{case}: no {part}"
        assert TEST_NAME.search(entry.split("**Tests.**", 1)[1]), f"{case}: names no test"


def test_every_test_named_in_the_cases_exists():
    named = set(TEST_NAME.findall(CASES.read_text()))
    assert named, "docs/explanation/cases.md names no test"
    assert sorted(named - _test_functions()) == []


def test_nothing_cites_outside_documents_or_issue_numbers():
    forbidden = re.compile("|".join([*map(re.escape, OUTSIDE_DOCUMENTS), SECTION_SIGN, ISSUE_NUMBER.pattern]),
                           re.IGNORECASE)
    offenders: list[str] = []
    for path in _citing_files():
        text = path.read_text()
        for match in forbidden.finditer(text):
            if match[0].endswith(".md") and match[0] not in OUTSIDE_DOCUMENTS:
                continue  # a page of ours, such as docs/explanation/design.md
            line = text.count("\n", 0, match.start()) + 1
            offenders.append(f"{path.relative_to(ROOT)}:{line}: {' '.join(match[0].split())}")
    assert not offenders, "cites a document outside the repository or an issue number:\n" + "\n".join(offenders)
