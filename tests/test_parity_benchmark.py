"""benchmarks/parity.py runs and writes its rows (not a timed test: the ratios are not checked here)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

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


def test_a_failed_row_is_named_the_others_kept_and_the_exit_is_1(tmp_path, monkeypatch, capsys):
    """The worker goes on past a row that raises (out of memory on a GPU, say); its measured rows are written
    and the run exits 1, saying in one line which row failed."""
    parity = load_parity()
    measure_row = parity.measure_row

    def failing_matmul(backend, device, row, *args):
        if row == "matmul":
            raise RuntimeError("CUDA out of memory. Tried to allocate ...\nthe rest of torch's message")
        return measure_row(backend, device, row, *args)

    def run_backend(backend, args):  # the worker in this process, read as from its pipe
        code = parity.worker(backend, args.device, args.rows, args.budget)
        said = capsys.readouterr()
        return parity.read_worker(backend, said.out, code, said.err)

    monkeypatch.setattr(parity, "measure_row", failing_matmul)
    monkeypatch.setattr(parity, "run_backend", run_backend)
    out = tmp_path / "BENCHMARKS.md"
    argv = ["--backends", "numpy", "--rows", "matmul,mlp_inference", "--budget", "0.05", "--out", str(out)]
    assert parity.main(argv) == 1
    rows = [line for line in out.read_text().splitlines() if line.startswith("| numpy | cpu |")]
    assert [row.split(" | ")[2] for row in rows] == ["mlp_inference"]
    failed = "parity: numpy matmul (a @ a) failed: RuntimeError: CUDA out of memory. Tried to allocate ..."
    assert capsys.readouterr().err.splitlines() == [failed]


def test_a_worker_that_dies_is_named_with_the_row_it_was_in():
    parity = load_parity()
    at = 'AT {"row": "matmul", "idiom": "a @ a"}'
    assert parity.read_worker("jax", at, -11, "") == (
        [],
        ["the jax worker exited with code -11 in row matmul (a @ a): no output"],
    )
    _, failures = parity.read_worker("torch", "", 1, "Traceback ...\nRuntimeError: Found no NVIDIA driver")
    assert failures == [
        "the torch worker exited with code 1 before its first row: RuntimeError: Found no NVIDIA driver"
    ]


def test_a_worker_that_fails_makes_the_run_exit_1():
    """torch on cuda where there is none: the worker fails before its first row, and the run says so."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("torch sees a GPU here: its cuda worker would not fail")
    result = run_parity("--backends", "torch", "--device", "cuda", "--rows", "matmul", "--budget", "0.05", "--out", "-")
    assert result.returncode == 1
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith("parity: the torch worker exited with code 1 before its first row: ")
    )


@pytest.mark.heavy  # a torch worker importing transformers and generating a few dozen times (~30 s on 2 cores)
def test_the_llama_row_times_transformers_generate_on_the_same_tokens():
    """The row against transformers' generate() with a static cache: measured only where both sides' tokens are equal
    (parity asserts it before timing, and a row that fails exits 1)."""
    result = run_parity("--backends", "torch", "--rows", "llama_generate_eager_vs_hf", "--budget", "0.05", "--out", "-")
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [
        line for line in result.stdout.splitlines() if line.startswith("| torch | cpu | llama_generate_eager_vs_hf")
    ]
    assert rows and 'generate(cache_implementation="static")' in rows[0] and "**" in rows[0]
