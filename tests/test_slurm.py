"""SLURM sweeps: the launcher's fitting and following as functions, then for real on a one-node SLURM.

`pytest -m slurm tests/test_slurm.py` brings up scripts/local-slurm.sh (as root; it installs slurm-wlm and
munge when missing) unless a partition `debug` answers already, and takes it down afterwards.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import free_port, mlflow_runs, results, run_cli, runner_cli, sweep_cli
from omegaconf import OmegaConf

from runner.config import CONFIG_DIR, PROJECT_ROOT
from runner.launch import slurm, slurm_fit, slurm_queue
from runner.record import environment

SCRIPT = PROJECT_ROOT / "scripts" / "local-slurm.sh"
ON_SLURM = ["hydra/launcher=slurm", "hydra.launcher.partition=debug"]
SINFO = (
    "debug*|up|vm|2|7800|(null)|infinite\n"
    "big|up|g1|64|512000|gpu:a100:4(S:0-1)|1-12:00:00\n"
    "big|up|g2|64|512000|gpu:a100:4|1-12:00:00\n"
    "mixed|up|c1|8|32000|(null)|infinite\n"
    "mixed|up|g3|32|256000|gpu:2|infinite\n"
)


# ------------------------------------------------------------------------------ fitting, following


def test_sinfo_is_read_per_node_with_gpus_and_the_default_partition():
    assert slurm_fit.parse_sinfo(SINFO, None) == slurm_fit.Partition(
        "debug", "up", (slurm_fit.Node("vm", 2, 7800, 0),), None
    )
    big = slurm_fit.parse_sinfo(SINFO, "big")
    assert big.max_time_min == 36 * 60
    assert [(n.name, n.cpus, n.gpus) for n in big.nodes] == [("g1", 64, 4), ("g2", 64, 4)]
    with pytest.raises(slurm_fit.LaunchRefused, match="no partition 'gpu' .*big, debug, mixed"):
        slurm_fit.parse_sinfo(SINFO, "gpu")


def test_null_cpus_are_the_cores_of_the_smallest_node_that_can_hold_the_job_and_memory_is_left_null():
    debug, mixed = slurm_fit.parse_sinfo(SINFO, "debug"), slurm_fit.parse_sinfo(SINFO, "mixed")
    fitted = slurm_fit.fit_request({"cpus_per_task": None, "mem_gb": None, "tasks_per_node": 1, "nodes": 1}, debug)
    assert fitted["cpus_per_task"] == 2 and fitted["mem_gb"] is None  # memory: --mem=0 with --exclusive
    assert slurm_fit.fit_request({"cpus_per_task": 1}, debug)["cpus_per_task"] == 1
    assert slurm_fit.fit_request({"tasks_per_node": 2}, mixed)["cpus_per_task"] == 4
    assert slurm_fit.fit_request({"gpus_per_node": 1}, mixed)["cpus_per_task"] == 32  # only g3 has GPUs


@pytest.mark.parametrize(
    ("request_", "match"),
    [
        ({"cpus_per_task": 8, "mem_gb": 32}, "asks for 8 CPUs, 32.0 GB per node, but partition debug has 0 such"),
        ({"cpus_per_task": 1, "mem_gb": 1, "gpus_per_node": 1}, "asks for GPUs, but partition debug has none"),
        ({"cpus_per_task": 1, "mem_gb": 1, "gpus_per_task": 1}, "asks for GPUs, but partition debug has none"),
        ({"cpus_per_task": 1, "mem_gb": 1, "nodes": 2}, "asks for 2 nodes with"),
    ],
)
def test_a_request_no_node_can_hold_is_refused_in_one_line(request_, match):
    with pytest.raises(slurm_fit.LaunchRefused, match=match) as refused:
        slurm_fit.fit_request(request_, slurm_fit.parse_sinfo(SINFO, "debug"))
    assert "\n" not in str(refused.value)


def test_a_gpu_request_fits_the_gpu_partition():
    big = slurm_fit.parse_sinfo(SINFO, "big")
    fitted = slurm_fit.fit_request({"cpus_per_task": 8, "mem_gb": 64, "gpus_per_node": 4, "nodes": 2}, big)
    assert fitted["cpus_per_task"] == 8
    with pytest.raises(slurm_fit.LaunchRefused, match="asks for 8 CPUs, 64.0 GB, 5 GPUs per node, .* 0 such nodes"):
        slurm_fit.fit_request({"cpus_per_task": 8, "mem_gb": 64, "gpus_per_node": 5}, big)


LAUNCHER = {"gpus_per_node": None, "gpus_per_task": None, "gres": None, "gpus_per_cuda_job": 1, "exclusive": True}


def test_cuda_jobs_ask_for_gpus_in_an_array_of_their_own_and_cpu_jobs_for_none():
    arrays = slurm_fit.fit_arrays(
        LAUNCHER, ["cpu", "cuda", "cpu", "auto", "cuda"], slurm_fit.parse_sinfo(SINFO, "mixed")
    )
    assert [(r["gpus_per_node"], r["cpus_per_task"], positions) for r, positions in arrays] == [
        (None, 8, [0, 2, 3]),
        (1, 32, [1, 4]),
    ]
    two = slurm_fit.fit_arrays({**LAUNCHER, "gpus_per_cuda_job": 2}, ["cuda"], slurm_fit.parse_sinfo(SINFO, "big"))
    assert [(r["gpus_per_node"], positions) for r, positions in two] == [(2, [0])]


@pytest.mark.parametrize(
    ("explicit", "gpus"),
    [
        ({"gpus_per_node": 2}, 2),
        ({"gpus_per_cuda_job": 0}, None),
        ({"gpus_per_task": 1}, None),
        ({"gres": "gpu:1"}, None),
    ],
)
def test_gpus_asked_for_explicitly_are_what_every_job_asks_for(explicit, gpus):
    arrays = slurm_fit.fit_arrays({**LAUNCHER, **explicit}, ["cpu", "cuda"], slurm_fit.parse_sinfo(SINFO, "big"))
    assert [(r["gpus_per_node"], positions) for r, positions in arrays] == [(gpus, [0, 1])]


def test_a_cuda_job_on_a_partition_without_gpus_is_refused_in_one_line():
    devices = ["cpu", "cuda", "cpu", "cuda", "cuda", "cuda", "cuda"]
    with pytest.raises(slurm_fit.LaunchRefused) as refused:
        slurm_fit.fit_arrays(LAUNCHER, devices, slurm_fit.parse_sinfo(SINFO, "debug"), first=10)
    assert str(refused.value) == (
        "jobs #11, #13, #14, #15, ... (5 jobs) (device=cuda, gpus_per_cuda_job=1) ask for GPUs, but partition debug "
        "has none (sinfo): choose a partition with GPUs (hydra.launcher.partition)"
    )
    assert slurm_fit.fit_arrays(LAUNCHER, ["cpu", "auto"], slurm_fit.parse_sinfo(SINFO, "debug"))  # no cuda job: fine


def test_a_time_limit_longer_than_the_partition_allows_is_refused():
    big = slurm_fit.parse_sinfo(SINFO, "big")
    assert slurm_fit.fit_request({"timeout_min": 36 * 60}, big)["timeout_min"] == 2160
    with pytest.raises(slurm_fit.LaunchRefused, match="timeout_min=2161 is longer than partition big allows"):
        slurm_fit.fit_request({"timeout_min": 2161}, big)


def test_a_down_partition_is_refused():
    with pytest.raises(slurm_fit.LaunchRefused, match="partition debug is down"):
        slurm_fit.fit_request({}, slurm_fit.parse_sinfo(SINFO.replace("|up|vm", "|down|vm"), "debug"))


THREE = "debug*|up|node-1|2|8000|(null)|infinite|idle|none\n"
THREE += "debug*|up|node-2|2|8000|(null)|infinite|down*|Not responding\n"
THREE += "debug*|up|node-3|2|8000|(null)|infinite|drain|disk full\n"


def test_sinfo_states_say_which_nodes_take_jobs():
    partition = slurm_fit.parse_sinfo(THREE, None)
    assert [(n.name, n.state, n.reason, n.up) for n in partition.nodes] == [
        ("node-1", "idle", "", True),
        ("node-2", "down*", "Not responding", False),
        ("node-3", "drain", "disk full", False),
    ]
    powered_off = slurm_fit.parse_sinfo(THREE.replace("down*", "alloc~").replace("drain|", "mix|"), None)
    assert len(powered_off.up_nodes) == 3  # a power-saving cluster's node, off (~), starts when a job asks for it


def test_blocks_count_the_nodes_that_are_up_and_are_refused_in_one_line_when_fewer_are():
    partition = slurm_fit.parse_sinfo(THREE, None)
    assert slurm_fit.blocks_refusal(1, partition) is None
    assert slurm_fit.blocks_refusal(2, partition) == (
        "hydra.launcher.blocks=2 asks for 2 nodes, but partition debug has 1 up of 3 (node-2 down* (Not responding), "
        "node-3 drain (disk full)) (sinfo)"
    )
    all_up = slurm_fit.parse_sinfo(THREE.replace("down*|", "idle|").replace("drain|", "mix|"), None)
    assert slurm_fit.blocks_refusal(4, all_up) == (
        "hydra.launcher.blocks=4 asks for 4 nodes, but partition debug has 3 (sinfo)"
    )


def test_preflight_refuses_blocks_beyond_the_nodes_up_where_the_command_line_asks_slurm_for_them(monkeypatch):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from runner.launch import where_it_runs

    asked = []
    monkeypatch.setattr(
        slurm_fit, "read_partition", lambda name: asked.append(name) or slurm_fit.parse_sinfo(THREE, name)
    )
    parse = OverridesParser.create().parse_overrides
    slurm_blocks = ["hydra/launcher=slurm", "hydra.launcher.partition=debug", "hydra.launcher.blocks=2"]
    assert where_it_runs.problem(parse(slurm_blocks), {}) == slurm_fit.blocks_refusal(
        2, slurm_fit.parse_sinfo(THREE, None)
    )
    assert where_it_runs.problem(parse(["hydra/launcher=slurm", "hydra.launcher.blocks=1"]), {}) is None
    assert asked == ["debug", None]
    assert where_it_runs.problem(parse(["hydra.launcher.blocks=2"]), {}) is None and len(asked) == 2  # not SLURM


def test_a_partition_none_of_whose_nodes_takes_jobs_is_refused_before_anything_is_submitted():
    none_up = slurm_fit.parse_sinfo(THREE.replace("|idle|none", "|down|taken down"), None)
    with pytest.raises(slurm_fit.LaunchRefused) as refused:
        slurm_fit.fit_request({}, none_up)
    assert str(refused.value) == (
        "no node of SLURM partition debug takes jobs: node-1 down (taken down), node-2 down* (Not responding), "
        "node-3 drain (disk full) (sinfo): no job can start"
    )
    with pytest.raises(slurm_fit.LaunchRefused, match="has 0 such nodes up"):  # node-1 alone takes jobs, and is small
        slurm_fit.fit_request({"cpus_per_task": 2, "mem_gb": 10}, slurm_fit.parse_sinfo(THREE, None))


def test_a_sweep_no_job_of_which_can_run_is_refused_before_a_cluster_is_asked_and_one_that_can_is_not():
    from helpers import compose_config

    from runner.launch import cluster_jobs

    matmul = [(n, compose_config("model=matmul", f"backend={b}")) for n, b in ((3, "numpy"), (4, "torch"))]
    assert cluster_jobs.none_can_run(matmul) == (
        "no job of the sweep can run, so nothing is submitted: job #3 (and the 1 other job of the sweep): "
        "model=matmul runs only task=inference, not task=gradients"
    )
    assert cluster_jobs.none_can_run([*matmul, (5, compose_config("model=matmul", "task=inference"))]) is None


@pytest.fixture
def launcher(tmp_path, monkeypatch):
    """make(*overrides): runner.launch.slurm's launcher as Hydra sets it up from conf/hydra/launcher/slurm.yaml."""
    import submitit
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import HydraContext

    monkeypatch.setattr(submitit.SlurmExecutor, "affinity", classmethod(lambda cls: 2))  # as if srun were on PATH

    def make(*overrides: str) -> slurm.SlurmLauncher:
        sweep = [f"hydra.sweep.dir={tmp_path}/sweep", "hydra.launcher.name=run"]
        config = compose("config", ["hydra/launcher=slurm", *sweep, *overrides], return_hydra_config=True)
        params = OmegaConf.to_container(config.hydra.launcher, resolve=True)
        made = slurm.SlurmLauncher(**{k: v for k, v in params.items() if k != "_target_"})
        context = HydraContext(config_loader=GlobalHydra.instance().config_loader(), callbacks=None)
        made.setup(hydra_context=context, task_function=lambda cfg: None, config=config)
        return made

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        yield make
    GlobalHydra.instance().clear()


def sbatch_options(made: slurm.SlurmLauncher, request: dict) -> set[str]:
    """The #SBATCH lines submitit writes for this request (rendered, not submitted)."""
    text = made._executor(request)._executor._make_submission_file_text("true", "uid")
    return {line for line in text.splitlines() if line.startswith("#SBATCH")}


def test_every_job_is_sbatch_exclusive_with_all_the_nodes_memory_and_cuda_jobs_ask_for_a_gpu(launcher):
    made = launcher("hydra.launcher.partition=mixed")
    (cpu, _), (cuda, _) = slurm_fit.fit_arrays(made.params, ["cpu", "cuda"], slurm_fit.parse_sinfo(SINFO, "mixed"))
    node = {"#SBATCH --exclusive", "#SBATCH --mem=0", "#SBATCH --partition=mixed", "#SBATCH --nodes=1"}
    assert node | {"#SBATCH --cpus-per-task=8"} <= sbatch_options(made, cpu)
    assert not any("gpu" in line for line in sbatch_options(made, cpu))
    assert node | {"#SBATCH --cpus-per-task=32", "#SBATCH --gpus-per-node=1"} <= sbatch_options(made, cuda)


def test_exclusive_can_be_turned_off_and_a_memory_set_is_kept(launcher):
    made = launcher("hydra.launcher.exclusive=false", "hydra.launcher.cpus_per_task=2")
    shared = sbatch_options(made, made.params)
    assert not any(line.startswith(("#SBATCH --exclusive", "#SBATCH --mem")) for line in shared), shared
    made = launcher("hydra.launcher.mem_gb=16")
    assert {"#SBATCH --exclusive", "#SBATCH --mem=16GB"} <= sbatch_options(made, made.params)


def test_each_jobs_device_comes_from_its_composed_config(launcher):
    made = launcher()
    assert made._devices([["device=cuda"], ["device=cpu"], [], ["device=auto"]], 0) == ["cuda", "cpu", "cpu", "auto"]
    with pytest.raises(slurm_fit.LaunchRefused, match=r"^job #5 \(device=tpu\): .*device/tpu"):
        made._devices([["device=cpu"], ["device=tpu"]], 4)
    assert launcher("hydra.launcher.gpus_per_node=1")._devices([["device=tpu"]], 0) == [""]  # GPUs set: not composed


class SubmittedArrays:
    """Stands in for sbatch: each map_array is an array 7, 8, ... whose jobs are FakeJobs."""

    def __init__(self, made: slurm.SlurmLauncher, folder: Path, fail_at: int | None = None):
        self.made, self.folder, self.fail_at = made, folder, fail_at
        self.arrays: list[tuple[str, list[int]]] = []
        self.executor = made._executor

    def __call__(self, request: dict):
        executor = self.executor(request)
        executor.map_array = lambda fn, overrides, key, numbers, ids, state: self.submit(executor, numbers)
        return executor

    def submit(self, executor, numbers) -> list:
        from submitit.core.utils import FailedJobError

        if len(self.arrays) == self.fail_at:
            raise FailedJobError("sbatch: error: QOSMaxGRESPerUser\nmore")
        array = 7 + len(self.arrays)
        self.arrays.append((slurm_fit.sbatch_summary(executor._executor.parameters), list(numbers)))
        return [FakeJob(f"{array}_{task}", self.folder) for task in range(len(numbers))]


OVERRIDES = [["device=cpu", "seed=1"], ["device=cuda", "seed=1"], ["device=cpu", "seed=2"], ["device=cuda", "seed=2"]]


def test_jobs_asking_differently_are_arrays_of_their_own_numbered_and_followed_as_one_sweep(
    launcher, tmp_path, monkeypatch, caplog, capsys
):
    made = launcher("hydra.launcher.partition=mixed")
    monkeypatch.setattr(made, "_executor", submitted := SubmittedArrays(made, tmp_path))
    arrays = slurm_fit.fit_arrays(made.params, made._devices(OVERRIDES, 5), slurm_fit.parse_sinfo(SINFO, "mixed"), 5)
    with caplog.at_level(logging.INFO, logger="runner.launch.slurm"):
        jobs = made._submit(OVERRIDES, 5, arrays, tmp_path)
    assert submitted.arrays == [
        ("--partition=mixed --exclusive --cpus-per-task=8 --mem=0 --time=60", [5, 7]),
        ("--partition=mixed --exclusive --cpus-per-task=32 --mem=0 --gpus-per-node=1 --time=60", [6, 8]),
    ]
    assert [job.job_id for job in jobs] == ["7_0", "8_0", "7_1", "8_1"]
    assert [r.getMessage() for r in caplog.records] == [f"\t#{5 + i} : {' '.join(o)}" for i, o in enumerate(OVERRIDES)]
    assert capsys.readouterr().out.count("slurm: submitting 2 jobs") == 2

    asked = []
    queue = "7_0|20|COMPLETED|None\n8_0|21|COMPLETED|None\n7_1|22|COMPLETED|None\n8_1|23|COMPLETED|None\n"
    monkeypatch.setattr(slurm_queue, "read_queue", lambda ids: asked.append(ids) or slurm_queue.parse_queue(queue))
    states = slurm_queue.Follower(jobs, first=5).run()
    assert asked == [{"7", "8"}] and all(s.state == "COMPLETED" for s in states.values())
    assert capsys.readouterr().out.splitlines()[1] == "slurm: job #6 SLURM job 8_0 COMPLETED"


def test_a_failed_sbatch_cancels_the_arrays_already_submitted_and_says_why_in_one_line(
    launcher, tmp_path, monkeypatch, capsys
):
    made = launcher("hydra.launcher.partition=mixed")
    monkeypatch.setattr(made, "_executor", SubmittedArrays(made, tmp_path, fail_at=1))
    cancelled = []
    monkeypatch.setattr(slurm_queue.subprocess, "run", lambda args, **kw: cancelled.append(args))
    arrays = slurm_fit.fit_arrays(made.params, made._devices(OVERRIDES, 0), slurm_fit.parse_sinfo(SINFO, "mixed"))
    with pytest.raises(SystemExit) as exited:
        made._submit(OVERRIDES, 0, arrays, tmp_path)
    assert exited.value.code == 1 and cancelled == [["scancel", "7_0", "7_1"]]
    assert exited.value.line == "sbatch failed: sbatch: error: QOSMaxGRESPerUser"  # the sweep's end prints it


def test_hydra_sweep_mode_sets_the_sweep_directorys_permissions(launcher, tmp_path):
    assert launcher()._sweep_dir().is_dir()
    sweep_dir = launcher("+hydra.sweep.mode=750")._sweep_dir()
    assert sweep_dir == tmp_path / "sweep" and stat.S_IMODE(sweep_dir.stat().st_mode) == 0o750
    with pytest.raises(slurm_fit.LaunchRefused, match="hydra.sweep.mode=rwx is not a file mode in octal digits"):
        launcher("+hydra.sweep.mode=rwx")._sweep_dir()


def test_pending_reasons_that_waiting_cannot_resolve():
    queue = slurm_queue.parse_queue(
        "7_0|8|PENDING|PartitionConfig\n7_1|9|PENDING|Resources\n7_2|10|PENDING|ReqNodeNotAvail, UnavailableNodes:vm\n"
    )
    assert [slurm_queue.is_permanent(queue[i]) for i in ("7_0", "7_1", "7_2")] == [True, False, True]
    assert queue["7_1"].slurm_job_id == "9"


class FakeJob:
    def __init__(self, job_id: str, folder: Path):
        self.job_id = job_id
        self.paths = type("Paths", (), {"result_pickle": folder / f"{job_id}_result.pkl"})()


def test_following_waits_on_resources_and_cancels_what_can_never_start(tmp_path, monkeypatch, capsys):
    queues = iter(
        [
            "5_0|6|PENDING|Resources\n5_1|7|PENDING|PartitionConfig\n",
            "5_0|6|RUNNING|None\n5_1|7|PENDING|PartitionConfig\n",
            "5_0|6|COMPLETED|None\n5_1|7|CANCELLED|PartitionConfig\n",
        ]
    )
    cancelled = []
    monkeypatch.setattr(slurm_queue, "read_queue", lambda ids: slurm_queue.parse_queue(next(queues)))
    monkeypatch.setattr(slurm_queue.subprocess, "run", lambda args, **kw: cancelled.append(args))
    monkeypatch.setattr(slurm_queue, "PENDING_GRACE_S", 0.0)
    monkeypatch.setattr(slurm_queue, "POLL_MIN_S", 0.0)
    states = slurm_queue.Follower([FakeJob("5_0", tmp_path), FakeJob("5_1", tmp_path)]).run()
    assert cancelled == [["scancel", "5_1"]]
    assert states["5_0"].state == "COMPLETED" and not states["5_0"].extra
    assert states["5_1"].describe() == (
        "SLURM job 5_1 CANCELLED (PartitionConfig): pending for PartitionConfig, which waiting cannot resolve; "
        "cancelled after 0 s"
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "slurm: job #0 SLURM job 5_0 PENDING (Resources): queued" and len(lines) == len(set(lines))


def test_a_failing_squeue_is_said_once_and_never_taken_for_the_end_of_a_job(tmp_path, monkeypatch, capsys):
    running, done = slurm_queue.parse_queue("5_0|6|RUNNING|None\n"), slurm_queue.parse_queue("5_0|6|COMPLETED|None\n")
    queues = iter([running, None, None, None, None, done])
    monkeypatch.setattr(slurm_queue, "read_queue", lambda ids: next(queues))
    monkeypatch.setattr(slurm_queue, "POLL_MIN_S", 0.0)
    states = slurm_queue.Follower([FakeJob("5_0", tmp_path)]).run()
    assert states["5_0"].state == "COMPLETED"
    assert capsys.readouterr().err.count("squeue failed") == 1


def test_lost_nodes_are_down_or_not_answering_pings_and_a_drained_node_is_not_lost():
    lost = slurm_queue.lost_in("node-1|alloc|none\nnode-2|alloc*|none\nnode-3|down|Kill task failed\nnode-4|drng|x\n")
    assert lost == {"node-2": "node-2 alloc*", "node-3": "node-3 down (Kill task failed)"}


def test_a_job_whose_node_is_lost_is_cancelled_and_ended_node_fail_naming_the_node(tmp_path, monkeypatch, capsys):
    queues = iter(
        [
            "5_0|6|RUNNING|None|node-1\n5_1|7|RUNNING|None|node-2\n",
            "5_0|6|COMPLETED|None|node-1\n5_1|7|RUNNING|None|node-2\n",
        ]
    )
    sinfo = iter([{}, {"node-2": "node-2 alloc* (Not responding)"}])
    asked, cancelled = [], []
    monkeypatch.setattr(slurm_queue, "read_queue", lambda ids: slurm_queue.parse_queue(next(queues)))
    monkeypatch.setattr(slurm_queue, "lost_nodes", lambda nodes: asked.append(nodes) or next(sinfo))
    monkeypatch.setattr(slurm_queue.subprocess, "run", lambda args, **kw: cancelled.append(args))
    monkeypatch.setattr(slurm_queue, "POLL_MIN_S", 0.0)
    states = slurm_queue.Follower([FakeJob("5_0", tmp_path), FakeJob("5_1", tmp_path)], first=1, noun="block ").run()
    assert asked == [{"node-1", "node-2"}, {"node-2"}] and cancelled == [["scancel", "5_1"]]
    assert states["5_1"].describe() == (
        "SLURM job 5_1 NODE_FAIL (sinfo: node-2 alloc* (Not responding)) on node-2: its node is lost; cancelled"
    )
    assert capsys.readouterr().out.splitlines()[-1] == f"slurm: block 2 {states['5_1'].describe()}"
    assert slurm.nodes_line(list(states.values())) == (
        "the answer rests on 1 of 2 nodes: node-1 (block 2 on node-2: NODE_FAIL)"
    )


def test_scheduler_context_names_the_slurm_job_and_node():
    environ = {"SLURM_JOB_ID": "12", "SLURM_ARRAY_JOB_ID": "11", "SLURM_ARRAY_TASK_ID": "1", "SLURMD_NODENAME": "vm"}
    assert environment.scheduler_context(environ) == {
        "slurm_job_id": "12",
        "slurm_array_job_id": "11",
        "slurm_array_task_id": "1",
        "slurm_node": "vm",
    }
    assert environment.scheduler_context({}) == {}


def test_the_sacct_fallback_warning_is_shown_once_with_its_meaning(caplog):
    slurm_queue.quiet_sacct_warnings()
    slurm_queue.quiet_sacct_warnings()  # each launch installs it; still one filter
    logger = logging.getLogger("submitit")
    with caplog.at_level(logging.WARNING, logger="submitit"):
        for call in range(5):
            logger.warning(
                f"Call #{call} - Bypassing sacct error Command 'sacct' returned 1, status may be inaccurate."
            )
    assert [r.getMessage() for r in caplog.records if "sacct" in r.getMessage()] == [
        "submitit cannot read SLURM accounting (sacct failed: accounting storage is probably disabled); "
        "job states come from squeue instead, and this is not repeated"
    ]


# ------------------------------------------------------------------------------ on a real SLURM


def _debug_partition_answers() -> bool:
    if shutil.which("sinfo") is None:
        return False
    out = subprocess.run(["sinfo", "-h", "-p", "debug", "-o", "%a"], capture_output=True, text=True, timeout=30)
    return out.returncode == 0 and out.stdout.strip() == "up"


@pytest.fixture(scope="session")
def local_slurm():
    """A one-node SLURM with partition `debug`: the one running, or scripts/local-slurm.sh's."""
    if _debug_partition_answers():
        yield
        return
    if os.geteuid() != 0:
        pytest.skip("no SLURM partition `debug` answers, and starting one (scripts/local-slurm.sh up) needs root")
    up = subprocess.run([str(SCRIPT), "up"], capture_output=True, text=True, timeout=900)
    if up.returncode != 0:
        pytest.skip(f"scripts/local-slurm.sh up failed: {(up.stderr or up.stdout).strip().splitlines()[-1:]}")
    try:
        yield
    finally:
        subprocess.run([str(SCRIPT), "down"], capture_output=True, timeout=300)


def slurm_sweep(tmp: Path, *overrides: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return sweep_cli(tmp, *ON_SLURM, *overrides, timeout=timeout)


def _queue_names() -> str:
    return subprocess.run(["squeue", "-h", "--states=all", "-o", "%i %j %T"], capture_output=True, text=True).stdout


def _allocated(job_id: str) -> str:
    """What SLURM gave the job (scontrol's TRES, e.g. cpu=2,mem=24105M,node=1), while it still lists it."""
    out = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, check=True)
    return next(field[5:] for field in out.stdout.split() if field.startswith("TRES="))


def _whole_node() -> str:
    cpus, memory = subprocess.run(
        ["sinfo", "-h", "-p", "debug", "-o", "%c %m"], capture_output=True, text=True
    ).stdout.split()
    return f"cpu={cpus},mem={memory}M,node=1"


@pytest.mark.slurm
@pytest.mark.slow
def test_four_jobs_on_slurm_are_one_parent_and_four_finished_children(local_slurm, tmp_path):
    result = slurm_sweep(tmp_path, "backend=numpy,torch", "seed=1,2", "hydra.launcher.cpus_per_task=1")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    saved = results(tmp_path)
    assert [r["status"] for r in saved.values()] == ["FINISHED"] * 4
    job_ids = {r["environment"]["slurm_job_id"] for r in saved.values()}
    assert len(job_ids) == 4 and all(r["environment"]["slurm_node"] for r in saved.values())
    parents, children = mlflow_runs(tmp_path)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert [c.info.status for c in children] == ["FINISHED"] * 4
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parents[0].info.run_id}
    assert {c.data.tags["env.slurm_job_id"] for c in children} == job_ids
    assert {_allocated(job_id).split(",billing")[0] for job_id in job_ids} == {_whole_node()}  # --exclusive, --mem=0


@pytest.mark.slurm
@pytest.mark.slow
def test_shipped_defaults_run_two_jobs_on_the_two_cpu_partition_with_at_most_one_sacct_warning(local_slurm, tmp_path):
    result = slurm_sweep(tmp_path, "backend=numpy,torch")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert [r["status"] for r in results(tmp_path).values()] == ["FINISHED", "FINISHED"]
    assert output.count("sacct") <= 1 and output.count("accounting") <= 1
    progress = [line for line in output.splitlines() if line.startswith("slurm: job")]
    assert progress and len(progress) == len(set(progress))  # a line per change, never a repeat
    assert "(--partition=debug --exclusive --cpus-per-task=2 --mem=0 --time=60)" in output
    (script,) = (tmp_path / "sweep" / ".submitit").glob("*/*_submission.sh")
    assert {"#SBATCH --exclusive", "#SBATCH --mem=0", "#SBATCH --cpus-per-task=2"} <= set(
        script.read_text().splitlines()
    )
    logged = [line.split("\t", 1)[1] for line in output.splitlines() if "\t#" in line]
    assert [line.split(" : ")[0] for line in logged] == ["#0", "#1"] and "backend=torch" in logged[1], output[-3000:]


OVERSIZE = ["backend=numpy,torch", "hydra.launcher.cpus_per_task=8", "hydra.launcher.mem_gb=32"]


@pytest.mark.slurm
@pytest.mark.slow
def test_an_oversize_request_is_refused_before_submission_in_one_line(local_slurm, tmp_path):
    queued_before = _queue_names()
    start = time.monotonic()  # untracked: the whole command, without MLflow's import and store
    result = run_cli("-m", *ON_SLURM, "tracking=none", f"hydra.sweep.dir={tmp_path}/sweep", *OVERSIZE)
    elapsed = time.monotonic() - start
    assert result.returncode == 1 and elapsed < 10, (elapsed, result.stderr[-3000:])
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "asks for 8 CPUs, 32.0 GB per node, but partition debug" in errors[0], result.stderr
    assert "Traceback" not in result.stderr and "submitting" not in result.stdout
    assert _queue_names() == queued_before and not (tmp_path / "sweep" / ".submitit").exists()


@pytest.mark.slurm
@pytest.mark.slow
def test_a_cuda_job_is_refused_before_submission_on_a_partition_without_gpus(local_slurm, tmp_path):
    queued_before = _queue_names()
    sweep = [f"hydra.sweep.dir={tmp_path}/sweep", "backend=torch", "device=cpu,cuda"]
    result = run_cli("-m", *ON_SLURM, "tracking=none", *sweep)
    assert result.returncode == 1, result.stderr[-3000:]
    assert [line for line in result.stderr.splitlines() if line.startswith("error:")] == [
        "error: jobs #1 (device=cuda, gpus_per_cuda_job=1) ask for GPUs, but partition debug has none (sinfo): "
        "choose a partition with GPUs (hydra.launcher.partition)"
    ]
    assert "Traceback" not in result.stderr and "submitting" not in result.stdout
    assert _queue_names() == queued_before and not (tmp_path / "sweep" / ".submitit").exists()


@pytest.mark.slurm
@pytest.mark.slow
def test_a_refused_sweep_is_a_failed_parent_run_with_the_reason(local_slurm, tmp_path):
    result = slurm_sweep(tmp_path, *OVERSIZE)
    assert result.returncode == 1, result.stderr[-3000:]
    (parent,), children = mlflow_runs(tmp_path)
    assert parent.info.status == "FAILED" and "partition debug" in parent.data.tags["error"] and not children
    assert "partition debug" in json.loads((tmp_path / "sweep" / "sweep.json").read_text())["launch_error"]


@pytest.mark.slurm
@pytest.mark.slow
def test_a_job_past_its_time_limit_is_failed_with_slurms_reason_and_the_other_job_kept(local_slurm, tmp_path):
    # job 0 is quick; job 1 would time for 300 s but has timeout_min=1
    result = slurm_sweep(
        tmp_path,
        "backend=numpy",
        "timing.target_rel_iqr=0",
        "timing.max_time_s=0.2,300",
        "hydra.launcher.timeout_min=1",
    )
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-3000:]
    saved = results(tmp_path)
    assert saved["0"]["status"] == "FINISHED" and saved["0"]["metrics"]["n_samples"] > 0
    assert saved["1"]["status"] == "FAILED" and "TIMEOUT (TimeLimit)" in saved["1"]["error"], saved["1"]
    assert saved["1"]["environment"]["slurm_job_id"]
    parents, children = mlflow_runs(tmp_path)
    assert parents[0].info.status == "FAILED"
    by_job = {Path(c.data.tags["run_dir"]).name: c for c in children}
    assert by_job["0"].info.status == "FINISHED" and by_job["1"].info.status == "FAILED"
    assert "TIMEOUT (TimeLimit)" in by_job["1"].data.tags["error"]


@pytest.mark.slurm
@pytest.mark.slow
def test_a_job_that_can_never_start_is_cancelled_and_failed_with_slurms_reason(local_slurm, tmp_path):
    blocker = _submit_blocker()  # holds the node, so the sweep's jobs are still pending when the partition goes down
    log = tmp_path / "sweep.log"
    try:
        with log.open("w") as out:
            sweep = _start_cli(
                out, "-m", *ON_SLURM, "tracking=none", f"hydra.sweep.dir={tmp_path}/sweep", "backend=numpy"
            )
            _wait_for(lambda: "submitting" in log.read_text(), sweep)
            _scontrol("update", "PartitionName=debug", "State=DOWN")
            subprocess.run(["scancel", blocker], check=True)
            sweep.wait(timeout=slurm_queue.PENDING_GRACE_S + 120)
    finally:
        _scontrol("update", "PartitionName=debug", "State=UP")
        subprocess.run(["scancel", blocker], capture_output=True)
    output = log.read_text()
    assert sweep.returncode == 1, output[-3000:]
    assert "PENDING (PartitionDown): it cannot start as asked" in output
    error = results(tmp_path)["0"]["error"]
    assert "PartitionDown" in error and "which waiting cannot resolve; cancelled after 30 s" in error, error


def _submit_blocker() -> str:
    out = subprocess.run(
        ["sbatch", "--parsable", "-p", "debug", "-c", "2", "-J", "blocker", "-o", "/dev/null", "--wrap", "sleep 300"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def _scontrol(*args: str) -> None:
    subprocess.run(["scontrol", *args], check=True, capture_output=True)


def _start_cli(out, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PROJECT_ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    run_py = str(PROJECT_ROOT / "run.py")
    return subprocess.Popen([sys.executable, run_py, *args], env=env, stdout=out, stderr=subprocess.STDOUT)


def _wait_for(condition, proc: subprocess.Popen, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert proc.poll() is None and time.monotonic() < deadline, "the sweep ended or hung before submitting"
        time.sleep(0.2)


@pytest.mark.slurm
@pytest.mark.slow
def test_runner_sync_uploads_a_slurm_job_that_could_not_reach_the_tracking_server(local_slurm, tmp_path):
    nowhere = f"http://127.0.0.1:{free_port()}"  # no server listens there: neither launcher nor job reach it
    result = sweep_cli(tmp_path, *ON_SLURM, "backend=numpy", f"tracking.uri={nowhere}")
    assert result.returncode == 0, result.stderr[-3000:]
    saved = results(tmp_path)
    assert saved["0"]["status"] == "FINISHED" and saved["0"]["environment"]["slurm_job_id"]
    assert json.loads((tmp_path / "sweep" / "0" / "tracking.json").read_text())["synced"] is False

    synced = runner_cli("sync", str(tmp_path / "sweep"), "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db")
    assert synced.returncode == 0, synced.stderr[-3000:]
    (parent,), (child,) = mlflow_runs(tmp_path, experiment="sweeps")
    assert child.info.status == "FINISHED" and child.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert child.data.tags["env.slurm_job_id"] == saved["0"]["environment"]["slurm_job_id"]
