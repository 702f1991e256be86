"""A workload whose work a package of the job's Python environment sets, as a library's release does: the chain of
chain_model.py with `plantpkg.EXTRA_WORK` more layers (0.05: 5% more), read in the worker. Tests and
benchmarks/versions.py write plantpkg's wheels at the versions they need (tests/wheel_maker.py)."""

from __future__ import annotations

import importlib
from pathlib import Path

from chain_model import ChainModel

import runner


class PlantModel(ChainModel):
    name = "plant"

    def __init__(self, features: int = 64, layers: int = 100):
        super().__init__(features, layers)
        planted = importlib.import_module("plantpkg")  # the environment's release: imported where the job runs
        self.layers = max(1, round(layers * (1 + planted.EXTRA_WORK)))
        self.release = planted.VERSION

    def describe(self, ops, params: dict, inputs: dict, backward: bool) -> dict[str, str]:
        """The release the worker imported, the layers it ran and the runner's source it imported: what a test checks
        the environment by."""
        source = str(Path(runner.__file__).resolve().parents[1])
        return {"plant_release": self.release, "plant_layers": str(self.layers), "plant_runner_source": source}
