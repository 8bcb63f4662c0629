"""Acceptance 4: the HTML report renders in headless Chromium with every plot decoded."""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from infercache.analyze.cli import register
from infercache.analyze.reports.plots import PLOTS
from tests.analyze.generators import support_bot

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--virtual-time-budget=10000",
]


def chromium() -> str:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        pytest.fail("chromium is not installed: run the tests with ./run test")
    return binary


def run_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="infercache")
    register(parser.add_subparsers())
    args = parser.parse_args(list(argv))
    code: int = args.handler(args, environ={})
    return code


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("html")
    log = support_bot(seed=6, n=400).write(tmp / "support.jsonl", gz=True)
    out = tmp / "report.html"
    code = run_cli("analyze", str(log), "--format", "html", "--out", str(out),
                   "--tokenizer", "chars4", "--price", "*=0.15,0.6,0.075")  # fmt: skip
    assert code == 0
    return out


def test_the_page_is_self_contained(page: Path) -> None:
    text = page.read_text()
    sources = re.findall(r"""\bsrc=['"]?([^'" >]+)""", text)
    assert len(sources) == len(PLOTS)
    assert all(s.startswith("data:image/png;base64,") for s in sources)
    assert "<link" not in text
    assert "Turn on: exact → prefix" in text


def test_the_page_renders_in_headless_chromium_with_every_plot(page: Path, tmp_path: Path) -> None:
    profile = tmp_path / "profile"
    command = [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom",
               page.as_uri()]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    body = re.search(r"<body[^>]*>", dom)
    assert body is not None
    assert 'data-ready="true"' in body.group(0)
    assert f'data-plots-decoded="{len(PLOTS)}"' in body.group(0)
    for key, _, _ in PLOTS:
        assert f'id="plot-{key}"' in dom


def test_a_screenshot_of_the_page_is_not_blank(page: Path, tmp_path: Path) -> None:
    shot = tmp_path / "page.png"
    command = [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
               "--window-size=1100,2400", f"--screenshot={shot}", page.as_uri()]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    from matplotlib.image import imread

    pixels = imread(str(shot))
    assert pixels.shape[0] >= 2000
    assert pixels.std() > 0.05  # text, tables and plots, not a blank canvas
