#!/usr/bin/env python
"""tensor-runner entry point (the repository's; an installed wheel's is the `tensor-runner` command).

python run.py [overrides]          one run, e.g. backend=torch model=mlp task=gradients
python run.py -m [sweeps]          a sweep, e.g. backend=torch,tensorflow mode=eager,function
python run.py +experiment=NAME     a ready-made experiment from experiments/
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "src"))  # works before `pip install -e .` too

from runner.app import cli  # noqa: E402  (the Hydra app: runner.app)

if __name__ == "__main__":
    cli(config_path=str(ROOT / "conf"))
