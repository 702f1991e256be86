#!/usr/bin/env bash
# Screenshots of the MLflow UI over a store, as a person sees it: the runs table, a run's page, its
# metric charts (time_sample_s: the timing trace), a sweep parent's page and artifacts. Needs chromium (apt-get install -y chromium).
#   scripts/screenshot-mlflow-ui.sh /path/to/mlflow.db OUT_DIR [EXPERIMENT] [PORT]
# The UI listens on 127.0.0.1 only and is stopped at the end.
set -euo pipefail
DB=$(realpath "$1"); OUT=$(mkdir -p "$2" && realpath "$2"); EXPERIMENT=${3:-tensor-runner}; PORT=${4:-5055}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
URI="sqlite:///$DB"
"$ROOT/.venv/bin/mlflow" ui --backend-store-uri "$URI" --host 127.0.0.1 --port "$PORT" >"$OUT/mlflow-ui.log" 2>&1 &
UI=$!
trap 'kill "$UI" 2>/dev/null; wait "$UI" 2>/dev/null || true' EXIT
for _ in $(seq 120); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 1; done

# The ids to open: the experiment, its newest finished child run, its newest sweep parent.
read -r EXP RUN PARENT < <("$ROOT/.venv/bin/python" - "$URI" "$EXPERIMENT" <<'PY'
import sys
from mlflow.tracking import MlflowClient
client = MlflowClient(sys.argv[1])
exp = client.get_experiment_by_name(sys.argv[2])
runs = client.search_runs([exp.experiment_id], order_by=["attributes.start_time DESC"])
finished = [r for r in runs if "sweep_dir" not in r.data.tags and r.info.status == "FINISHED"]
child = max(finished, key=lambda r: r.data.metrics.get("n_samples", 0))  # the longest timing trace
parent = next((r for r in runs if "sweep_dir" in r.data.tags), child)
print(exp.experiment_id, child.info.run_id, parent.info.run_id)
PY
)
BASE="http://127.0.0.1:$PORT/#/experiments/$EXP"
ML="workflowType=machine_learning"  # the UI's GenAI / Model training switch, top left
shoot() {  # name url [height]
  chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1600,"${3:-1000}" \
    --virtual-time-budget=40000 --screenshot="$OUT/$1.png" "$2" >/dev/null 2>&1
  echo "$OUT/$1.png  <- $2"
}
shoot runs-table "$BASE/runs?$ML"
shoot run-page "$BASE/runs/$RUN?$ML" 1500
shoot run-timing-trace "$BASE/runs/$RUN/model-metrics?$ML" 1600
shoot parent-artifacts "$BASE/runs/$PARENT/artifacts?$ML" 1000
shoot parent-page "$BASE/runs/$PARENT?$ML" 1500
