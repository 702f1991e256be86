"""The lasting record, read back as a person reads it: MLflow runs through the MLflow API,
tensors.h5's attributes, and the report's PNGs over a mixed experiment (two sweeps, a single run of
the same model, a CycleGAN run)."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
from helpers import FAST_TIMING, made_store, run_cli, runner_main
from PIL import Image

from runner.launch.terminal import LABEL_WIDTH

EXPERIMENT = "record"


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    """(tmp, MlflowClient, {run name: Run}, {parent name: Run}) after four commands into one store."""
    tmp = tmp_path_factory.mktemp("record")
    common = [*FAST_TIMING, f"tracking.uri={made_store(tmp)}", f"tracking.experiment={EXPERIMENT}"]
    commands = [
        ["-m", f"hydra.sweep.dir={tmp}/sizes", "model=sigmoid", "task=inference", "model.size=10,1000"],
        ["-m", f"hydra.sweep.dir={tmp}/modes", "model=mlp", "mode=eager,map_fn"],
        [f"hydra.run.dir={tmp}/single", "model=mlp"],
        [
            f"hydra.run.dir={tmp}/cyclegan",
            "model=cyclegan",
            "backend=torch",
            "task=inference",
            "batch_size=1",
            "data.image_size=32",
        ],
    ]
    outputs = []
    for command in commands:
        done = run_cli(*command, *common)  # -m first, as a user types it
        assert done.returncode == 0, done.stderr[-3000:]
        outputs.append(done.stdout)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp}/mlflow.db")
    found = client.get_experiment_by_name(EXPERIMENT)
    runs = client.search_runs([found.experiment_id])
    parents = {r.info.run_name: r for r in runs if "sweep_dir" in r.data.tags}
    children = {r.info.run_name: r for r in runs if "sweep_dir" not in r.data.tags}
    return tmp, client, children, parents, outputs


def test_names_unique_swept_values_and_parent_named_by_its_sweep(experiment):
    tmp, client, children, parents, _ = experiment
    assert len(children) == 6  # six runs, six distinct names
    assert "size=10 · numpy-sigmoid-inference-eager-cpu-float32 #0" in children
    assert "size=1000 · numpy-sigmoid-inference-eager-cpu-float32 #1" in children
    assert "numpy-mlp-gradients-eager-cpu-float32" in children  # the single run, apart from sweep job #0
    assert "eager · numpy-mlp-gradients-cpu-float32 #0" in children  # what the sweep varies first
    assert set(parents) == {"sweep of inference on sigmoid: model.size=10,1000", "sweep mode=eager,map_fn"}


def test_run_spans_the_job(experiment):
    tmp, client, children, _, _ = experiment
    for run in children.values():
        result = json.loads((Path(run.data.tags["run_dir"]) / "result.json").read_text())
        # each sample is the mean of a block of at least one call: calls_per_sample is the last block's, and blocks
        # grow on a busy machine, so the samples' sum is what the span surely holds
        sampling_s = np.sum(h5py.File(f"{run.data.tags['run_dir']}/tensors.h5")["timings/samples_s"][()])
        span_s = (run.info.end_time - run.info.start_time) / 1000
        assert span_s >= sampling_s + result["metrics"]["first_call_s"] - 0.002
        assert run.info.start_time == int(result["started"] * 1000)
        assert run.info.end_time == int(result["ended"] * 1000)


def test_params_apply_to_the_model(experiment):
    _, _, children, _, _ = experiment
    mlp = children["numpy-mlp-gradients-eager-cpu-float32"].data.params
    cyclegan = children["torch-cyclegan-inference-eager-cpu-float32"].data.params
    assert {"model.hidden", "batch_size", "seed", "timing.max_time_s", "data.name"} <= set(mlp)
    assert not {"data.image_size", "data.path", "data.dataset", "tracking.uri", "model._target_"} & set(mlp)
    assert cyclegan["data.image_size"] == "32" and "model.image_size" not in cyclegan
    assert not any(k.startswith("model.supports") for k in cyclegan)


def test_standard_tags_note_and_no_duplicates(experiment):
    _, _, children, parents, _ = experiment
    run = children["numpy-mlp-gradients-eager-cpu-float32"]
    tags = run.data.tags
    assert tags["mlflow.source.name"] == "run.py" and tags["mlflow.user"]
    assert len(tags["mlflow.source.git.commit"]) == 40
    assert not {"git_commit", "cpu", "env.git_commit", "framework", "device_name"} & set(tags)
    env_values = [v for k, v in tags.items() if k.startswith("env.") and len(v) > 8]
    assert len(env_values) == len(set(env_values))  # the CPU string (and the rest) once
    note = tags["mlflow.note.content"]
    assert "median" in note and "IQR" in note and "examples/s" in note and "reference" in note
    assert any(unit in note for unit in (" ns", " µs", " ms", " s "))
    notes = {name: p.data.tags["mlflow.note.content"] for name, p in parents.items()}
    assert all(note.startswith("**") and name in note for name, note in notes.items())  # the answer, then the sweep
    map_fn = children["map_fn · numpy-mlp-gradients-cpu-float32 #1"].data.tags["mlflow.note.content"]
    assert "x the time of the fastest comparable job of the sweep" in map_fn  # added when the sweep ended


def test_every_sample_is_the_metric_history(experiment):
    _, client, children, _, _ = experiment
    for run in children.values():
        history = client.get_metric_history(run.info.run_id, "trace/time_sample_us")
        assert len(history) == run.data.metrics["n_samples"]
        assert sorted(m.step for m in history) == list(range(len(history)))
        samples = h5py.File(f"{run.data.tags['run_dir']}/tensors.h5")["timings/samples_s"][()]
        values = [m.value for m in sorted(history, key=lambda m: m.step)]
        assert np.allclose(values, samples * 1e6, rtol=1e-3)  # µs, to 4 digits


def test_inputs_are_a_dataset(experiment):
    _, _, children, _, _ = experiment
    run = children["numpy-mlp-gradients-eager-cpu-float32"]
    (dataset_input,) = run.inputs.dataset_inputs
    dataset = dataset_input.dataset
    assert dataset.name == "random: seeded random (seed 0)" and dataset.digest
    assert json.loads(dataset.profile)["features_shape"] == {"x": [32, 32], "labels": [32, 2]}
    assert json.loads(dataset.source)["uri"].endswith("tensors.h5")
    assert {t.key: t.value for t in dataset_input.tags}["mlflow.data.context"] == "gradients"


def test_experiment_opens_on_runs_and_terminal_says_where(experiment):
    tmp, client, children, parents, outputs = experiment
    assert client.get_experiment_by_name(EXPERIMENT).tags["mlflow.experimentKind"] == "custom_model_development"
    single = children["numpy-mlp-gradients-eager-cpu-float32"].info.run_id
    experiment_id = children["numpy-mlp-gradients-eager-cpu-float32"].info.experiment_id
    runs = f"http://127.0.0.1:5000/#/experiments/{experiment_id}/runs"  # the port the printed command serves
    assert f"{'MLflow run':<{LABEL_WIDTH}}{single}" in outputs[2]
    assert f"{'then open':<{LABEL_WIDTH}}{runs}/{single}?workflowType=machine_learning" in outputs[2]  # not GenAI's
    assert f"mlflow ui --backend-store-uri sqlite:///{tmp}/mlflow.db --port 5000" in outputs[2]
    parent = parents["sweep mode=eager,map_fn"].info.run_id
    assert f"MLflow parent run {parent} (sweep mode=eager,map_fn)" in outputs[1]
    assert f"{'then open':<{LABEL_WIDTH}}{runs}/{parent}?workflowType=machine_learning" in outputs[1]
    view = f"{runs}?workflowType=machine_learning&viewStateShareKey=tensor-runner"  # the runs list, its columns set
    assert f"{'runs list':<{LABEL_WIDTH}}{view}" in outputs[1]
    shared = json.loads(client.get_experiment(experiment_id).tags["mlflow.sharedViewState.tensor-runner"])
    columns = {"tags.`verdict`", "tags.`env.hostname`", "metrics.`next_fastest.time_ratio`", "metrics.`time_ratio`"}
    columns |= {"metrics.`time_typical_us`", "metrics.`tpot_p50_us`", "metrics.`tokens_per_s`"}  # ratios; tasks
    assert columns <= set(shared["selectedColumns"]) and "metrics.`time_median_us`" not in shared["selectedColumns"]


def test_tensors_h5_describes_itself(experiment):
    tmp, _, _, _, _ = experiment
    with h5py.File(tmp / "cyclegan" / "tensors.h5", "r") as f:
        config = json.loads(f.attrs["config"])
        assert config["model"]["name"] == "cyclegan" and config["batch_size"] == 1
        assert f.attrs["calls_per_sample"] >= 1 and "block_size" not in f.attrs
        assert f.attrs["batch_size"] == 1 and f.attrs["seed"] == 0
        assert f["timings/samples_s"].attrs["units"] == "s"
        assert f["inputs/x"].attrs["layout"] == "NCHW" and f["inputs/x"].shape == (1, 3, 32, 32)
        assert f["outputs/y"].attrs["layout"] == "NCHW"
    with h5py.File(tmp / "single" / "tensors.h5", "r") as f:
        assert "layout" not in f["inputs/x"].attrs  # an MLP's inputs are not images


def test_report_over_the_mixed_experiment(experiment):
    tmp, _, _, _, _ = experiment
    out = tmp / "report"
    done = runner_main(
        "report", "--tracking-uri", f"sqlite:///{tmp}/mlflow.db", "--experiment", EXPERIMENT, "--out", str(out)
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert {p.name for p in out.glob("*.png")} == {"time_per_config.png", "time_vs_size.png", "speedup.png"}
    for png in out.glob("*.png"):
        width, height = Image.open(png).size
        assert 600 <= width <= 1400 and height <= 2000, (png.name, width, height)
    runs_md = (out / "runs.md").read_text()
    assert "map_fn · numpy-mlp-gradients-cpu-float32 #1" in runs_md and "nan" not in runs_md
    from runner import report, tracking
    from runner.report import frames, plots

    frame = report.frame(tracking.search_runs(f"sqlite:///{tmp}/mlflow.db", EXPERIMENT))
    panels = dict(plots.workloads(frame, frames.PANEL_KEYS))
    assert set(panels) == {"cyclegan inference, batch 1", "mlp gradients, batch 32", "sigmoid inference, batch 32"}
    assert list(plots._panel_labels(panels["sigmoid inference, batch 32"])) == ["model.size=10", "model.size=1000"]
    mlp_labels = list(plots._panel_labels(panels["mlp gradients, batch 32"]))
    assert len(set(mlp_labels)) == 3 and all(label.startswith("mode=") for label in mlp_labels)


def test_worker_output_echoed_without_framework_chatter(tmp_path, capsys):
    from runner.launch.job_log import LogForwarder

    log = tmp_path / "job.log"
    log.write_text(
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
        "I0000 00:00:1795424501.581572    4045 cudart_stub.cc:31] Could not find cuda drivers on your machine.\n"
        "To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow with the "
        "appropriate compiler flags.\n"
        "E0000 00:00:1795424520.260005    4045 cuda_platform.cc:52] failed call to cuInit: UNKNOWN ERROR (303)\n"
        "  timing tensorflow mlp gradients eager: 3 samples\n"
        "Traceback (most recent call last):\n"
        "no newline at the end"
    )
    forwarder = LogForwarder(log)
    forwarder.start()
    forwarder.stop()
    err = capsys.readouterr().err
    timing = "  timing tensorflow mlp gradients eager: 3 samples"
    assert err.splitlines() == [timing, "Traceback (most recent call last):", "no newline at the end"]
    assert "cuInit" in log.read_text()  # kept in job.log


def test_progress_shows_phases_and_time_left_as_plain_lines(capsys):
    from runner.measure.progress import ProgressLine

    with ProgressLine("numpy mlp gradients eager", max_time_s=10.0, after_s=0.0) as progress:
        progress.phase("first call (tracing, compilation)")
        progress.timer.join()  # the phase has lasted after_s
        progress([1e-3] * 5, 2.0)
    err = capsys.readouterr().err
    assert "  numpy mlp gradients eager: first call (tracing, compilation) (0 s so far)\n" in err
    assert "timing numpy mlp gradients eager: 5 samples in 2.0 s, median 1 ms" in err and "at most 8 s left" in err
