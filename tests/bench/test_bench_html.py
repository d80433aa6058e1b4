"""`headrace bench` writes report.html beside bench.json and its PNGs: one self-contained file
with the same SLO tables as the printed report (all, per tier, per tenant) and every plot
embedded, nothing fetched from anywhere, every value from the run escaped."""

from __future__ import annotations

import base64
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class Page(HTMLParser):
    """The tables' rows (cell texts) and the images' sources of an HTML page."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self.images: list[str] = []
        self.links: list[str] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "img":
            self.images.append(a["src"] or "")
        for key in ("href", "src"):
            if key in a and tag != "img":
                self.links.append(a[key] or "")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def test_report_html_holds_the_tables_and_the_plots(stub_server, tmp_path: Path) -> None:
    url, _ = stub_server(slots=2, token_delay=0.002)
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(
        "tenants:\n"
        "  - {name: acme, api_key: k-acme, tier: paid, share: 1}\n"
        "  - {name: '<b>evil</b>', api_key: k-evil, tier: free, share: 1}\n"
    )
    cmd = [sys.executable, "-m", "headrace.cli", "bench", "--url", url, "--concurrency", "1,2",
           "--num-requests", "8", "--output-len", "4", "--scrape-interval", "0.05",
           "--tenants", str(tenants), "--out", str(tmp_path)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert str(tmp_path / "report.html") in proc.stdout  # listed with what was written
    html = (tmp_path / "report.html").read_text()
    page = Page()
    page.feed(html)

    printed = {line.split()[0] + " " + line.split()[1] for line in proc.stdout.splitlines()
               if re.match(r"\s*\d+ streams", line)}  # fmt: skip
    labels = {row[0] for row in page.rows if row}
    assert {"1 streams", "2 streams", "1 streams acme", "2 streams paid"} <= labels
    assert printed <= {" ".join(label.split()[:2]) for label in labels}
    assert "<b>evil</b>" not in html and "&lt;b&gt;evil&lt;/b&gt;" in html
    assert len(page.images) == 3  # sweep, CDFs, timeline
    for src in page.images:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == PNG_SIGNATURE
    assert page.links == []  # nothing else to fetch


def test_without_plots_the_report_has_the_tables(stub_server, tmp_path: Path) -> None:
    url, _ = stub_server(slots=1, token_delay=0.002)
    cmd = [sys.executable, "-m", "headrace.cli", "bench", "--url", url, "--concurrency", "1",
           "--num-requests", "3", "--output-len", "2", "--no-plots",
           "--out", str(tmp_path)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    page = Page()
    page.feed((tmp_path / "report.html").read_text())
    assert page.images == []
    assert [row[:2] for row in page.rows[1:]] == [["1 streams", "3/3"]]
