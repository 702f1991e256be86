#!/usr/bin/env python
"""tensor-runner entry point.

python run.py [overrides]          one run, e.g. backend=torch model=mlp task=gradients
python run.py -m [sweeps]          a sweep, e.g. backend=torch,tensorflow mode=eager,function
python run.py +experiment=NAME     a ready-made experiment from experiments/
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

sys.path.insert(0, str(Path(__file__).resolve().parent / "src"))  # works before `pip install -e .` too

from runner import preflight  # noqa: E402  (registers the structured configs and resolvers)
from runner.job import execute, print_summary  # noqa: E402


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> str:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    outcome = execute(cfg, run_dir)
    print_summary(cfg, run_dir, outcome)
    if outcome.status != "FINISHED" and HydraConfig.get().mode.name == "RUN":
        raise SystemExit(1)
    return outcome.status


if __name__ == "__main__":
    preflight.main()
    main()
