"""Each job's MLflow run, once its sweep has ended, annotated with how it compares with the fastest job doing the
same work (runner.report's comparison): the ratio metrics and a line in its description."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from runner import tracking
from runner.config import first_line

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)


def note_comparisons(compared: pd.DataFrame) -> None:
    """Each job's MLflow run gains how it compares with the fastest job doing the same work: the metrics
    time_ratio, time_ratio_ci_low and time_ratio_ci_high (as the tables print them), and a line in its description."""
    from runner.record.table import ratio_figure

    for _, row in compared[compared["time_ratio"].notna()].iterrows():
        link = tracking.read_link(Path(row["run_dir"]))
        if not link.get("run_id"):
            continue
        metrics = {k: ratio_figure(row[k]) for k in ("time_ratio", "time_ratio_ci_low", "time_ratio_ci_high")}
        try:
            tracking.log_comparison(link["uri"], link["run_id"], metrics, comparison_line(row))
        except Exception as error:  # the record on disk is complete; the comparison is a nicety
            log.warning(f"could not annotate run {link['run_id']} ({first_line(error)})")


def comparison_line(row: pd.Series) -> str:
    """'1.31x the time of the fastest comparable job of the sweep (95% interval 1.27–1.35x over 40 rounds: slower)'."""
    from runner.record.table import format_interval, format_ratio
    from runner.report.comparison import Verdict

    verdict = row["verdict"]
    if verdict == Verdict.FASTEST or row["time_ratio"] == 1.0:  # an unstable fastest job too
        fastest = "the fastest comparable job of the sweep"
        return fastest if verdict == Verdict.FASTEST else f"{fastest} ({row['within_noise']})"
    line = f"{format_ratio(row['time_ratio'])} the time of the fastest comparable job of the sweep"
    if verdict in (Verdict.WITHIN_NOISE, Verdict.SLOWER):
        interval = format_interval((row["time_ratio_ci_low"], row["time_ratio_ci_high"]))
        return f"{line} (95% interval {interval} over {row['time_ratio_basis']}: {row['within_noise']})"
    return f"{line} ({row['within_noise']})"
