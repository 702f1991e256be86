"""A control case in a sweep (`control=NAME`, conf/control/NAME.yaml): one more job, timed in the same interleaved
rounds as the sweep's, whose own work never changes, so that a history can divide each run by the control of its
sweep and drift of the whole machine (a VM 8-17% faster for whole sweeps) cancels. The sweep's jobs record which
case their control is (sweep.json `control`: runner.record.sweep_file; MLflow tag `control_case`);
runner.history.build finds the control's run beside each of theirs."""

from __future__ import annotations

from collections.abc import Sequence

from omegaconf import DictConfig


def job_overrides(sweep_config: DictConfig, first_job: Sequence[str]) -> list[str] | None:
    """The control job's overrides, or None where the sweep names no control: the first job's, less every key the
    control sets (and what lies under it: a control's model=matmul drops model.hidden), then the control's own."""
    control = sweep_config.get("control")
    if not control:
        return None
    own = [str(o) for o in control.overrides]
    keys = {_key(o) for o in own} | {"control"}  # without control=NAME its own config names none
    kept = [o for o in first_job if not any(_key(o) == k or _key(o).startswith(f"{k}.") for k in keys)]
    return [*kept, *own]


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")
