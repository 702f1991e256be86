"""Every backend computes what the seed-003 MLP defines, checked against an independent float64 computation."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml

from runner.measure.job import run_and_record
from runner.record.naming import job_spec

CONF = Path(__file__).parents[1] / "conf"
BACKENDS = sorted(path.stem for path in (CONF / "backend").glob("*.yaml"))
MODES = {path.stem: bool(yaml.safe_load(path.read_text())["per_example"]) for path in (CONF / "mode").glob("*.yaml")}
TASKS = sorted(path.stem for path in (CONF / "task").glob("*.yaml"))
GAPS = yaml.safe_load((Path(__file__).parent / "backend_gaps.yaml").read_text())


def allowed_modes(backend: str) -> list[str]:
    return list(yaml.safe_load((CONF / "backend" / f"{backend}.yaml").read_text())["modes"])


def every_mode() -> list[tuple[str, str, str]]:
    """(backend, mode, task) for every mode each backend's yaml allows: the per-example modes with
    task=gradients, the others with task=jacobian (what the two every-backend tests below run)."""
    return [(b, m, "gradients" if MODES[m] else "jacobian") for b in BACKENDS for m in allowed_modes(b)]


def gaps(kind: str) -> set[tuple[str, str, str]]:
    return {(g["backend"], g["mode"], g["task"]) for g in GAPS.get(kind) or []}


def every_backend(task: str) -> list:
    """The (backend, mode) params for `task`, less backend_gaps.yaml's `cannot`; its `slow` marked slow."""
    return [
        pytest.param(b, m, id=f"{b}-{m}", marks=[pytest.mark.slow] if (b, m, t) in gaps("slow") else [])
        for b, m, t in every_mode()
        if t == task and (b, m, t) not in gaps("cannot")
    ]


def independent_mlp(f: h5py.File):
    """Forward pass and batch gradients of y = relu(x W1^T + b) W2^T, loss = sum((y - t)^2)."""
    x, t = f["inputs/x"][()], f["inputs/labels"][()]
    w1, b, w2 = f["weights/dense.weight"][()], f["weights/dense.bias"][()], f["weights/proj.weight"][()]
    pre = x @ w1.T + b
    h = np.maximum(pre, 0.0)
    y = h @ w2.T
    dy = 2.0 * (y - t)
    dpre = (dy @ w2) * (pre > 0)
    grads = {"dense.weight": dpre.T @ x, "dense.bias": dpre.sum(0), "proj.weight": dy.T @ h}
    return y, grads, (pre > 0)


def run(make_config, tmp_path, *overrides):
    cfg = make_config("tracking=none", "batch_size=8", *overrides)
    outcome = run_and_record(job_spec(cfg), tmp_path)
    assert outcome.status == "FINISHED", outcome.error
    return outcome, h5py.File(tmp_path / "tensors.h5", "r")


@pytest.mark.parametrize("backend", BACKENDS)
def test_float64_gradients_match_independent_computation(make_config, tmp_path, backend):
    outcome, f = run(make_config, tmp_path, f"backend={backend}", "task=gradients", "dtype=float64")
    with f:
        y, grads, _ = independent_mlp(f)
        np.testing.assert_allclose(f["outputs/y"][()], y, rtol=0, atol=1e-9)
        for name, expected in grads.items():
            assert f[f"gradients/{name}"].shape == expected.shape
            np.testing.assert_allclose(f[f"gradients/{name}"][()], expected, rtol=0, atol=1e-9)
        assert dict(f.attrs)["backend"] == backend
    assert outcome.metrics["max_abs_err_vs_reference"] < 1e-9


@pytest.mark.parametrize(("backend", "mode"), every_backend("gradients"))
def test_per_example_gradients_sum_to_batch_gradient(make_config, tmp_path, backend, mode):
    _, f = run(make_config, tmp_path, f"backend={backend}", f"mode={mode}", "task=gradients", "dtype=float64")
    with f:
        _, grads, _ = independent_mlp(f)
        for name, batch_grad in grads.items():
            per_example = f[f"gradients/{name}"][()]
            assert per_example.shape == (8, *batch_grad.shape)
            np.testing.assert_allclose(per_example.sum(0), batch_grad, rtol=0, atol=1e-9)
            assert not np.allclose(per_example[0], per_example[1])  # really per example


@pytest.mark.parametrize(("backend", "mode"), every_backend("jacobian"))
def test_batch_jacobian_is_analytic(make_config, tmp_path, backend, mode):
    _, f = run(make_config, tmp_path, f"backend={backend}", f"mode={mode}", "task=jacobian", "dtype=float64")
    with f:
        _, _, active = independent_mlp(f)
        w1, w2 = f["weights/dense.weight"][()], f["weights/proj.weight"][()]
        expected = np.stack([w2 @ np.diag(mask.astype(float)) @ w1 for mask in active])
        assert f["outputs/jacobian"].shape == (8, 2, 32)
        np.testing.assert_allclose(f["outputs/jacobian"][()], expected, rtol=0, atol=1e-12)


def test_backend_gaps_name_combinations_the_every_backend_tests_would_run():
    """backend_gaps.yaml cannot rot: an entry for a renamed backend, a mode its yaml no longer allows or a
    task the tests do not pair with that mode would silently exclude nothing."""
    assert set(GAPS) == {"cannot", "slow"}, f"backend_gaps.yaml: sections {sorted(GAPS)}, expected cannot and slow"
    seen = []
    for kind in ("cannot", "slow"):
        for entry in GAPS[kind] or []:
            where = f"backend_gaps.yaml {kind}: {entry}"
            assert set(entry) == {"backend", "mode", "task", "why"}, where
            assert entry["backend"] in BACKENDS, f"{where}: no conf/backend/{entry['backend']}.yaml"
            assert entry["mode"] in MODES, f"{where}: no conf/mode/{entry['mode']}.yaml"
            assert entry["task"] in TASKS, f"{where}: no conf/task/{entry['task']}.yaml"
            combination = (entry["backend"], entry["mode"], entry["task"])
            assert combination in every_mode(), f"{where}: not a combination the every-backend tests run"
            assert isinstance(entry["why"], str) and entry["why"].strip() and "\n" not in entry["why"], where
            seen.append(combination)
    assert len(seen) == len(set(seen)), f"backend_gaps.yaml names a combination twice: {sorted(seen)}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_backends_agree_in_float32(make_config, tmp_path, backend):
    """Same seed -> same weights and inputs everywhere; float32 results close to the float64 reference."""
    outcome, f = run(make_config, tmp_path, f"backend={backend}", "task=inference")
    with f:
        assert f["outputs/y"].dtype == np.float32
        reference = np.random.default_rng(0)  # the weights come from the seed, not from the backend
        w1 = reference.standard_normal((32, 64)) / np.sqrt(32)
        np.testing.assert_allclose(f["weights/dense.weight"][()], w1.T, rtol=1e-6)
    assert outcome.metrics["max_rel_err_vs_reference"] < 1e-5


@pytest.mark.parametrize("backend", BACKENDS)
def test_op_workloads(make_config, tmp_path, backend):
    outcome, f = run(make_config, tmp_path, f"backend={backend}", "model=sigmoid", "model.size=100", "task=inference")
    with f:
        x = f["inputs/x"][()].astype(np.float64)
        np.testing.assert_allclose(f["outputs/y"][()], 1 / (1 + np.exp(-x)), rtol=1e-6)
    outcome, f = run(make_config, tmp_path, f"backend={backend}", "model=matmul", "model.n=64", "task=inference")
    with f:
        x = f["inputs/x"][()].astype(np.float64)
        np.testing.assert_allclose(f["outputs/y"][()], x @ x, rtol=1e-5)
    assert outcome.metrics["gflops_per_s"] > 0


OP_VARIANTS = sorted(p.stem for p in (CONF / "variant").glob("*.yaml") if p.stem.startswith(("convert_", "reshape_")))
COPIES = {  # what the frameworks document; the experiments' grids (the heavy set) time them all
    "reshape_torch_view": 0.0,
    "reshape_numpy_view": 0.0,
    "reshape_torch_transpose_contiguous": 1.0,
    "reshape_numpy_transpose_contiguous": 1.0,
}
SHARES = {"convert_torch_from_numpy": 1.0, "convert_numpy_asarray": 1.0, "convert_torch_tensor": 0.0}


@pytest.mark.parametrize("variant", OP_VARIANTS)
def test_the_conversion_and_reshape_variants_say_whether_they_copy(make_config, tmp_path, variant):
    """The workloads of the tensor_conversion and view_vs_reshape experiments, in-process: every variant runs and
    records whether its output copies (copied) or shares its input's memory (shares_memory)."""
    size = "model.size=64" if variant.startswith("convert_") else "model.n=8"
    fast = ("timing.max_time_s=0.01", "timing.warmup_s=0", "timing.min_repeats=1")
    outcome, f = run(make_config, tmp_path, f"+variant={variant}", size, "task=inference", *fast)
    f.close()
    metric = "shares_memory" if variant.startswith("convert_") else "copied"
    assert outcome.metrics[metric] in (0.0, 1.0)
    if variant in COPIES | SHARES:
        assert outcome.metrics[metric] == (COPIES | SHARES)[variant]


def test_tnp_prefers_float32(make_config, tmp_path):
    """tnp runs with numpy behaviour and prefer_float32=True: float32 stays float32 through the MLP."""
    _, f = run(make_config, tmp_path, "backend=tnp", "task=gradients")
    with f:
        assert f["outputs/y"].dtype == np.float32
        assert f["gradients/dense.weight"].dtype == np.float32


@pytest.mark.parametrize("outputs", [2, 5])  # one backward per output up to 2 outputs, a batched backward beyond
def test_torch_jacobian_both_idioms_exact(make_config, tmp_path, outputs):
    overrides = ("backend=torch", "task=jacobian", "dtype=float64", f"model.out_features={outputs}")
    outcome, f = run(make_config, tmp_path, *overrides)
    with f:
        assert f["outputs/jacobian"].shape == (8, outputs, 32)
    assert outcome.metrics["max_abs_err_vs_reference"] < 1e-12


def test_torch_gradients_use_autograd_not_torch_func(make_config, tmp_path):
    """The timed step is the everyday torch.autograd.grad on leaf tensors: its first call costs
    milliseconds, not the second that loading torch.func's machinery took."""
    torch = pytest.importorskip("torch")
    from runner.backends import torch_backend

    params = torch_backend.trainable({"w": torch.ones(3)})
    assert params["w"].is_leaf and params["w"].requires_grad
    grads = torch_backend.grad(lambda p, x, t: torch.sum(p["w"] * x), None)(params, torch.arange(3.0), None)
    assert torch.equal(grads["w"], torch.arange(3.0))
    outcome, _ = run(make_config, tmp_path, "backend=torch", "task=gradients")
    assert outcome.metrics["first_call_s"] < 0.5
