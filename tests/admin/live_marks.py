"""What the live-update tests share: the ``data-live`` marks of a rendered page and their texts,
to compare with the JSON of the page's live endpoint (``django_leasequeue/admin/live.py``)."""

from __future__ import annotations

from html.parser import HTMLParser

# Elements that have no end tag: they cannot hold a live text.
_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class _Marks(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.marks: dict[str, str] = {}
        self._open: list[tuple[str, int, list[str]]] = []  # (key, depth at its start tag, text parts)
        self._depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _VOID:
            return
        self._depth += 1
        key = dict(attrs).get("data-live")
        if key is not None:
            assert key not in self.marks and all(k != key for k, _, _ in self._open), f"key {key!r} twice"
            self._open.append((key, self._depth, []))

    def handle_endtag(self, tag: str) -> None:
        if tag in _VOID:
            return
        if self._open and self._open[-1][1] == self._depth:
            key, _, parts = self._open.pop()
            self.marks[key] = "".join(parts)
        self._depth -= 1

    def handle_data(self, data: str) -> None:
        for _, _, parts in self._open:
            parts.append(data)


def live_marks(html: str) -> dict[str, str]:
    """``{key: text}`` of every ``data-live="<key>"`` element of ``html`` (its text content, as
    ``live.js`` compares it)."""
    parser = _Marks()
    parser.feed(html)
    parser.close()
    return parser.marks
