#!/usr/bin/env bash
# Screenshots of the MLflow UI over a store, as a person sees it: a sweep parent's page (as it opens, and its
# description expanded), a child run's page, its timing trace (the trace/time_sample_us chart), the runs list with
# the runner's columns, the parent's artifacts and its how-to-read.md (the description's link); MLflow's assistant
# panel closed, charts loaded (scripts/screenshot_mlflow_ui.py drives headless Chromium). Needs chromium
# (apt-get install -y chromium).
#   scripts/screenshot-mlflow-ui.sh [--parent RUN_ID] /path/to/mlflow.db OUT_DIR [EXPERIMENT] [PORT]
# The parent shot is RUN_ID (a sweep's parent run, in whatever experiment), else EXPERIMENT's newest sweep.
# Each picture NAME.png comes with NAME.txt, the text its first screen shows (not what a collapsed box hides).
# The UI listens on 127.0.0.1 only and is stopped at the end.
set -euo pipefail
PARENT_ID=""
if [ "${1:-}" = "--parent" ]; then PARENT_ID=$2; shift 2; fi
DB=$(realpath "$1"); OUT=$(mkdir -p "$2" && realpath "$2"); EXPERIMENT=${3:-tensor-runner}; PORT=${4:-5055}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
URI="sqlite:///$DB"
"$ROOT/.venv/bin/mlflow" ui --backend-store-uri "$URI" --host 127.0.0.1 --port "$PORT" >"$OUT/mlflow-ui.log" 2>&1 &
UI=$!
trap 'kill "$UI" 2>/dev/null; wait "$UI" 2>/dev/null || true' EXIT
for _ in $(seq 120); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 1; done

# The ids to open: the experiment, the sweep parent (given, or the newest) and its finished child with the longest
# trace.
read -r EXP RUN PARENT < <("$ROOT/.venv/bin/python" - "$URI" "$EXPERIMENT" "$PARENT_ID" <<'PY'
import sys
from mlflow.tracking import MlflowClient
client = MlflowClient(sys.argv[1])
if sys.argv[3]:
    parent = client.get_run(sys.argv[3])
    experiment_id = parent.info.experiment_id
else:
    experiment_id = client.get_experiment_by_name(sys.argv[2]).experiment_id
runs = client.search_runs([experiment_id], order_by=["attributes.start_time DESC"])
if not sys.argv[3]:
    parent = next((r for r in runs if "sweep_dir" in r.data.tags), None)
children = [r for r in runs if "sweep_dir" not in r.data.tags and r.info.status == "FINISHED"]
if parent is not None:
    children = [r for r in children if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id] or children
child = max(children, key=lambda r: r.data.metrics.get("n_samples", 0))  # the longest timing trace
print(experiment_id, child.info.run_id, (parent or child).info.run_id)
PY
)
BASE="http://127.0.0.1:$PORT/#/experiments/$EXP"
ML="workflowType=machine_learning"  # the UI's GenAI / Model training switch, top left
# The expanded parent page is 2000 px tall: its description (sentence, table, chart, warnings, command, a row per
# job) is whole on its first screen.
"$ROOT/.venv/bin/python" "$ROOT/scripts/screenshot_mlflow_ui.py" "$OUT" \
  "parent-page-as-opened=$BASE/runs/$PARENT?$ML@1000" \
  "parent-page=$BASE/runs/$PARENT?$ML@2000" \
  "run-page=$BASE/runs/$RUN?$ML@1500" \
  "run-timing-trace=$BASE/runs/$RUN/model-metrics?$ML@1200" \
  "runs-table=$BASE/runs?$ML&viewStateShareKey=tensor-runner@1000" \
  "parent-artifacts=$BASE/runs/$PARENT/artifacts?$ML@1000" \
  "parent-how-to-read=$BASE/runs/$PARENT/artifacts/how-to-read.md?$ML@1000"
