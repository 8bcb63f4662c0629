"""The README documents what a client meets first (issue 26, acceptance 6): every
`x-infercache-*` header the package sends or reads, `--port` and `/healthz`. The headers are
found in the source, so a header added later without a README line fails here."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HEADER = re.compile(r"""["'](x-infercache-[a-z0-9-]+)["']""")


def _headers_in_source() -> set[str]:
    found: set[str] = set()
    for path in (REPO / "src" / "infercache").rglob("*.py"):
        found.update(HEADER.findall(path.read_text(encoding="utf-8")))
    return found


def test_every_x_infercache_header_in_the_source_is_in_the_readme() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    headers = _headers_in_source()
    assert len(headers) >= 5  # the scan finds them (tenant, coalesced, cached inputs, ...)
    assert sorted(h for h in headers if f"`{h}" not in readme) == []


def test_the_readme_documents_the_port_and_the_health_check() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "--port" in readme
    assert "/healthz" in readme
