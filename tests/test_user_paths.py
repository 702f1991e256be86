"""What users type and feed: photos as cameras and editors write them, image sizes a network cannot take,
torchvision checkpoints in a TensorFlow process, both frameworks in one process in either order.

Fresh processes where import order matters (a test process has imported whatever earlier tests did)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from helpers import PROGRESS
from photos import make_broken, make_photos, scene

from runner.config import PROJECT_ROOT, ConfigError

CLASSIFIERS = ("alexnet", "resnet18", "resnet50", "resnet101")
VISION = (*CLASSIFIERS, "cyclegan")
CAPS = ["timing.warmup_s=0", "timing.min_warmup_calls=0", "timing.min_repeats=1", "timing.max_time_s=0.001"]
# TensorFlow's C++ start-up chatter on stderr, which TF_CPP_MIN_LOG_LEVEL does not silence
TF_CHATTER = re.compile(r"^(WARNING: All log messages before absl::InitializeLog|[IWE]\d{4} )")


def fresh_run(*args: str, cwd: Path, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    """`python run.py ARGS` in a new interpreter, as typed in a shell."""
    env = {**os.environ, **(env or {}), "PYTHONPATH": str(PROJECT_ROOT / "src")}
    command = [sys.executable, str(PROJECT_ROOT / "run.py"), *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def stderr_lines(result: subprocess.CompletedProcess) -> list[str]:
    lines = result.stderr.splitlines()
    return [line for line in lines if line.strip() and not TF_CHATTER.match(line) and not PROGRESS.match(line)]


def rel_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(a).max())


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    return make_photos(tmp_path_factory.mktemp("photos"))


# -- photos ------------------------------------------------------------------------------------


def test_photos_load_as_a_viewer_shows_them(photos):
    """Every photo becomes RGB at the size a viewer shows (EXIF applied), then seed 004's tensors."""
    from PIL import Image, ImageOps
    from torchvision import transforms

    from runner.measure.data import open_image, preprocess

    seed_004 = transforms.Compose(
        [
            transforms.Resize(256),
            transforms.CenterCrop(224),
            transforms.ToTensor(),
            transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
        ]
    )
    for name, photo in photos.items():
        image = open_image(photo.path)
        assert image.mode == "RGB" and image.size == photo.seen_size, name
        assert preprocess(image, crop=True).shape == (3, 224, 224)
        width, height = photo.seen_size
        short_side_256 = (256, int(256 * width / height)) if height <= width else (int(256 * height / width), 256)
        assert preprocess(image, crop=False).shape == (3, *short_side_256), name
        if name != "deep_16bit.png":  # torchvision has no 16-bit rule; see the next test
            expected = seed_004(ImageOps.exif_transpose(Image.open(photo.path)).convert("RGB")).double().numpy()
            np.testing.assert_allclose(preprocess(image, crop=True), expected, atol=1e-6, err_msg=name)


def test_exif_rotation_and_sixteen_bits_keep_what_the_file_shows(photos):
    from PIL import Image

    from runner.measure.data import open_image

    stored = np.asarray(Image.open(photos["exif_rotated.jpg"].path))
    shown = np.asarray(open_image(photos["exif_rotated.jpg"].path))
    np.testing.assert_array_equal(shown, np.rot90(stored, k=-1))  # orientation 6: 90 degrees clockwise
    deep = np.asarray(Image.open(photos["deep_16bit.png"].path)).astype(np.float64)
    grey = np.asarray(open_image(photos["deep_16bit.png"].path))[..., 0]
    np.testing.assert_array_equal(grey, np.round(deep / 257))  # 0..65535 -> 0..255
    clipped = np.asarray(Image.open(photos["deep_16bit.png"].path).convert("RGB"))[..., 0]
    assert (clipped == 255).mean() > 0.9 and (grey == 255).mean() < 0.01  # PIL's conversion clips to white


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    return make_broken(tmp_path_factory.mktemp("broken"))


def test_unreadable_images_are_one_line_naming_the_file(make_config, broken):
    from runner.measure.data import load_inputs
    from runner.models.vision import VisionModel

    for path in broken:
        cfg = make_config("data=image", f"data.path={path}", "model=resnet18")
        with pytest.raises(ConfigError) as error:
            load_inputs(cfg.data, VisionModel("resnet18", 224), np.random.default_rng(0), 1)
        message = str(error.value)
        assert str(path) in message and "\n" not in message and message.startswith("cannot read image")


def test_truncated_photo_from_the_shell_is_one_line(broken, tmp_path):
    truncated = next(path for path in broken if path.name == "truncated.jpg")
    result = fresh_run(
        "backend=torch",
        "model=resnet18",
        "data=image",
        f"data.path={truncated}",
        "tracking=none",
        f"hydra.run.dir={tmp_path}/run",
        cwd=tmp_path,
    )
    errors = stderr_lines(result)
    assert result.returncode == 1
    assert len(errors) == 1 and f"cannot read image {truncated}: image file is truncated" in errors[0], result.stderr


def _both_backends(model: str, dtype: str):
    """model's seeded weights in dtype on torch and on TensorFlow, and a forward(x64) on each."""
    import tensorflow as tf
    import torch

    from runner.backends import load_backend
    from runner.models.vision import VisionModel

    torch_ops, tf_ops = (
        load_backend("runner.backends.torch_backend"),
        load_backend("runner.backends.tensorflow_backend"),
    )
    workload = VisionModel(model, 224)
    params = workload.init_params(np.random.default_rng(0))
    on_torch = {k: torch.from_numpy(v).to(getattr(torch, dtype)) for k, v in params.items()}
    on_tf = {k: tf.constant(tf_ops.to_native_layout(v), dtype) for k, v in params.items()}
    del params

    def run(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        with torch.no_grad():
            a = workload.forward(torch_ops, on_torch, torch.from_numpy(x).to(getattr(torch, dtype))).numpy()
        return a, workload.forward(tf_ops, on_tf, tf.constant(x, dtype)).numpy()

    return run


@pytest.mark.parametrize(
    "model",
    [  # CycleGAN on photos: test_vision.py's image test in the default set, here in the heavy set
        "resnet18",
        pytest.param("cyclegan", marks=pytest.mark.heavy),
        *(pytest.param(m, marks=pytest.mark.slow) for m in ("alexnet", "resnet50", "resnet101")),
    ],
)
def test_every_vision_model_agrees_on_every_photo(photos, model):
    """Each photo through seed 004's preprocessing, torch and TensorFlow on the same weights, batch 1.
    Every classifier gets 224 x 224 from every photo, so the default run checks ResNet-18 on all of them
    and the others on one (next test). CycleGAN sees the photos at a short side of 64 here (256 in the slow
    test below): the sizes stay odd (64x85, 64x113, 84x64, ...), which is what its padding has to handle.
    A one-colour image (the 1x1 photo, resized) is refused for CycleGAN (see test_uniform_image_...)."""
    agree_on_photos(model, photos)


def test_uniform_image_for_cyclegan_is_one_line(make_config, photos):
    """Instance norm of a one-colour image is 0/0 (eps aside): torch and TensorFlow return different
    rounding noise. The 1x1 photo, resized to 256 x 256, is such an image; the classifiers take it."""
    from runner.measure.data import load_inputs
    from runner.models.vision import VisionModel

    path = photos["pixel_1x1.png"].path
    cfg = make_config("data=image", f"data.path={path}", "model=cyclegan")
    with pytest.raises(ConfigError, match=f"^{re.escape(str(path))} is one colour: CycleGAN") as error:
        load_inputs(cfg.data, VisionModel("cyclegan", 256), np.random.default_rng(0), 1)
    assert "\n" not in str(error.value)


# ResNet-101 is ResNet-50's blocks, more of them: the heavy set's
@pytest.mark.parametrize("model", ["alexnet", "resnet50", pytest.param("resnet101", marks=pytest.mark.heavy)])
def test_heavier_classifiers_agree_on_a_photo(photos, model):
    agree_on_photos(model, {"landscape_4x3.jpg": photos["landscape_4x3.jpg"]})


def agree_on_photos(model: str, photos: dict) -> None:
    from runner.measure.data import open_image, preprocess

    # CycleGAN in float64: with seeded weights its 9 instance-normed blocks amplify float32 rounding on
    # smooth, low-contrast photos to 1.5e-4 of the largest output (the 16-bit grey one); float64 shows
    # that both backends compute the same function, padding and cropping included.
    dtype, tolerance = ("float64", 1e-9) if model == "cyclegan" else ("float32", 1e-4)
    run = _both_backends(model, dtype)
    for name, photo in photos.items():
        if model == "cyclegan" and name == "pixel_1x1.png":
            continue
        image = open_image(photo.path)
        x = preprocess(image, crop=True) if model in CLASSIFIERS else preprocess(image, crop=False, resize=64)
        torch_out, tf_out = run(x[None])
        expected = (1, 1000) if model in CLASSIFIERS else (1, *x.shape)
        assert torch_out.shape == tf_out.shape == expected, name
        assert np.isfinite(torch_out).all() and rel_diff(torch_out, tf_out) < tolerance, name


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torch", "tensorflow"])
@pytest.mark.parametrize("model", VISION)
def test_every_photo_runs_as_a_run(make_config, photos, tmp_path, model, backend):
    """The real job path, full size, batch 1: every photo with every model on both backends."""
    from runner.measure.job import run_and_record
    from runner.record.naming import job_spec

    for name, photo in photos.items():
        overrides = ["tracking=none", f"model={model}", f"backend={backend}", "task=inference", "batch_size=1"]
        outcome = run_and_record(
            job_spec(make_config(*overrides, "data=image", f"data.path={photo.path}")), tmp_path / name
        )
        if model == "cyclegan" and name == "pixel_1x1.png":
            assert outcome.status == "FAILED" and "is one colour" in outcome.error
        else:
            assert outcome.status == "FINISHED", (name, outcome.error)


# -- image sizes -------------------------------------------------------------------------------

SMALLEST = {"alexnet": 63, "resnet18": 1, "resnet50": 1, "resnet101": 1, "cyclegan": 5}


@pytest.mark.parametrize("model", VISION)
def test_smallest_image_size_is_torchs_own(model):
    """The rule walks the forward pass on shapes; torch itself fails one pixel below it and runs at it."""
    import torch

    from runner.backends import torch_backend
    from runner.models.vision import VisionModel, min_image_size

    assert min_image_size(model) == SMALLEST[model]
    workload = VisionModel(model, SMALLEST[model])
    weights = {k: torch.from_numpy(v).float() for k, v in workload.init_params(np.random.default_rng(0)).items()}
    size = SMALLEST[model]
    with torch.no_grad():
        assert workload.forward(torch_backend, weights, torch.zeros(1, 3, size, size)).shape[0] == 1
        if size > 1:
            with pytest.raises((RuntimeError, ValueError)):
                workload.forward(torch_backend, weights, torch.zeros(1, 3, size - 1, size - 1))
            with pytest.raises(ConfigError, match=f"data.image_size={size - 1} is too small .* {size}x{size}"):
                VisionModel(model, size - 1)


# AlexNet in the default set; ResNet-50 (ResNet-101's bottleneck blocks and smallest size at 3/5 of its weights),
# ResNet-101 and CycleGAN in the heavy set
HEAVIER = ("resnet50", "resnet101", "cyclegan")


@pytest.mark.parametrize("model", ["alexnet", *(pytest.param(m, marks=pytest.mark.heavy) for m in HEAVIER)])
def test_smallest_image_size_runs_and_agrees_on_both_backends(make_config, tmp_path, model):
    from runner.measure.job import run_and_record
    from runner.record.naming import job_spec

    outputs = {}
    for backend in ("torch", "tensorflow"):
        size = f"data.image_size={SMALLEST[model]}"
        cfg = make_config(
            "tracking=none", f"model={model}", f"backend={backend}", size, "batch_size=1", "dtype=float64", *CAPS
        )
        outcome = run_and_record(job_spec(cfg), tmp_path / backend)
        assert outcome.status == "FINISHED", outcome.error
        with h5py.File(tmp_path / backend / "tensors.h5") as f:
            outputs[backend] = f["outputs/y"][()]
    assert rel_diff(outputs["torch"], outputs["tensorflow"]) < 1e-9


def test_too_small_for_alexnet_on_tensorflow_is_refused_before_running(tmp_path):
    """data.image_size=32: TensorFlow's worker used to die of SIGFPE in AlexNet's third max-pool. The size is the
    workload's own setting: preflight builds the workload and refuses it (exit 2) before TensorFlow loads, writing
    nothing (issue 79)."""
    run_dir = tmp_path / "run"
    args = ["backend=tensorflow", "model=alexnet", "data.image_size=32", "tracking=none", f"hydra.run.dir={run_dir}"]
    result = fresh_run(*args, cwd=tmp_path)
    assert result.returncode == 2
    errors = stderr_lines(result)
    assert len(errors) == 1 and "data.image_size=32" in errors[0] and "63x63" in errors[0], result.stderr
    assert not run_dir.exists()


def test_cyclegan_gradients_on_odd_sizes_follow_the_output(make_config, tmp_path):
    """A 30x41 image (as a 4:3 photo, not a multiple of 4): the image out is 30x41 on both backends, and
    the loss's targets are shaped like it."""
    from runner.measure.job import run_and_record
    from runner.record.naming import job_spec

    with h5py.File(tmp_path / "images.h5", "w") as f:
        f["images"] = scene(41, 30)[None].transpose(0, 3, 1, 2) / 255.0
    results = {}
    for backend in ("torch", "tensorflow"):
        cfg = make_config(
            "tracking=none", "model=cyclegan", f"backend={backend}", "task=gradients", "data=hdf5",
            f"data.path={tmp_path / 'images.h5'}", "batch_size=1", "dtype=float64", *CAPS,
        )  # fmt: skip
        outcome = run_and_record(job_spec(cfg), tmp_path / backend)
        assert outcome.status == "FINISHED", outcome.error
        with h5py.File(tmp_path / backend / "tensors.h5") as f:
            assert f["outputs/y"].shape == f["inputs/labels"].shape == (1, 3, 30, 41)
            results[backend] = {k: f[k][()] for k in ("outputs/y", "outputs/loss", "gradients/model.1.weight")}
    for key, value in results["torch"].items():
        assert rel_diff(np.atleast_1d(value), np.atleast_1d(results["tensorflow"][key])) < 1e-9, key


# -- torchvision checkpoints in a TensorFlow process; both frameworks in one process -----------------


@pytest.fixture(scope="module")
def user_files(tmp_path_factory):
    """dog.jpg (400x300) and a torch hub cache holding a seeded resnet18 under torchvision's file name."""
    import torch
    import torchvision

    folder = tmp_path_factory.mktemp("user")
    from PIL import Image

    Image.fromarray(scene(400, 300, 12)).save(folder / "dog.jpg", quality=90)
    checkpoints = folder / "torch-home" / "hub" / "checkpoints"
    checkpoints.mkdir(parents=True)
    torch.manual_seed(0)
    torch.save(torchvision.models.resnet18().eval().state_dict(), checkpoints / "resnet18-f37072fd.pth")
    return folder


def test_pretrained_files_are_torchvisions():
    import torchvision

    from runner.models.weights import PRETRAINED_FILES

    for model, file in PRETRAINED_FILES.items():
        assert Path(torchvision.models.get_model_weights(model).DEFAULT.url).name == file


def test_tensorflow_reads_a_torchvision_checkpoint_without_torch(user_files, tmp_path):
    """A fresh process runs the pretrained TensorFlow job (TensorFlow imported first, as in its worker):
    it loads torchvision's .pth and finishes, and torch never enters the process."""
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from hydra import compose, initialize_config_dir\n"
        "from runner.config import PROJECT_ROOT\n"
        "from runner.measure.job import run_and_record\n"
        "from runner.record.naming import job_spec\n"
        "overrides = sys.argv[2:]\n"
        "with initialize_config_dir(config_dir=str(PROJECT_ROOT / 'conf'), version_base='1.3'):\n"
        "    cfg = compose(config_name='config', overrides=overrides)\n"
        "outcome = run_and_record(job_spec(cfg), Path(sys.argv[1]))\n"
        "assert outcome.status == 'FINISHED', outcome.error\n"
        "assert 'tensorflow' in sys.modules and 'torch' not in sys.modules, 'torch was imported'\n"
    )
    overrides = ["backend=tensorflow", "model=resnet18", "model.pretrained=true", "data=image", "data.path=dog.jpg"]
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT / "src"), "TORCH_HOME": str(user_files / "torch-home")}
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "run"), *overrides, "task=inference", "tracking=none", *CAPS],
        cwd=user_files,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    with h5py.File(tmp_path / "run" / "tensors.h5") as f:
        assert f["outputs/y"].shape == (1, 1000)


@pytest.mark.parametrize(
    "order",
    ["tensorflow,torch", pytest.param("torch,tensorflow", marks=pytest.mark.heavy)],  # the crash: TF first
)
def test_both_frameworks_in_one_process_in_either_order(user_files, tmp_path, order):
    """isolation=inline runs both jobs in one fresh process; the pretrained TensorFlow job once crashed
    there (SIGSEGV, exit 139) because reading the .pth imported torch after TensorFlow."""
    result = fresh_run(
        "-m", f"backend={order}", "isolation=inline", "model=resnet18", "model.pretrained=true", "data=image",
        "data.path=dog.jpg", "task=inference", "tracking=none", f"hydra.sweep.dir={tmp_path}/sweep", *CAPS,
        cwd=user_files, env={"TORCH_HOME": str(user_files / "torch-home")},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    logits = {}
    for job, backend in enumerate(order.split(",")):
        saved = json.loads((tmp_path / "sweep" / str(job) / "result.json").read_text())
        assert saved["status"] == "FINISHED" and saved["config"]["backend"]["name"] == backend
        assert saved["config"]["isolation"] == "inline" and not (tmp_path / "sweep" / str(job) / "job.log").exists()
        with h5py.File(tmp_path / "sweep" / str(job) / "tensors.h5") as f:
            logits[backend] = f["outputs/y"][()]
    assert rel_diff(logits["torch"], logits["tensorflow"]) < 1e-4


def test_a_legacy_checkpoint_equals_torch_load(tmp_path):
    """torch's pre-1.6 format (horse2zebra_0.4.0.pth is one) and the zip format, read without torch."""
    import torch

    from runner.models.weights import read_state_dict

    base = torch.arange(24.0).reshape(4, 6)
    tensors = {
        "transposed": base.t(),
        "slice": base[1:3, 2:5],
        "half": base.half(),
        "bfloat16": base.bfloat16() * 1.5,
        "parameter": torch.nn.Parameter(torch.ones(3)),
        "scalar": torch.tensor(5),
        "empty": torch.zeros(0, 3),
    }
    for zip_format in (True, False):
        torch.save(tensors, tmp_path / "t.pth", _use_new_zipfile_serialization=zip_format)
        ours, expected = read_state_dict(tmp_path / "t.pth"), torch.load(tmp_path / "t.pth", weights_only=True)
        assert list(ours) == list(expected)
        for name, tensor in expected.items():
            reference = tensor.detach().float() if tensor.dtype == torch.bfloat16 else tensor.detach()
            assert ours[name].dtype == reference.numpy().dtype, name
            np.testing.assert_array_equal(ours[name], reference.numpy(), err_msg=name)


class _Payload:
    """Unpickling this would create a file: a checkpoint that runs code."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("zip_format", [True, False])
def test_checkpoints_that_are_not_plain_tensors_are_one_line(tmp_path, zip_format):
    import torch

    from runner.models.weights import read_checkpoint

    marker = tmp_path / "code-ran"
    torch.save(
        {"w": torch.zeros(1), "evil": _Payload(marker)},
        tmp_path / "evil.pth",
        _use_new_zipfile_serialization=zip_format,
    )
    with pytest.raises(ConfigError, match=r"refused to load .*evil.pth: .*global io.open is not allowed") as error:
        read_checkpoint(tmp_path / "evil.pth")
    assert not marker.exists() and "weights_only" not in str(error.value)
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), tmp_path / "scripted.pt")
    with pytest.raises(ConfigError, match="refused to load .*TorchScript"):
        read_checkpoint(tmp_path / "scripted.pt")
    torch.save({"w": torch.ones(1000)}, tmp_path / "whole.pth", _use_new_zipfile_serialization=zip_format)
    (tmp_path / "cut.pth").write_bytes((tmp_path / "whole.pth").read_bytes()[:2000])
    with pytest.raises(ConfigError, match=r"cannot read weights file .*cut.pth") as error:
        read_checkpoint(tmp_path / "cut.pth")
    assert "\n" not in str(error.value)


def test_a_fifo_is_never_read_as_an_image(tmp_path):
    """A FIFO named like a photo, alone or in a folder, is one line, not a read that blocks forever."""
    import os

    from runner.measure.data import image_files

    fifo = tmp_path / "pipe.jpg"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="is not a regular file or a folder"):
        image_files(fifo)
    assert image_files(tmp_path) == []
