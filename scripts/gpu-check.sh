#!/usr/bin/env bash
# Every cuda path in one command, on a bare GPU machine (the lent H100/H200 of ../shared/gpu/README.md: Python 3.12
# and torch, no registry; hydra-core, mlflow ... travel as wheels in .whl/, brought by ../shared/gpu/fetch-wheels.sh).
# Its pytest is 9, under which pytest-xdist's --dist loadgroup groups nothing: bring pytest 8.4 too, once per .whl/:
#   python3 -m pip download --no-deps --only-binary=:all: -d .whl pytest==8.4.2
#
#   scripts/gpu-check.sh [--out DIR] [--only STEP,...] [--dry-run]
#
# In under 8 minutes (GPU_CHECK_LIMIT_S, default 470 s; each step has a timeout that also keeps to it):
#   1. installs the wheels of .whl/ (GPU_CHECK_WHEELS) into a temporary --target folder put first on PYTHONPATH
#      (pip --no-index --no-deps: no registry is asked);
#   2. one tracked sweep: run.py -m backend=torch device=cuda model=matmul model.n=8192 dtype=float32,bfloat16 into
#      a scratch MLflow store, kept as sweep.tar.gz (without its tensors.h5 files);
#   3. the cuda parity rows (benchmarks/parity.py --device cuda, torch, and JAX where it sees the GPU);
#   4. python3 -m pytest -m gpu, with --junitxml (each test's outcome, a skip's reason) and -rA: where pytest-xdist is
#      installed, in GPU_CHECK_WORKERS (default 5) workers sharing the GPU (JAX and TensorFlow told not to reserve
#      its memory), the tests of one module fixture in one worker (--dist loadgroup), the gpu_alone test (it fills
#      the GPU's memory) by itself at the very end; else one test after another (~10 minutes on an H100: not all fits);
#   5. the compiled parity rows (torch.compile: tens of seconds a row) and the generation rows, if time is left;
#   6. generation on the GPU, if time is left: Llama-3.2-1B's sizes (the largest preset), batch 1 and 8, bfloat16, torch
#      eager and compiled (CUDA graphs), and JAX jitted where JAX sees the GPU, written as generation.md
#      (benchmarks/generation_table.py: agreement with float64, time to first token, per token p50/p99, the decode
#      step's bandwidth against the GPU's peak);
#   7. writes summary.md (scripts/gpu_check_summary.py): the GPU's name and driver, each test's result (a test
#      collected and not reported, where a pytest step stopped at its limit: not finished), the
#      parity rows, the sweep's answer line and the bfloat16 matmul's TFLOP/s against the chip's peak.
# --only STEP,... runs those steps alone (e.g. --only compiled,generation: what a whole check leaves no time for).
# The output folder is $OUT when set (what a lent GPU machine sends back: 8 files at most, so it gets 7), else
# --out DIR, else outputs/gpu-check/. Without a GPU the script says so in one line and exits 0; --dry-run prints
# what it would install and run, and exits 0, on any machine. Exit status: 0 when every step exited 0, else 1.
# PYTHON (default python3) runs everything; NVIDIA_SMI (default nvidia-smi) is asked whether there is a GPU.
set -uo pipefail

CALLER=$PWD  # --out DIR and GPU_CHECK_WHEELS are relative to the folder the script is called from
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 1
PYTHON=${PYTHON:-python3}
NVIDIA_SMI=${NVIDIA_SMI:-nvidia-smi}
WHEELS=${GPU_CHECK_WHEELS:-$ROOT/.whl}
[[ $WHEELS = /* ]] || WHEELS=$CALLER/$WHEELS
LIMIT_S=${GPU_CHECK_LIMIT_S:-470}
RESERVE_S=20  # kept for the summary and the archive after the last step
SWEEP_S=75  # each step's own limit, within what is left of LIMIT_S
PARITY_S=90
PYTEST_S=240
PYTEST_ALONE_S=60
WORKERS=${GPU_CHECK_WORKERS:-5}
PARITY_COMPILED_S=60
GENERATION_S=240  # Llama-3.2-1B's sizes on an H200: 4 torch jobs set up in ~2.5 minutes (seeded weights, compiling)
GENERATION_JAX_S=120
PARITY_ROWS=matmul,mlp_inference,mlp_gradients_eager,mlp_jacobian,resnet18_inference_b8,transformer_inference,transformer_gradients,mlp_train_step_eager
# torch.compile: tens of seconds a row; GPT-2 generation: JAX compiles a prefill and a decode step
PARITY_COMPILED_ROWS=mlp_gradients_compiled,mlp_train_step_compiled,gpt2_generate_eager,gpt2_generate_compiled,llama_generate_eager_vs_hf

STEPS=sweep,parity,pytest,compiled,generation,alone  # --only's names, in the order they run
usage() { echo "usage: scripts/gpu-check.sh [--out DIR] [--only STEP,...] [--dry-run] (steps: $STEPS)"; }

dry_run=0 out_arg="" only=$STEPS
while (($#)); do
    case $1 in
    --dry-run) dry_run=1 ;;
    --out) [[ $# -ge 2 ]] || { echo "gpu-check: --out needs a folder" >&2; exit 2; }; out_arg=$2; shift ;;
    --out=*) out_arg=${1#--out=} ;;
    --only) [[ $# -ge 2 ]] || { echo "gpu-check: --only needs steps, of $STEPS" >&2; exit 2; }; only=$2; shift ;;
    --only=*) only=${1#--only=} ;;
    -h | --help) usage; exit 0 ;;
    *) echo "gpu-check: unknown argument $1 ($(usage))" >&2; exit 2 ;;
    esac
    shift
done
for name in ${only//,/ }; do
    [[ ,$STEPS, == *,$name,* ]] || { echo "gpu-check: no step '$name' (--only takes steps of $STEPS)" >&2; exit 2; }
done
wanted() { [[ ,$only, == *,$1,* ]]; }
OUT_DIR=${OUT:-${out_arg:-$ROOT/outputs/gpu-check}}
[[ $OUT_DIR = /* ]] || OUT_DIR=$CALLER/$OUT_DIR

shopt -s nullglob
WHEEL_FILES=("$WHEELS"/*.whl)
shopt -u nullglob

# The steps, as they run: the dry run prints these same commands. WORK (scratch: the sweep, its MLflow store, the
# parity files) and SITE (the installed wheels) are made when the check runs.
WORK=${TMPDIR:-/tmp}/gpu-check.XXXXXX
SITE=${TMPDIR:-/tmp}/gpu-check-site.XXXXXX
commands() {
    INSTALL=("$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$WHEELS"/*.whl)
    # -o addopts=: the workers and marks are this script's (pyproject.toml's addopts are the default set's)
    local pytest=("$PYTHON" -m pytest -q -rA -o addopts= -p no:cacheprovider --continue-on-collection-errors)
    if "$PYTHON" -c "import pytest_timeout" 2>/dev/null; then
        pytest+=(--timeout=240)  # one hung test cannot take the whole check
    fi
    if "$PYTHON" -c "import xdist" 2>/dev/null; then
        PYTEST=(env XLA_PYTHON_CLIENT_PREALLOCATE=false TF_FORCE_GPU_ALLOW_GROWTH=true "${pytest[@]}"
            -m "gpu and not gpu_alone" -n "$WORKERS" --dist loadgroup "--junitxml=$OUT_DIR/pytest-gpu.xml")
        PYTEST_ALONE=("${pytest[@]}" -m gpu_alone "--junitxml=$OUT_DIR/pytest-gpu-alone.xml")
    else
        PYTEST=("${pytest[@]}" -m gpu "--junitxml=$OUT_DIR/pytest-gpu.xml")
        PYTEST_ALONE=()
    fi
    SWEEP=("$PYTHON" run.py -m backend=torch device=cuda model=matmul task=inference model.n=8192 dtype=float32,bfloat16
        timing.max_time_s=1 "tracking.uri=sqlite:///$WORK/mlflow.db" tracking.experiment=gpu-check
        "hydra.sweep.dir=$WORK/sweep")
    PARITY=("$PYTHON" benchmarks/parity.py --device cuda --backends "$1" --rows "$PARITY_ROWS" --budget 0.3
        --out "$WORK/parity.md")
    PARITY_COMPILED=("$PYTHON" benchmarks/parity.py --device cuda --backends "$1" --rows "$PARITY_COMPILED_ROWS"
        --budget 0.3 --out "$WORK/parity-compiled.md")
    local generate=(task=generate device=cuda model=llama_32_1b dtype=bfloat16 batch_size=1,8
        timing.max_time_s=1 tracking=none)
    GENERATION=("$PYTHON" run.py -m backend=torch mode=eager,function "${generate[@]}" "hydra.sweep.dir=$WORK/generation")
    GENERATION_JAX=()
    [[ $1 == *jax* ]] && GENERATION_JAX=("$PYTHON" run.py -m backend=jax mode=function "${generate[@]}"
        "hydra.sweep.dir=$WORK/generation-jax")
    GENERATION_TABLE=("$PYTHON" benchmarks/generation_table.py "$WORK"/generation*)
    SUMMARY=("$PYTHON" scripts/gpu_check_summary.py --work "$WORK" --out "$OUT_DIR" --limit "$LIMIT_S")
}

if ((dry_run)); then
    commands "torch[,jax where JAX sees the GPU]"
    echo "gpu-check dry run: nothing is installed or run. On a machine with an NVIDIA GPU it would:"
    if ((${#WHEEL_FILES[@]})); then
        echo "install ${#WHEEL_FILES[@]} wheels from $WHEELS/ into a temporary folder put first on PYTHONPATH:"
        echo "  ${INSTALL[*]}"
        for wheel in "${WHEEL_FILES[@]}"; do echo "    ${wheel##*/}"; done
    else
        echo "install nothing: no wheels in $WHEELS/ (../shared/gpu/fetch-wheels.sh brings them); $PYTHON's own packages are used"
    fi
    echo "run, within ${LIMIT_S} s in all (each step stopped at its limit or at what is left, whichever comes first):"
    wanted sweep && echo "  [${SWEEP_S} s] ${SWEEP[*]}"
    wanted parity && echo "  [${PARITY_S} s] ${PARITY[*]}"
    wanted pytest && echo "  [${PYTEST_S} s] ${PYTEST[*]}"
    wanted compiled && echo "  [${PARITY_COMPILED_S} s] ${PARITY_COMPILED[*]}"
    if wanted generation; then
        echo "  [${GENERATION_S} s] ${GENERATION[*]}"
        ((${#GENERATION_JAX[@]})) && echo "  [${GENERATION_JAX_S} s] ${GENERATION_JAX[*]}"
        echo "  ${GENERATION_TABLE[*]} > $OUT_DIR/generation.md"
    fi
    wanted alone && ((${#PYTEST_ALONE[@]})) && echo "  [${PYTEST_ALONE_S} s] ${PYTEST_ALONE[*]}"
    echo "  ${SUMMARY[*]}"
    echo "write $OUT_DIR/summary.md (with pytest-gpu.xml, pytest-gpu.log, gpu-check.log, generation.md and sweep.tar.gz beside it)"
    exit 0
fi

# -- no GPU: one line, exit 0 ------------------------------------------------------------------------------------
if ! command -v "$NVIDIA_SMI" >/dev/null 2>&1; then
    echo "gpu-check: no GPU here (no $NVIDIA_SMI): nothing to check"
    exit 0
fi
if ! gpus=$("$NVIDIA_SMI" -L 2>/dev/null) || [[ -z $gpus ]]; then
    echo "gpu-check: no GPU here ($NVIDIA_SMI -L lists none): nothing to check"
    exit 0
fi
if ! "$PYTHON" -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
    echo "gpu-check: no GPU here for torch ($PYTHON: torch missing or torch.cuda.is_available() is False): nothing to check"
    exit 0
fi

START=$(date +%s)
mkdir -p "$OUT_DIR" || exit 1
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX") && SITE=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check-site.XXXXXX") || exit 1
LOG=$OUT_DIR/gpu-check.log
rm -f "$OUT_DIR/summary.md" "$OUT_DIR/generation.md" "$OUT_DIR"/pytest-gpu*.xml "$OUT_DIR/pytest-gpu.log" "$OUT_DIR/sweep.tar.gz"
: >"$LOG"
: >"$WORK/steps.tsv"
say() { echo "gpu-check: $*" | tee -a "$LOG"; }

left() { echo $((START + LIMIT_S - RESERVE_S - $(date +%s))); }

# step NAME LIMIT_S LOGFILE COMMAND...: run it within min(LIMIT_S, what is left), SIGINT at the limit (pytest
# then still writes its report), SIGKILL 15 s later; one line in steps.tsv: name, exit status, seconds, limit.
step() {
    local name=$1 limit=$2 log=$3 t0 rc
    shift 3
    local budget
    budget=$(left)
    ((budget < limit)) && limit=$budget
    if ((limit < 10)); then
        say "$name: skipped, out of time"
        printf '%s\tskipped\t0\t0\n' "$name" >>"$WORK/steps.tsv"
        return 1
    fi
    say "$name (at most ${limit} s)"
    echo "  $*" >>"$LOG"
    t0=$(date +%s)
    timeout -s INT -k 15 "$limit" "$@" >>"$log" 2>&1
    rc=$?
    printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$(($(date +%s) - t0))" "$limit" >>"$WORK/steps.tsv"
    say "$name: exit $rc after $(($(date +%s) - t0)) s$( ((rc == 124)) && echo " (stopped at its limit)")"
    return "$rc"
}

say "$(echo "$gpus" | head -1); output in $OUT_DIR, scratch in $WORK"
"$NVIDIA_SMI" --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader >"$WORK/nvidia-smi.csv" 2>>"$LOG" ||
    "$NVIDIA_SMI" --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$WORK/nvidia-smi.csv" 2>>"$LOG"
"$NVIDIA_SMI" >>"$LOG" 2>&1

failed=0
commands torch
if ((${#WHEEL_FILES[@]})); then
    step "install ${#WHEEL_FILES[@]} wheels" 120 "$LOG" "${INSTALL[@]}" || failed=1
else
    say "no wheels in $WHEELS/ (../shared/gpu/fetch-wheels.sh brings them): $PYTHON's own packages are used"
fi
export PYTHONPATH=$SITE:$ROOT/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 MPLBACKEND=Agg
say "$("$PYTHON" -c 'import sys, torch; print("Python", sys.version.split()[0], "torch", torch.__version__)' 2>&1)"
# pytest 9 ignores the group pytest-xdist 3.8 appends to a node id, so --dist loadgroup would build each module
# fixture in several workers: bring pytest 8.4's wheel in .whl/ where the machine's pytest is 9
if ! "$PYTHON" -c "import sys, pytest; sys.exit(int(pytest.__version__.split('.')[0]) >= 9)" 2>/dev/null; then
    say "pytest $("$PYTHON" -c 'import pytest; print(pytest.__version__)' 2>&1) here: --dist loadgroup does not group (bring pytest 8.4's wheel in $WHEELS/)"
fi
if timeout 120 "$PYTHON" -c "import jax; assert jax.devices('gpu')" >/dev/null 2>&1; then
    commands torch,jax
    say "JAX sees the GPU: its parity rows run too"
else
    say "JAX does not see the GPU here: torch's parity rows only"
fi

if wanted sweep; then
    step "tracked sweep" "$SWEEP_S" "$WORK/sweep.out" "${SWEEP[@]}" || failed=1
    cat "$WORK/sweep.out" >>"$LOG" 2>/dev/null
fi
if wanted parity; then
    step "parity rows" "$PARITY_S" "$LOG" "${PARITY[@]}" || failed=1
fi
if wanted pytest; then
    # what the summary lists as not finished where a pytest step stops at its limit (a few seconds)
    timeout 60 "$PYTHON" -m pytest --collect-only -q -o addopts= -p no:cacheprovider -m gpu >"$WORK/collected.txt" 2>>"$LOG"
    step "pytest -m gpu" "$PYTEST_S" "$OUT_DIR/pytest-gpu.log" "${PYTEST[@]}" || failed=1
fi
if wanted compiled; then
    step "parity rows, compiled" "$PARITY_COMPILED_S" "$LOG" "${PARITY_COMPILED[@]}" || failed=1
fi
if wanted generation; then
    step "generation, torch" "$GENERATION_S" "$WORK/generation.out" "${GENERATION[@]}" || failed=1
    if ((${#GENERATION_JAX[@]})); then
        step "generation, jax" "$GENERATION_JAX_S" "$WORK/generation.out" "${GENERATION_JAX[@]}" || failed=1
    fi
    cat "$WORK/generation.out" >>"$LOG" 2>/dev/null
    "${GENERATION_TABLE[@]}" >"$OUT_DIR/generation.md" 2>>"$LOG" || say "no generation table (see $LOG)"
fi
# last: it fills the GPU's memory, and tells least
if wanted alone && ((${#PYTEST_ALONE[@]})); then
    step "pytest -m gpu_alone" "$PYTEST_ALONE_S" "$OUT_DIR/pytest-gpu.log" "${PYTEST_ALONE[@]}" || failed=1
fi

archive=()
for part in sweep mlflow.db mlartifacts sweep.out; do [[ -e $WORK/$part ]] && archive+=("$part"); done
if ((${#archive[@]})); then
    tar -czf "$OUT_DIR/sweep.tar.gz" --exclude=tensors.h5 -C "$WORK" "${archive[@]}" 2>>"$LOG" || failed=1
fi
printf 'total\t%s\t%s\t%s\n' "$failed" "$(($(date +%s) - START))" "$LIMIT_S" >>"$WORK/steps.tsv"
if "${SUMMARY[@]}" 2>>"$LOG"; then
    say "summary: $OUT_DIR/summary.md ($(($(date +%s) - START)) s in all)"
else
    say "the summary could not be written (see $LOG)"
    failed=1
fi
exit "$failed"
