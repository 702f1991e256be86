"""An optimizing sweeper, as Optuna's or Nevergrad's are to Hydra: it launches the grid in batches, reads each
job's return value (the runner's median seconds per call) and keeps the fastest. It writes every value it got
to `hydra.sweeper.out` (one JSON line per job), so a test sees what a sweeper sees."""

import itertools
import json
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper


@dataclass
class FastestSweeperConf:
    _target_: str = "hydra_plugins.fastest_sweeper.FastestSweeper"
    out: str = "sweeper.jsonl"
    batch_size: int = 2
    params: dict[str, str] = field(default_factory=dict)


ConfigStore.instance().store(group="hydra/sweeper", name="fastest_schema", node=FastestSweeperConf)


class FastestSweeper(Sweeper):
    def __init__(self, out: str, batch_size: int, params: dict[str, str]) -> None:
        self.out, self.batch_size, self.params = out, batch_size, params

    def setup(self, *, hydra_context, task_function, config) -> None:
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: list[str]) -> Any:
        parsed = OverridesParser.create().parse_overrides([*arguments, *(f"{k}={v}" for k, v in self.params.items())])
        choices = [
            [f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()] for o in parsed if o.is_sweep_override()
        ]
        fixed = [f"{o.get_key_element()}={o.get_value_element_as_str()}" for o in parsed if not o.is_sweep_override()]
        grid = [[*fixed, *combo] for combo in itertools.product(*choices)]
        best = None
        for start in range(0, len(grid), self.batch_size):
            batch = grid[start : start + self.batch_size]
            for overrides, ret in zip(batch, self.launcher.launch(batch, initial_job_idx=start), strict=True):
                value = ret.return_value
                with open(self.out, "a") as out:
                    out.write(json.dumps({"overrides": overrides, "value": value}) + "\n")
                if best is None or value < best[1]:
                    best = (overrides, value)
        return best
