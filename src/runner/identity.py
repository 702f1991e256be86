"""What makes two runs "the same": decided here and nowhere else.

A run has four identities, each a short key (a hash) with a name a person reads:

- its work: what two runs must share to be compared at all: the model and task, the batch size, and the numeric
  settings of the model and its inputs (model.n, data.image_size). Everything else (backend, mode, device, dtype,
  named alternatives such as model.arch) is what a comparison is for.
- its configuration: every setting that applies to it, the draw of weights and inputs (REPLICATE) set aside. Runs
  of one configuration are replicates: other seeds, other worker processes, other nodes of one kind of machine.
- its case: its configuration with how it was measured (MEASUREMENT: the timing budget, the isolation) set aside
  too: the series of a history (runner history).
- its machine: the kind of machine, not its name (machine below). The host is recorded beside it (result.json's
  `host`, MLflow's env.hostname), never inside it: a SLURM sweep's nodes, a CI runner pool, a team's machines of
  one kind are one machine, and a reboot or a driver's patch release leaves a machine what it was.

Where a run was logged (tracking.*) and the runner's own capability data are no settings at all (config_params).
Keys are computed once, when a run is recorded (result.json's `identity`, MLflow tags `work`, `configuration`,
`case`, `machine` and their `*_name`), and again from the record only where an older one lacks them.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import asdict, dataclass

from runner.config import is_capability

REPLICATE = ("seed",)  # which draw of weights and inputs: runs that differ only here are replicates
MEASUREMENT = ("timing.", "isolation")  # how long, and in which process, it was timed: not what ran
WORK_KEYS = ("model.name", "task.name", "batch_size")  # besides the numeric settings of these prefixes:
SETTING_PREFIXES = ("model.", "data.")  # model.n, model.size, data.image_size, ...

# The machine's kind: environment key -> how a person reads it. What sets a machine's speed and lasts: not the host
# (runner.record.environment records it as `hostname`), not a reading that moves between boots (clock, free memory).
MACHINE = {
    "cpu": "",  # the CPU model, as /proc/cpuinfo names it
    "cpu_count": "cores",
    "memory_gib": "GiB",  # total memory in whole GiB: the kernel's total moves by megabytes between boots
    "gpus": "",  # '8x NVIDIA H100 80GB HBM3': the GPU model and count
    "gpu_driver_branch": "driver",  # NVIDIA's driver branch ('550' of 550.54.15), see gpu_driver_branch
    "speed_variables": "",  # thread counts and kernel choices set in the environment (SPEED_VARIABLES)
}
SPEED_VARIABLES = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "TF_NUM_INTRAOP_THREADS",
    "OPENBLAS_CORETYPE",  # which kernels OpenBLAS runs: set on some processors, and a current numpy runs slower
    "OPENBLAS_L2_SIZE",
)


@dataclass(frozen=True)
class Key:
    key: str  # 16 hex digits
    name: str  # as a person reads it


@dataclass(frozen=True)
class Identity:
    work: Key
    configuration: Key
    case: Key
    machine: Key
    host: str = ""  # where it ran, recorded beside the machine (runner history --by-host)

    def to_dict(self) -> dict[str, dict[str, str] | str]:
        return asdict(self)

    @classmethod
    def from_dict(cls, record: Mapping) -> Identity:
        keys = {k: Key(**record[k]) for k in ("work", "configuration", "case", "machine")}
        return cls(**keys, host=str(record.get("host", "")))

    def tags(self) -> dict[str, str]:
        """As MLflow tags: `work`, `work_name`, ..., `machine`, `machine_name` (the host is env.hostname's already)."""
        tags = {}
        for name in ("work", "configuration", "case", "machine"):
            key: Key = getattr(self, name)
            tags[name], tags[f"{name}_name"] = key.key, key.name
        return tags

    @classmethod
    def from_tags(cls, tags: Mapping[str, str]) -> Identity | None:
        """From a run's MLflow tags (no prefix); None where it was recorded before the tags existed."""
        names = ("work", "configuration", "case", "machine")
        if not all(tags.get(n) for n in names):
            return None
        keys = {n: Key(str(tags[n]), str(tags.get(f"{n}_name", ""))) for n in names}
        return cls(**keys, host=str(tags.get("env.hostname", "")))


def several_hosts(hosts: Iterable[object]) -> bool:
    """Whether runs ran on more than one host (a cluster's nodes, a CI runner pool, a team's machines of one kind):
    where a table of them shows each run's host. A host not known ('', None, NaN) is no host of its own."""
    return len({h for h in hosts if isinstance(h, str) and h}) > 1


def of_config(config: dict, copied: Collection[str], environment: Mapping[str, object], run_name: str = "") -> Identity:
    """A run's identity from its resolved config and the keys that copy another (a JobSpec's config and
    copied_keys, a Result's), and its recorded environment."""
    return of(config_params(config, copied), environment, run_name)


def of(params: Mapping[str, object], environment: Mapping[str, object], run_name: str = "") -> Identity:
    """A run's identity from its params (config_params: flattened keys, the values as the config writes them) and
    its recorded environment; `run_name` opens its case's name ('numpy-mlp-gradients-eager-cpu-float32')."""
    return Identity(
        work=work(params),
        configuration=configuration(params, run_name),
        case=case(params, run_name),
        machine=machine(environment),
        host=str(environment.get("hostname", "")),
    )


def work(params: Mapping[str, object]) -> Key:
    """What two runs must share to be compared (see the module's docstring)."""
    parts = []
    for key in sorted(params):
        value = params[key]
        if is_work_setting(key, value):
            parts.append(f"{key}={float(str(value)):g}" if is_number(value) else f"{key}={value}")
    return _key(" ".join(parts))


def configuration(params: Mapping[str, object], run_name: str = "") -> Key:
    """Every setting, the seed aside: runs that share it are replicates. Its name is its case's (what differs from
    its case, the timing budget, is in the params beside it: a name of every setting would fill a page)."""
    return Key(_hash(_text(params, REPLICATE)), case(params, run_name).name)


def case(params: Mapping[str, object], run_name: str = "") -> Key:
    """Every setting, the seed and how it was measured aside: one series of a history. Its name is the run's name
    and the settings the name does not say (batch_size=64, threads=1, n=128)."""
    kept = _kept(params, (*REPLICATE, *MEASUREMENT))
    said = [f"{k.removeprefix('model.')}={kept[k]}" for k in sorted(kept) if k in BEYOND_NAME and kept[k] != "None"]
    return Key(_hash(" ".join(f"{k}={kept[k]}" for k in sorted(kept))), " ".join([run_name, *said]).strip())


# what a run's name does not say: model.method (the reshape and conversion workloads' alternatives) as model.arch
BEYOND_NAME = ("batch_size", "threads", "model.n", "model.size", "model.arch", "model.method")


def _kept(params: Mapping[str, object], aside: tuple[str, ...]) -> dict[str, str]:
    return {k: str(v) for k, v in params.items() if not under(k, aside)}


def _text(params: Mapping[str, object], aside: tuple[str, ...]) -> str:
    kept = _kept(params, aside)
    return " ".join(f"{k}={kept[k]}" for k in sorted(kept))


def _key(text: str) -> Key:
    return Key(_hash(text), text)


def _hash(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def is_work_setting(key: str, value: object) -> bool:
    """Whether a flattened config key (no 'params.' prefix) with this value is part of the same-work key."""
    if key in WORK_KEYS:
        return True
    return key.startswith(SETTING_PREFIXES) and is_number(value)


def is_number(value: object) -> bool:
    """A number, or a number as MLflow hands params back ("1024"); booleans are not numbers here."""
    if isinstance(value, bool) or value is None:
        return False
    if isinstance(value, int | float):
        return not (isinstance(value, float) and math.isnan(value))
    if type(value).__module__ == "numpy":  # numpy scalars, without importing numpy here
        return is_number(value.item())  # type: ignore[attr-defined]
    try:
        float(str(value))
    except ValueError:
        return False
    return str(value).strip().lower() not in ("nan", "inf", "-inf", "true", "false")


# -- the settings that apply ------------------------------------------------------------------------


def flatten(config: dict, prefix: str = "") -> dict[str, str]:
    """{"a": {"b": 1}} -> {"a.b": "1"}: MLflow params are flat strings."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = str(value)
    return flat


def config_params(config: dict, copied: Collection[str]) -> dict[str, str]:
    """The flattened config keys that apply to the run's model, data and mode, as the config holds them: what its
    identity is computed from (runner.record.naming.run_params says them in words for MLflow).

    Left out: capability data (runner.config), where the run was logged (tracking.*), data settings the
    chosen data or model does not read, and the keys that copy another (`copied`, as Result.copied_keys
    records them: model.image_size = ${data.image_size})."""
    return {k: v for k, v in flatten(config).items() if applies(k, config) and not under(k, copied)}


def applies(key: str, config: dict) -> bool:
    """Whether a flattened config key is a setting this run reads (else it is not one of its params)."""
    if is_capability(key) or key.startswith(("tracking.", "control.")) or key == "control":
        return False
    data, model = config.get("data") or {}, config.get("model") or {}
    if key == "data.image_size":
        return "image_size" in model  # vision models read it
    if key == "data.path":
        return data.get("name") != "random"
    if key == "data.dataset":
        return data.get("name") == "hdf5"
    if key.split(".")[0] == "optimizer":
        return "optimizer" in (config.get("task") or {})  # the task reads it (task=train_step's ${optimizer})
    if key.split(".")[0] == "environment":  # another environment is another configuration; the runner's own adds none
        return environment_applies(key, config.get("environment") or {})
    return True


def environment_applies(key: str, settings: Mapping) -> bool:
    """environment.with and .python where set; .find_links where it is read (something is installed)."""
    requirements = settings.get("with")
    if key == "environment.find_links":
        return bool(requirements) and settings.get("find_links") is not None
    return key in ("environment.with", "environment.python") and settings.get(key.split(".")[1]) not in (None, [], "")


def under(key: str, keys: Collection[str]) -> bool:
    """Whether `key` is one of `keys` or lies under one: 'timing.' (or 'timing') holds timing.max_time_s, a copied
    subtree each key in it."""
    return any(key == k or key.startswith(k if k.endswith(".") else f"{k}.") for k in keys)


# -- the machine -----------------------------------------------------------------------------------


def machine(environment: Mapping[str, object]) -> Key:
    """The kind of machine a run ran on (MACHINE's facts), e.g. 'AMD EPYC 7B13 · 2 cores · 24 GiB'. A record
    made before a fact was recorded lacks it, and is keyed by what it has."""
    facts = machine_facts(environment)
    name = " · ".join(
        f"{v} {MACHINE[k]}".strip() if k != "gpu_driver_branch" else f"driver {v}" for k, v in facts.items() if v
    )
    return Key(_hash("|".join(facts.values())), name)


def machine_facts(environment: Mapping[str, object]) -> dict[str, str]:
    """MACHINE's facts of a recorded environment, '' where it has none."""
    facts = {k: str(environment.get(k) or "") for k in MACHINE}
    if not facts["gpu_driver_branch"]:  # recorded before the branch was: the driver's full version
        facts["gpu_driver_branch"] = gpu_driver_branch(str(environment.get("gpu_driver") or ""))
    if not facts["speed_variables"]:
        facts["speed_variables"] = speed_variables(environment)
    return facts


def gpu_driver_branch(version: str) -> str:
    """'550' of NVIDIA's '550.54.15': a branch is a feature release; the releases within it are bug-fix and security
    updates a fleet takes as they come, which must not start a new machine (where one does move a time, the history
    finds the step). The CUDA version the driver supports follows from its branch; the CUDA a framework was built
    with is part of the framework's version (torch 2.14.1+cu128)."""
    return version.split(".", 1)[0] if version else ""


def speed_variables(environ: Mapping[str, object]) -> str:
    """The SPEED_VARIABLES set, as 'OMP_NUM_THREADS=1 OPENBLAS_CORETYPE=Haswell'."""
    return " ".join(f"{k}={environ[k]}" for k in SPEED_VARIABLES if environ.get(k) not in (None, ""))
