"""scripts/screenshot-mlflow-ui.sh shows what a person sees in MLflow's UI after a sweep: the parent's page opens
on the answer, its description expands, the assistant panel is closed and the timing trace is drawn. Runs where
Chromium is installed (apt-get install -y chromium), skipped elsewhere."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from helpers import free_port, sweep_cli

from runner.config import PROJECT_ROOT

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("chromium") is None, reason="no chromium (apt-get install -y chromium)"),
]


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("screenshots")
    done = sweep_cli(tmp, "backend=numpy,torch", "seed=0,1")
    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp / "shots"
    script = PROJECT_ROOT / "scripts" / "screenshot-mlflow-ui.sh"
    shot = subprocess.run(
        ["bash", str(script), str(tmp / "mlflow.db"), str(out), "sweeps", str(free_port())],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert shot.returncode == 0, shot.stderr[-3000:]
    return out


def first_screen(out, name: str) -> str:
    return (out / f"{name}.txt").read_text()


def test_the_parent_page_opens_on_the_answer_before_any_click(shots):
    text = first_screen(shots, "parent-page-as-opened")
    assert re.search(r"(numpy|torch) fastest \([\d.]+ [nµm]?s\); (numpy|torch) [\d.]+x", text), text[:2000]
    assert "Show more" in text  # the rest of the description waits behind the click
    assert re.search(r"(numpy|torch)\.time_ratio", text)  # the pooled figures among the parent's metrics


def test_the_expanded_description_holds_a_row_per_job(shots):
    text = first_screen(shots, "parent-page")
    assert "Show less" in text and "torch · seed=1 #3" in text, text[:2000]


def test_the_assistant_is_closed_and_the_timing_trace_is_drawn(shots):
    for name in ("parent-page", "run-page", "run-timing-trace", "runs-table"):
        assert "Ask questions about your experiments" not in first_screen(shots, name), name
        assert (shots / f"{name}.png").stat().st_size > 20_000, name
    trace = first_screen(shots, "run-timing-trace")
    assert "trace" in trace and "time_sample_us" in trace and "Step" in trace, trace[:2000]  # a drawn line chart


def test_the_parent_page_links_how_to_read_it_and_the_link_opens_it(shots):
    """The words of the answer are explained one click from the first screen (issue 48)."""
    assert "how to read this" in first_screen(shots, "parent-page-as-opened")
    guide = first_screen(shots, "parent-how-to-read")
    assert "How to read this" in guide and "1 of 5 comparisons" in guide and "resolves" in guide, guide[:2000]
