#!/usr/bin/env python3
"""summary.md of scripts/gpu-check.sh: the GPU, the steps, each gpu test's outcome, the parity rows, the sweep.

    python3 scripts/gpu_check_summary.py --work SCRATCH --out OUTPUT_FOLDER [--limit SECONDS]

Reads what the script left: SCRATCH/nvidia-smi.csv, SCRATCH/steps.tsv, OUTPUT_FOLDER/pytest-gpu.xml and
pytest-gpu-alone.xml (pytest's --junitxml), SCRATCH/parity.md and parity-compiled.md (benchmarks/parity.py --out),
SCRATCH/sweep/ (the tracked sweep: summary.md and each job's result.json) and SCRATCH/sweep.out (its terminal
output). Whatever is missing is said to be missing; the summary is written anyway. The standard library only: it
runs before anything else is known to work.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

# Dense (no sparsity) bfloat16 tensor-core peaks from NVIDIA's data sheets, TFLOP/s; the first name that the
# GPU's name contains wins, so the more specific names come first.
BF16_PEAK_TFLOPS = (
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.4),  # SXM5 ("NVIDIA H100 80GB HBM3")
    ("H200 NVL", 835.0),
    ("H200", 989.4),  # SXM ("NVIDIA H200"); GH200's Hopper is the same chip
    ("A100", 312.0),
    ("L40S", 362.0),
    ("L4", 121.0),
)


def bf16_peak(gpu_name: str) -> float | None:
    return next((peak for name, peak in BF16_PEAK_TFLOPS if name in gpu_name), None)


def cell(text: object) -> str:
    """Text fit for one markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


# -- what the script left ---------------------------------------------------------------------------------------


def gpu_lines(work: Path) -> tuple[str, list[str]]:
    """(the first GPU's name, one line per GPU) from nvidia-smi's csv."""
    path = work / "nvidia-smi.csv"
    rows = [line.strip() for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    if not rows:
        return "", ["nvidia-smi said nothing (nvidia-smi.csv missing or empty)"]
    fields = ("name", "driver", "memory", "compute capability")
    lines = [", ".join(f"{k} {v.strip()}" for k, v in zip(fields, row.split(","), strict=False)) for row in rows]
    return rows[0].split(",")[0].strip(), lines


def steps(work: Path) -> list[list[str]]:
    """[name, exit status, seconds, limit] per step, as step() in gpu-check.sh wrote them."""
    path = work / "steps.tsv"
    return [line.split("\t") for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def tests(junit: Path) -> list[dict[str, str]]:
    """One dict per test case of pytest's junit xml: test, outcome (passed, failed, error, skipped), detail
    (the skip's reason, the failure's message), seconds."""
    if not junit.exists():
        return []
    found = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        if not case.get("name"):  # the empty case pytest writes for the test a KeyboardInterrupt stopped
            continue
        module = case.get("classname") or ""
        name = f"{module.rsplit('.', 1)[-1]}::{case.get('name')}" if module else str(case.get("name"))
        outcome, detail = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed"}.get(child.tag, child.tag)
                detail = child.get("message") or (child.text or "").strip()
                if child.tag == "skipped":
                    detail = re.sub(r"^Skipped: ", "", detail)
                break
        found.append({"test": name, "outcome": outcome, "detail": detail, "seconds": case.get("time", "")})
    return found


def not_finished(work: Path, cases: list[dict[str, str]]) -> list[str]:
    """The gpu tests pytest collected (collected.txt, `pytest --collect-only -q`) that neither junit xml reports:
    the one running when a step stopped at its limit and those after it. Names as tests() gives them."""
    path = work / "collected.txt"
    if not path.exists():
        return []
    reported = {c["test"].split("@")[0] for c in cases}  # --dist loadgroup appends @group to a name
    collected = [line.strip() for line in path.read_text().splitlines() if "::" in line]
    names = [f"{Path(i.split('::')[0]).stem}::{i.split('::', 1)[1]}" for i in collected]
    return [name for name in names if name not in reported]


def parity_rows(work: Path) -> tuple[list[str], list[str]]:
    """(the table's header lines, its rows) from parity.py's sections; rows start with '| backend |'."""
    header: list[str] = []
    rows: list[str] = []
    for name in ("parity.md", "parity-compiled.md"):
        path = work / name
        if not path.exists():
            continue
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.startswith("| backend | device |") and not header:
                header = lines[i : i + 2]
            elif line.startswith("| ") and " | cuda" in line:
                rows.append(line)
    return header, rows


def answer_line(work: Path) -> str:
    """The sweep's one-line answer: the bold line of its summary.md, else the line under the terminal table."""
    summary = work / "sweep" / "summary.md"
    if summary.exists():
        for line in summary.read_text().splitlines():
            if line.startswith("**") and line.rstrip().endswith("**"):
                return line.strip().strip("*")
    out = work / "sweep.out"
    lines = out.read_text().splitlines() if out.exists() else []
    for i, line in enumerate(lines):
        if line.startswith("└") and i + 1 < len(lines):
            return lines[i + 1].strip()
    return ""


def sweep_jobs(work: Path) -> list[dict]:
    jobs = []
    for path in sorted((work / "sweep").glob("*/result.json"), key=lambda p: int(p.parent.name)):
        try:
            jobs.append({"job": path.parent.name, **json.loads(path.read_text())})
        except (OSError, ValueError) as error:
            jobs.append({"job": path.parent.name, "status": f"unreadable result.json: {error}"})
    return jobs


def software(work: Path) -> list[str]:
    """torch's and CUDA's versions as the sweep's first job recorded them."""
    for saved in sweep_jobs(work):
        env = saved.get("environment") or {}
        if env.get("framework_version"):
            cuda = f", CUDA {env['cuda_version']}, cuDNN {env.get('cudnn_version')}" if env.get("cuda_version") else ""
            return [
                f"- {env.get('framework', 'torch')} {env['framework_version']}{cuda}; Python {env.get('python', '?')}"
            ]
    return []


# -- the summary --------------------------------------------------------------------------------------------------


def sweep_section(work: Path, gpu: str) -> list[str]:
    jobs = sweep_jobs(work)
    if not jobs:
        return ["No result.json in the sweep's folder: see gpu-check.log."]
    lines = [f"Answer line: **{cell(answer_line(work)) or '(none found)'}**", ""]
    lines += ["| job | dtype | status | median | TFLOP/s | max rel err | note |", "|---|---|---|---|---|---|---|"]
    peak = bf16_peak(gpu)
    said = []
    for saved in jobs:
        metrics, config = saved.get("metrics") or {}, saved.get("config") or {}
        dtype = config.get("dtype", "?")
        tflops = metrics.get("gflops_per_s", 0) / 1e3
        median = metrics.get("time_median_s")
        note = cell(saved.get("error", ""))[:200]
        if dtype == "bfloat16" and tflops:
            share = (
                f"{tflops:.0f} TFLOP/s, {100 * tflops / peak:.0f}% of the {peak:g} TFLOP/s dense bf16 peak"
                if peak
                else ""
            )
            note = share or f"{tflops:.0f} TFLOP/s; no peak known for {gpu or 'this GPU'}"
            said.append(f"bfloat16 matmul (n={(config.get('model') or {}).get('n', '?')}): {note}")
        lines.append(
            f"| {saved['job']} | {dtype} | {saved.get('status', '?')} | "
            f"{f'{median * 1e3:.3f} ms' if median else ''} | {f'{tflops:.1f}' if tflops else ''} | "
            f"{metrics.get('max_rel_err_vs_reference', '')} | {note} |"
        )
    return [*said, "", *lines] if said else lines


def write(work: Path, out: Path, limit: float) -> Path:
    gpu, gpus = gpu_lines(work)
    ran = steps(work)
    cases = [*tests(out / "pytest-gpu.xml"), *tests(out / "pytest-gpu-alone.xml")]
    stopped = any(s[0].startswith("pytest -m gpu") and s[1] == "124" for s in ran)
    if stopped:  # the interrupt pytest reports as an internal error is the step's limit, said below
        cases = [c for c in cases if c["test"] != "pytest::internal"]
    unfinished = not_finished(work, cases)
    cases += [{"test": name, "outcome": "not finished", "detail": "", "seconds": ""} for name in unfinished]
    counts = {k: sum(c["outcome"] == k for c in cases) for k in ("passed", "failed", "error", "skipped")}
    total = next((s for s in ran if s[0] == "total"), None)
    lines = [
        "# GPU check (scripts/gpu-check.sh)",
        "",
        f"{datetime.datetime.now().astimezone().isoformat(timespec='seconds')}; "
        + (f"{total[2]} s of the {limit:g} s limit" if total else "the script's total time was not recorded"),
        "",
        *(f"- GPU: {line}" for line in gpus),
        *software(work),
        "",
        "## Steps",
        "",
        "| step | exit | seconds | limit |",
        "|---|---|---|---|",
        *(
            f"| {cell(s[0])} | {s[1]}{' (stopped at its limit)' if s[1] == '124' else ''} | {s[2]} | {s[3]} |"
            for s in ran
            if s[0] != "total" and len(s) >= 4
        ),  # fmt: skip
        "",
        f"## pytest -m gpu: {counts['passed']} passed, {counts['failed']} failed, {counts['error']} errors, "
        f"{counts['skipped']} skipped" + (f", {len(unfinished)} not finished" if unfinished else ""),
        "",
    ]
    if stopped:
        lines += [
            "pytest was stopped at its limit: the tests it collected and did not report are listed as not finished."
            if (work / "collected.txt").exists()
            else "pytest was stopped at its limit: the test it was running and those after it are not listed.",
            "",
        ]
    if cases:
        lines += ["| test | outcome | reason or message | seconds |", "|---|---|---|---|"]
        order = {"failed": 0, "error": 1, "not finished": 2, "passed": 3, "skipped": 4}
        for case in sorted(cases, key=lambda c: order[c["outcome"]]):
            detail = cell(case["detail"])[:300]
            lines.append(f"| {cell(case['test'])} | {case['outcome']} | {detail} | {case['seconds']} |")
    else:
        lines.append("No pytest-gpu.xml: pytest did not write its report (see pytest-gpu.log).")
    header, rows = parity_rows(work)
    lines += ["", "## Parity rows (benchmarks/parity.py --device cuda)", ""]
    log = out / "gpu-check.log"
    failures = [line for line in log.read_text().splitlines() if "worker failed" in line] if log.exists() else []
    lines += [*header, *rows] if rows else ["No parity rows: see gpu-check.log."]
    lines += [f"- {cell(line)}" for line in failures]
    lines += ["", "## Tracked sweep (run.py -m ... model=matmul dtype=float32,bfloat16, MLflow in sweep.tar.gz)", ""]
    lines += sweep_section(work, gpu)
    path = out / "summary.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True, help="the script's scratch folder")
    parser.add_argument("--out", type=Path, required=True, help="the output folder (summary.md goes there)")
    parser.add_argument("--limit", type=float, default=470, help="the script's time limit, seconds")
    args = parser.parse_args(argv)
    path = write(args.work, args.out, args.limit)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
