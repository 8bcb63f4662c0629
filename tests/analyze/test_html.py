"""The HTML report renders in headless Chromium with every plot decoded; the plots are honest:
rate axes from 0, legends inside the figure, no plot for a strategy the replay cannot show; the
header names the tokenizer and the calibration; tenants show by their configured names."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from infercache.analyze.report_json import from_json, to_json
from infercache.analyze.report_tree import Figures
from infercache.analyze.reports.document import build_report
from infercache.analyze.reports.plots import plots_for
from infercache.analyze.reports.text import header_lines
from tests.analyze.conftest import MOONCAKE, RunAnalysis
from tests.analyze.generators import support_bot, write_lines
from tests.harness.cli import run_analyze

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


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Figures]:
    tmp = tmp_path_factory.mktemp("html")
    log = support_bot(seed=6, n=400).write(tmp / "support.jsonl", gz=True)
    common = ["--tokenizer", "chars4", "--price", "*=0.15,0.6,0.075", "--by", "hour",
              "--semantic-threshold", "0.93", "--embedder", "static"]  # fmt: skip
    out = tmp / "report.html"
    assert run_analyze(str(log), "--format", "html", "--out", str(out), *common) == 0
    as_json = tmp / "report.json"
    assert run_analyze(str(log), "--format", "json", "--sweep", "--out", str(as_json),
                   *common) == 0  # fmt: skip
    return out, from_json(Figures, json.loads(as_json.read_text()))


def test_the_page_is_self_contained_and_names_what_it_measured_with(
    page: tuple[Path, Figures],
) -> None:
    path, report = page
    text = path.read_text()
    sources = re.findall(r"""\bsrc=['"]?([^'" >]+)""", text)
    assert len(sources) == len(plots_for(report))
    assert all(s.startswith("data:image/png;base64,") for s in sources)
    assert "<link" not in text
    assert "Turn on: exact → prefix" in text
    assert "tokenizer: chars4" in text
    assert "near-duplicate calibration: threshold 0.93 from --semantic-threshold" in text
    assert "KV budget: unbounded" in text


def test_the_page_renders_in_headless_chromium_with_every_plot(
    page: tuple[Path, Figures], tmp_path: Path
) -> None:
    path, report = page
    profile = tmp_path / "profile"
    command = [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom",
               path.as_uri()]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    body = re.search(r"<body[^>]*>", dom)
    assert body is not None
    assert 'data-ready="true"' in body.group(0)
    keys = [key for key, _, _ in plots_for(report)]
    assert f'data-plots-decoded="{len(keys)}"' in body.group(0)
    assert set(keys) >= {"census", "ttl", "exact-capacity", "kv-budget", "windows"}
    for key in keys:
        assert f'id="plot-{key}"' in dom


def test_a_screenshot_of_the_page_is_not_blank(page: tuple[Path, Figures], tmp_path: Path) -> None:
    shot = tmp_path / "page.png"
    command = [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
               "--window-size=1100,2400", f"--screenshot={shot}", page[0].as_uri()]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    from matplotlib.image import imread

    pixels = imread(str(shot))
    assert pixels.shape[0] >= 2000
    assert pixels.std() > 0.05  # text, tables and plots, not a blank canvas


def test_rate_axes_start_at_zero_and_legends_fit_inside_the_figure(
    page: tuple[Path, Figures],
) -> None:
    report = page[1]
    for key, _, draw in plots_for(report):
        figure = draw(report)
        figure.canvas.draw()
        box = figure.bbox
        for ax in figure.axes:
            if "%" in ax.get_ylabel():
                assert ax.get_ylim()[0] == 0, key
        for legend in figure.legends + [ax.get_legend() for ax in figure.axes]:
            if legend is None:
                continue
            extent = legend.get_window_extent()
            assert box.x0 <= extent.x0, key
            assert extent.x1 <= box.x1, key
            assert box.y0 <= extent.y0, key
            assert extent.y1 <= box.y1, key


def test_no_plot_for_what_the_replay_calls_not_available(run_analysis: RunAnalysis) -> None:
    report = build_report(run_analysis([MOONCAKE], sweep=True)).figures
    assert to_json(report.simulation)["exact"] == {"available": False}
    keys = [key for key, _, _ in plots_for(report)]
    assert "ttl" not in keys
    assert "exact-capacity" not in keys
    assert "kv-budget" in keys
    # the header says what the counts are in (a trace is never "tokenizer None")
    assert "tokenizer: block-hash trace, 512 tokens a block" in header_lines(report)


def test_tenants_show_by_their_configured_names(tmp_path: Path, run_analysis: RunAnalysis) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "temperature": 0}
    records = [
        {"timestamp": 1.0, "tenant": "key:0123456789abcdef", "tenant_name": "team-a",
         "request": body},
        {"timestamp": 2.0, "tenant": "key:fedcba9876543210/acme", "request": body},
        {"timestamp": 3.0, "tenant": "plain", "request": body},
    ]  # fmt: skip
    log = write_lines(tmp_path / "log.jsonl", [json.dumps(r) for r in records])
    report = build_report(run_analysis([log])).to_dict()
    assert report["tenant_names"] == {
        "key:0123456789abcdef": "team-a",
        "key:fedcba9876543210/acme": "acme (key:fedcba98…)",
        "plain": "plain",
    }
