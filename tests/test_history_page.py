"""The `runner history --html` page's table of runs reads whole: a host name and a start time are never broken over
lines in a narrow column ('ci-' / 'runner-' / '1' on three lines), and a host copied from it is the host's name."""

from __future__ import annotations

import re
from html.parser import HTMLParser


class _Table(HTMLParser):
    """The first table's rows, each cell as (its attributes, its text), and the page's style sheet."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[tuple[dict[str, str], str]]] = []
        self.style, self._in, self._tables = "", "", 0

    def handle_starttag(self, tag, attrs):
        self._tables += tag == "table"
        if tag == "tr" and self._tables == 1:
            self.rows.append([])
        if tag in ("td", "th") and self._tables == 1:
            self.rows[-1].append(({k: v or "" for k, v in attrs}, ""))
        self._in = tag

    def handle_data(self, data):
        if self._in == "style":
            self.style += data
        elif self._in in ("td", "th") and self._tables == 1 and self.rows and self.rows[-1]:
            attrs, text = self.rows[-1][-1]
            self.rows[-1][-1] = (attrs, text + data)

    def handle_endtag(self, tag):
        self._in = ""


def _nowrap(style: str, attrs: dict[str, str]) -> bool:
    """Whether a cell with these attributes is kept on one line: its own style, or a rule of the page's style sheet
    whose selector names its class."""
    if "white-space:nowrap" in attrs.get("style", "").replace(" ", ""):
        return True
    for selectors, rules in re.findall(r"([^{}]+)\{([^}]*)\}", style):
        named = {s.strip() for s in selectors.split(",")}
        if "white-space:nowrap" in rules.replace(" ", "") and any(
            f"td.{c}" in named for c in attrs.get("class", "").split()
        ):
            return True
    return False


def test_the_host_and_date_cells_of_a_case_page_are_never_broken_at_their_hyphens(tmp_path):
    from runner.history import page
    from runner.history.series import Entry, History

    runs = [Entry(f"run{i}", 1.79e9 + 3600 * i, 1e-4, host=f"ci-runner-{i % 2 + 1}") for i in range(4)]
    case = History("c", "numpy-mlp-gradients-eager-cpu-float32 batch_size=32", "m", "box", runs)
    page.write([case], tmp_path)
    table = _Table()
    table.feed((tmp_path / "c-m.html").read_text())
    headers = [text for _, text in table.rows[0]]
    started, host = headers.index("started"), headers.index("host")
    cells = [(row[started], row[host]) for row in table.rows[1:]]
    assert [(when[1][:10], where[1]) for when, where in cells] == [
        ("2026-09-21", "ci-runner-1"), ("2026-09-21", "ci-runner-2"), ("2026-09-21", "ci-runner-1"),
        ("2026-09-21", "ci-runner-2"),
    ]  # fmt: skip
    for when, where in cells:  # each kept whole, and its text the host's own name (no U+2011 hyphens)
        assert _nowrap(table.style, when[0]) and _nowrap(table.style, where[0]), (when, where, table.style)
