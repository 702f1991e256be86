"""tests/plugin/chain_model.py, the workload of benchmarks/history_real.py: its work grows with
RUNNER_TEST_EXTRA_WORK, its arguments (and so its config and case) unchanged."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from runner.backends import numpy_backend

PLUGIN = Path(__file__).parent / "plugin"


def test_the_extra_work_adds_layers_unseen_by_the_config(monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGIN))
    from chain_model import ChainModel

    monkeypatch.delenv("RUNNER_TEST_EXTRA_WORK", raising=False)
    plain = ChainModel(features=4, layers=10)
    monkeypatch.setenv("RUNNER_TEST_EXTRA_WORK", "0.1")
    more = ChainModel(features=4, layers=10)
    assert (plain.layers, more.layers) == (10, 11)
    rng = np.random.default_rng(0)
    params, x = plain.init_params(rng), plain.make_inputs(rng, 3)["x"]
    assert more.forward(numpy_backend, params, x).shape == (3, 4)
