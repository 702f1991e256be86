"""A Hydra callback that writes down what each job's task returned: what Hydra's callbacks and sweepers see."""

from __future__ import annotations

import json
from typing import Any

from hydra.experimental.callback import Callback


class ReturnProbe(Callback):
    def __init__(self, path: str):
        self.path = path

    def on_job_end(self, config: Any, job_return: Any, **kwargs: Any) -> None:
        with open(self.path, "a") as out:
            out.write(json.dumps({"job": int(config.hydra.job.num), "value": job_return.return_value}) + "\n")
