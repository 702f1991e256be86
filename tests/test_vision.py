"""Vision models: one set of weights, torch and tensorflow agree; torchvision fidelity; real inputs; safe loading."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
from helpers import PROGRESS

from runner.config import ConfigError
from runner.measure.job import run_and_record
from runner.record.naming import job_spec

SMALL = ["tracking=none", "data.image_size=64", "batch_size=2"]


def run(make_config, path, *overrides):
    outcome = run_and_record(job_spec(make_config(*SMALL, *overrides)), path)
    assert outcome.status == "FINISHED", outcome.error
    return outcome, h5py.File(path / "tensors.h5", "r")


def _rel_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(a).max())


# TensorFlow against torch on these models is the default set's in test_user_paths.py (alexnet, resnet18 and cyclegan
# on photos and at their smallest sizes, through the job for alexnet and cyclegan) and in the ResNet-18 gradients and
# CycleGAN image tests below; the heavy set runs it here too. JAX against torch: ResNet-18 in the default set (its
# gradients too, below), every model in the heavy set.
@pytest.mark.parametrize(
    ("model", "backend"),
    [
        ("resnet18", "jax"),
        *(
            pytest.param(m, b, marks=pytest.mark.heavy)
            for m in ("alexnet", "resnet18", "cyclegan")
            for b in ("tensorflow", "jax")
            if (m, b) != ("resnet18", "jax")
        ),
    ],
)
def test_torch_and_other_backends_outputs_agree(make_config, tmp_path, model, backend):
    _, t = run(make_config, tmp_path / "torch", f"model={model}", "backend=torch", "task=inference")
    _, f = run(make_config, tmp_path / backend, f"model={model}", f"backend={backend}", "task=inference")
    with t, f:
        np.testing.assert_array_equal(t["inputs/x"][()], f["inputs/x"][()])
        assert t["outputs/y"].shape == f["outputs/y"].shape
        assert _rel_diff(t["outputs/y"][()], f["outputs/y"][()]) < 1e-4


# JAX with the heavy set (CI runs it after the default set): the default set has ResNet-18's outputs on JAX
# (test_torch_and_other_backends_outputs_agree[resnet18-jax]) and its gradients on TensorFlow
@pytest.mark.parametrize("backend", ["tensorflow", pytest.param("jax", marks=pytest.mark.heavy)])
def test_resnet18_gradients_agree_under_torch_names(make_config, tmp_path, backend):
    _, t = run(make_config, tmp_path / "torch", "model=resnet18", "backend=torch", "task=gradients")
    mode = "function" if backend == "jax" else "eager"  # eager JAX compiles each op at its first call: 3x the time
    _, f = run(
        make_config, tmp_path / backend, "model=resnet18", f"backend={backend}", f"mode={mode}", "task=gradients"
    )
    import torchvision

    trainable = dict(torchvision.models.resnet18().named_parameters())
    with t, f:
        assert set(t["gradients"]) == set(f["gradients"]) == set(trainable)
        for name, parameter in trainable.items():
            assert t[f"gradients/{name}"].shape == f[f"gradients/{name}"].shape == tuple(parameter.shape)
            assert _rel_diff(t[f"gradients/{name}"][()], f[f"gradients/{name}"][()]) < 1e-3, name


@pytest.mark.parametrize("model", ["alexnet", "resnet18", "resnet50"])
def test_torch_forward_is_torchvisions_network(model):
    """The ops-level definition computes exactly what torchvision's module computes on the same weights."""
    import torch
    import torchvision

    from runner.backends import torch_backend
    from runner.models.vision import VisionModel

    workload = VisionModel(model, 64)
    weights = {k: torch.from_numpy(v).float() for k, v in workload.init_params(np.random.default_rng(0)).items()}
    x = torch.from_numpy(np.random.default_rng(1).standard_normal((2, 3, 64, 64))).float()
    module = getattr(torchvision.models, model)().eval()
    missing, unexpected = module.load_state_dict(weights, strict=False)
    assert not unexpected and all(name.endswith("num_batches_tracked") for name in missing)
    with torch.no_grad():
        torch.testing.assert_close(workload.forward(torch_backend, weights, x), module(x), rtol=1e-5, atol=1e-5)


def _photo(path, size=(300, 240)):
    from PIL import Image

    pixels = np.random.default_rng(3).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return path


def test_preprocessing_matches_torchvision_transforms(tmp_path):
    from PIL import Image
    from torchvision import transforms

    from runner.measure.data import preprocess

    image = Image.open(_photo(tmp_path / "photo.png")).convert("RGB")
    seed_004 = transforms.Compose(
        [
            transforms.Resize(256),
            transforms.CenterCrop(224),
            transforms.ToTensor(),
            transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
        ]
    )
    np.testing.assert_allclose(preprocess(image, crop=True), seed_004(image).double().numpy(), atol=1e-6)
    cyclegan = transforms.Compose([transforms.Resize(256), transforms.ToTensor()])
    np.testing.assert_allclose(preprocess(image, crop=False), cyclegan(image).double().numpy(), atol=1e-6)


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """A torch hub cache holding a (seeded) resnet18 state dict under torchvision's own file name."""
    import torch
    import torchvision

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch-home"))
    torch.manual_seed(0)
    module = torchvision.models.resnet18().eval()
    checkpoints = tmp_path / "torch-home" / "hub" / "checkpoints"
    checkpoints.mkdir(parents=True)
    torch.save(module.state_dict(), checkpoints / "resnet18-f37072fd.pth")
    return module


@pytest.mark.parametrize(("backend", "tolerance"), [("torch", 1e-5), ("tensorflow", 1e-4)])
def test_pretrained_resnet18_logits_equal_torchvision(make_config, tmp_path, hub_cache, backend, tolerance):
    import torch
    from PIL import Image
    from torchvision import transforms

    photo = _photo(tmp_path / "photo.png")
    outcome, f = run(
        make_config,
        tmp_path / "run",
        "model=resnet18",
        f"backend={backend}",
        "task=inference",
        "model.pretrained=true",
        "data=image",
        f"data.path={photo}",
    )
    seed_004 = transforms.Compose(
        [
            transforms.Resize(256),
            transforms.CenterCrop(224),
            transforms.ToTensor(),
            transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
        ]
    )
    with torch.no_grad():
        expected = hub_cache(seed_004(Image.open(photo).convert("RGB")).unsqueeze(0)).numpy()
    with f:
        logits = f["outputs/y"][()]
    assert logits.shape == (1, 1000)
    assert np.abs(logits - expected).max() <= tolerance * max(1.0, np.abs(expected).max())
    saved = json.loads((tmp_path / "run" / "result.json").read_text())
    from runner.models.vision import imagenet_classes

    top = saved["predictions"][0]
    assert len(top) == 5 and top[0]["label"] == imagenet_classes()[int(expected.argmax())]
    assert top[0]["probability"] >= top[1]["probability"]


def test_pretrained_with_empty_cache_is_one_line(cli, tmp_path):
    result = _cli_with_env(cli, tmp_path, "model=resnet18", "backend=torch", "model.pretrained=true")
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip() and not PROGRESS.match(line)]
    assert len(lines) == 1 and "resnet18-f37072fd.pth" in lines[0] and str(tmp_path / "empty") in lines[0]


def _cli_with_env(cli, tmp_path, *overrides):
    import os
    import subprocess
    import sys

    from runner.config import PROJECT_ROOT

    env = {**os.environ, "TORCH_HOME": str(tmp_path / "empty"), "PYTHONPATH": str(PROJECT_ROOT / "src")}
    return subprocess.run(
        [sys.executable, str(PROJECT_ROOT / "run.py"), *SMALL, f"hydra.run.dir={tmp_path}/run", *overrides],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


class _Payload:
    """Unpickling this would create a file: a checkpoint that runs code."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_checkpoint_that_runs_code_is_refused(make_config, tmp_path):
    import torch

    marker = tmp_path / "code-ran"
    torch.save({"conv1.weight": torch.zeros(1), "evil": _Payload(marker)}, tmp_path / "evil.pth")
    assert not marker.exists()
    with pytest.raises(ConfigError, match="refused to load"):
        from runner.models.weights import read_checkpoint

        read_checkpoint(tmp_path / "evil.pth")
    outcome = run_and_record(
        job_spec(make_config(*SMALL, "model=resnet18", "backend=torch", f"model.weights={tmp_path}/evil.pth")),
        tmp_path / "run",
    )
    assert outcome.status == "FAILED" and "refused to load" in outcome.error
    assert not marker.exists()


def test_weights_file_and_hdf5_weights_give_the_same_model(make_config, tmp_path):
    _, seeded = run(make_config, tmp_path / "seeded", "model=cyclegan", "backend=torch", "task=inference")
    import torch

    from runner.models.vision import VisionModel

    state = VisionModel("cyclegan", 64).init_params(np.random.default_rng(0))
    torch.save({k: torch.from_numpy(v) for k, v in state.items()}, tmp_path / "horse2zebra_0.4.0.pth")
    with h5py.File(tmp_path / "weights.h5", "w") as f:
        for k, v in state.items():
            f[k] = v
    for weights in ("horse2zebra_0.4.0.pth", "weights.h5"):
        _, loaded = run(
            make_config,
            tmp_path / f"run-{weights}",
            "model=cyclegan",
            "backend=torch",
            "task=inference",
            f"model.weights={tmp_path / weights}",
        )
        with loaded:
            np.testing.assert_allclose(loaded["outputs/y"][()], seeded["outputs/y"][()], atol=1e-6)
    seeded.close()


def test_cyclegan_on_an_image_writes_png(make_config, tmp_path):
    from PIL import Image

    photo = _photo(tmp_path / "horse.png", size=(80, 64))
    outcome, f = run(
        make_config,
        tmp_path / "run",
        "model=cyclegan",
        "backend=tensorflow",
        "task=inference",
        "data=image",
        f"data.path={photo}",
    )
    f.close()
    png = tmp_path / "run" / "images" / "000.png"
    assert png.exists()
    assert Image.open(png).size == (320, 256)  # Resize(256) on the short side, as seed 004


def test_tfrecord_and_hdf5_inputs_match_image_files(make_config, tmp_path):
    import tensorflow as tf
    from PIL import Image

    from runner.measure.data import load_inputs
    from runner.models.vision import VisionModel

    photo = _photo(tmp_path / "photo.png")
    with tf.io.TFRecordWriter(str(tmp_path / "images.tfrecord")) as writer:
        example = tf.train.Example(
            features=tf.train.Features(
                feature={
                    "image_raw": tf.train.Feature(bytes_list=tf.train.BytesList(value=[photo.read_bytes()])),
                    "height": tf.train.Feature(int64_list=tf.train.Int64List(value=[240])),
                    "width": tf.train.Feature(int64_list=tf.train.Int64List(value=[300])),
                }
            )
        )
        writer.write(example.SerializeToString())
    with h5py.File(tmp_path / "images.h5", "w") as f:
        f["images"] = np.asarray(Image.open(photo).convert("RGB"))[None]
    workload = VisionModel("resnet18", 224)
    loaded = {}
    for source, path in (
        ("image", photo),
        ("tfrecord", tmp_path / "images.tfrecord"),
        ("hdf5", tmp_path / "images.h5"),
    ):
        cfg = make_config(f"data={source}", f"data.path={path}", "model=resnet18")
        loaded[source] = load_inputs(cfg.data, workload, np.random.default_rng(0), 4)["x"]
    assert loaded["image"].shape == (1, 3, 224, 224)
    np.testing.assert_array_equal(loaded["image"], loaded["tfrecord"])
    np.testing.assert_array_equal(loaded["image"], loaded["hdf5"])


@pytest.mark.parametrize(
    ("backend", "mode"),
    [
        ("torch", "vectorized_map"),
        # TensorFlow's and JAX's on the MLP and the transformer: test_numerics.py, test_transformer.py
        pytest.param("tensorflow", "vectorized_map", marks=pytest.mark.heavy),
        pytest.param("jax", "vectorized_map", marks=pytest.mark.heavy),
    ],
)
def test_per_example_gradients_of_a_convnet(make_config, tmp_path, backend, mode):
    _, batch = run(
        make_config,
        tmp_path / "batch",
        "model=resnet18",
        f"backend={backend}",
        "task=gradients",
        "data.image_size=32",
        "dtype=float64",
    )
    _, per = run(
        make_config,
        tmp_path / "per",
        "model=resnet18",
        f"backend={backend}",
        "task=gradients",
        f"mode={mode}",
        "data.image_size=32",
        "dtype=float64",
    )
    with batch, per:
        for name in ("conv1.weight", "fc.weight", "layer4.1.bn2.bias"):
            assert per[f"gradients/{name}"].shape == (2, *batch[f"gradients/{name}"].shape)
            np.testing.assert_allclose(
                per[f"gradients/{name}"][()].sum(0), batch[f"gradients/{name}"][()], rtol=1e-7, atol=1e-9
            )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model=resnet18", "backend=numpy"], "runs on backend=jax or backend=tensorflow or backend=torch"),
        (["model=cyclegan", "backend=tnp"], "runs on backend=jax or backend=tensorflow or backend=torch"),
        (["model=alexnet", "backend=torch", "task=jacobian"], "task=jacobian"),
    ],
)
def test_vision_combination_rules(make_config, overrides, message):
    from runner.config import check_combination

    with pytest.raises(ConfigError, match=message):
        check_combination(make_config(*overrides))


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
@pytest.mark.parametrize("model", ["alexnet", "resnet50", "resnet101", "cyclegan"])
def test_full_size_agreement(make_config, tmp_path, model, backend):
    size = "data.image_size=256" if model == "cyclegan" else "data.image_size=224"
    _, t = run(make_config, tmp_path / "torch", f"model={model}", "backend=torch", "task=inference", size)
    _, f = run(make_config, tmp_path / backend, f"model={model}", f"backend={backend}", "task=inference", size)
    with t, f:
        assert _rel_diff(t["outputs/y"][()], f["outputs/y"][()]) < 1e-4
