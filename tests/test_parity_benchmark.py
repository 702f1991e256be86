"""benchmarks/parity.py runs and writes its rows (not a timed test: the ratios are not checked here)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

from runner.config import PROJECT_ROOT

SCRIPT = PROJECT_ROOT / "benchmarks" / "parity.py"


def load_parity():
    spec = importlib.util.spec_from_file_location("parity", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_parity(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT / "src")}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=300)


def test_parity_benchmark_writes_its_rows_and_keeps_the_rest(tmp_path):
    """One run into a file that holds a section of an earlier run: the rest kept, the section replaced."""
    parity = load_parity()
    out = tmp_path / "BENCHMARKS.md"
    out.write_text(f"# Benchmarks\n\n| row | measured |\n\n{parity.BEGIN}\n| an earlier run |\n{parity.END}\n\ntail\n")
    result = run_parity("--backends", "numpy", "--rows", "mlp_inference,matmul", "--budget", "0.05", "--out", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    text = out.read_text()
    assert text.startswith("# Benchmarks\n\n| row | measured |") and text.rstrip().endswith("tail")
    assert text.count(parity.BEGIN) == 1 and "an earlier run" not in text  # replaced, not appended
    section = text[text.index(parity.BEGIN) :]
    rows = [line for line in section.splitlines() if line.startswith("| numpy | cpu |")]
    assert [row.split(" | ")[2] for row in rows] == ["mlp_inference", "matmul"]
    assert all("**" in row and "target" in row for row in rows)


def test_bad_input_is_one_line_and_exit_2():
    result = run_parity("--backends", "mxnet")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == "error: not a backend, row or positive budget: mxnet"


def test_replace_section():
    parity = load_parity()
    new = f"{parity.BEGIN}\nnew\n{parity.END}"
    assert parity.replace_section("head\n", new) == f"head\n\n{new}\n"
    old = f"head\n{parity.BEGIN}\nold\n{parity.END}\ntail\n"
    assert parity.replace_section(old, new) == f"head\n{new}\ntail\n"
