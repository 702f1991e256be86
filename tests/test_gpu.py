"""CUDA paths, run only where a GPU is present (`pytest -m gpu`; scripts/gpu-check.sh runs them on a bare GPU
machine). Collected everywhere; without CUDA every test skips with its reason, as does each TensorFlow or JAX
case where that framework is absent or sees no GPU (checked in a fresh process: both take GPU memory at start).

Sweeps (one process, many jobs) stand in for single runs where several configurations are checked alike. The set
takes ~10 minutes one test after another on an H100 (2026-11-27), so scripts/gpu-check.sh runs it in pytest-xdist
workers where the machine has it: the tests that share a module's fixture are one xdist_group (one worker runs them),
and the out-of-memory case (gpu_alone) runs after the others, alone. The slowest test comes first."""

from __future__ import annotations

import functools
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest
from helpers import run_cli

from runner.config import PROJECT_ROOT
from runner.precision import MIXED, REL_TOLERANCE, reference_tolerance

pytestmark = pytest.mark.gpu

BRING_ALONG = "../shared/gpu/README.md: too large to bring to the GPU machine"
ABSENT = {  # why a framework's cases skip where it is not installed
    "tensorflow": f"TensorFlow is not installed here ({BRING_ALONG}, ~600 MB with its CUDA libraries)",
    "jax": "JAX is not installed here",
}
GPU_PROBE = {  # how many GPUs the framework sees, printed by a fresh process
    "tensorflow": "import tensorflow as tf; print(len(tf.config.list_physical_devices('GPU')))",
    "jax": "import jax; print(len(jax.devices('gpu')))",
}
REPORTED = {  # the framework's own word on its float32 matmul precision: (key, under full, under tf32)
    "torch": ("torch_float32_matmul_precision", "highest", "high"),
    "tensorflow": ("tf_tensor_float_32_execution", False, True),
    "jax": ("jax_default_matmul_precision", "highest", "tensorfloat32"),
}
POLICIES = {  # the policies each backend runs (conf/precision/*.yaml supports:); fp16_mixed is refused on JAX
    "torch": ("full", "default", "tf32", "bf16_mixed", "fp16_mixed"),
    "tensorflow": ("full", "default", "tf32", "bf16_mixed", "fp16_mixed"),
    "jax": ("full", "default", "tf32", "bf16_mixed"),
}
LOSS_SCALER = {"torch": "torch.amp.GradScaler", "tensorflow": "LossScaleOptimizer"}


@pytest.fixture(autouse=True, scope="module")
def _needs_cuda():
    """Module-scoped, so that it runs before the module's sweeps: without CUDA none of them starts."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device (torch.cuda.is_available() is False)")


@functools.cache
def no_gpu_reason(backend: str) -> str | None:
    """None where `backend`'s framework sees a GPU; else why not, in one line."""
    if backend == "torch":
        return None
    if importlib.util.find_spec(backend) is None:
        return ABSENT[backend]
    done = subprocess.run([sys.executable, "-c", GPU_PROBE[backend]], capture_output=True, text=True, timeout=180)
    lines = done.stdout.strip().splitlines()
    if done.returncode == 0 and lines and lines[-1].isdigit() and int(lines[-1]) > 0:
        return None
    why = (done.stderr.strip().splitlines() or ["it lists no GPU"])[-1]
    return f"{backend} sees no GPU here: {why[:300]}"


def needs_gpu(backend: str) -> None:
    reason = no_gpu_reason(backend)
    if reason:
        pytest.skip(reason)


def _run(cli, tmp_path, *overrides):
    result = cli("tracking=none", f"hydra.run.dir={tmp_path}", "timing.max_time_s=1", *overrides)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((tmp_path / "result.json").read_text()), h5py.File(tmp_path / "tensors.h5", "r")


def sweep(folder: Path, *overrides: str, timeout: int = 600) -> tuple[subprocess.CompletedProcess, dict[str, dict]]:
    """`run.py -m` untracked into `folder`, jobs measured one after the other: (the process, result.json by job)."""
    done = run_cli(
        "-m",
        "tracking=none",
        f"hydra.sweep.dir={folder}",
        "timing.rounds=1",
        "timing.processes=1",
        "timing.max_time_s=0.3",
        *overrides,
        timeout=timeout,
    )
    jobs = {p.parent.name: json.loads(p.read_text()) for p in sorted(folder.glob("*/result.json"))}
    return done, jobs


def job_where(swept: tuple[subprocess.CompletedProcess, dict[str, dict]], **choices: str) -> dict:
    """The FINISHED job of a sweep whose config picked these choices (precision="tf32", optimizer="adam" ...)."""
    done, jobs = swept
    for saved in jobs.values():
        config = saved["config"]
        if all(str(config[key]["name"] if isinstance(config[key], dict) else config[key]) == value
               for key, value in choices.items()):  # fmt: skip
            assert saved["status"] == "FINISHED", saved.get("error")
            return saved
    raise AssertionError(f"no job with {choices} in the sweep (exit {done.returncode}): {done.stderr[-3000:]}")


# -- the everyday paths: float64 against the reference, device=auto, per-example modes, load_s ---------------------


def test_cuda_graphs_output_read_before_it_is_overwritten(cli, tmp_path, monkeypatch):
    """max-autotune replays CUDA graphs into the same buffers: the first call's output is copied off the
    device before the next call, so the run finishes (it failed with 'accessing tensor output of CUDAGraphs
    that has been overwritten by a subsequent run'). Autotuning among aten's kernels only: with Triton's templates
    too, resnet18's compilation did not end within scripts/gpu-check.sh's pytest step on an H100; the CUDA graphs are
    max-autotune's either way. First in the module, so that a worker starts it at once."""
    monkeypatch.setenv("TORCHINDUCTOR_MAX_AUTOTUNE_GEMM_BACKENDS", "ATEN")
    monkeypatch.setenv("TORCHINDUCTOR_MAX_AUTOTUNE_CONV_BACKENDS", "ATEN")
    overrides = ("model=resnet18", "mode=xla", "dtype=bfloat16", "task=inference", "data.image_size=64")
    saved, f = _run(cli, tmp_path, "backend=torch", "device=cuda", *overrides, "batch_size=4")
    with f:
        assert np.isfinite(f["outputs/y"][()]).all()
    assert len(saved["predictions"]) == 4


def test_cuda_gradients_float64_match_numpy_reference(cli, tmp_path):
    saved, f = _run(cli, tmp_path, "backend=torch", "device=cuda", "task=gradients", "dtype=float64")
    with f:
        assert f.attrs["device"] == "cuda"
    assert saved["metrics"]["max_abs_err_vs_reference"] < 1e-9
    assert saved["metrics"]["peak_device_mb"] > 0
    assert "NVIDIA" in saved["environment"]["device_name"]


def test_auto_device_picks_cuda(cli, tmp_path):
    saved, f = _run(cli, tmp_path, "backend=torch", "device=auto", "model=matmul", "model.n=512", "task=inference")
    f.close()
    assert saved["environment"]["device"] == "cuda"
    assert saved["metrics"]["max_rel_err_vs_reference"] < 1e-5  # TF32 is off


@pytest.mark.parametrize("mode", ["vectorized_map", "map_fn"])
def test_cuda_per_example_gradients(cli, tmp_path, mode):
    saved, f = _run(cli, tmp_path, "backend=torch", "device=cuda", f"mode={mode}", "dtype=float64", "batch_size=16")
    with f:
        assert f["gradients/dense.weight"].shape == (16, 64, 32)
    assert saved["metrics"]["max_abs_err_vs_reference"] < 1e-9


def test_cuda_context_start_is_in_load_s_not_the_first_call(cli, tmp_path):
    saved, f = _run(cli, tmp_path, "backend=torch", "device=cuda", "task=inference")
    f.close()
    assert saved["metrics"]["load_s"] > 0
    assert saved["metrics"]["first_call_s"] < saved["metrics"]["load_s"] + 1.0


# -- timing, energy and NVML, on one 4096^3 matmul -----------------------------------------------------------------


@pytest.fixture(scope="module")
def matmul_4096(tmp_path_factory):
    """One run of a 4096^3 float32 matmul for 2 s (NVML's energy counter advances every ~100 ms)."""
    folder = tmp_path_factory.mktemp("matmul_4096")
    done = run_cli(
        "tracking=none",
        f"hydra.run.dir={folder}",
        "backend=torch",
        "device=cuda",
        "model=matmul",
        "model.n=4096",
        "task=inference",
        "timing.max_time_s=2",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((folder / "result.json").read_text())


@pytest.mark.xdist_group("matmul_4096")
def test_cuda_timing_waits_for_the_gpu(matmul_4096):
    """A 4096^3 float32 matmul cannot run faster than the H100/H200's ~60 TFLOP/s without TF32:
    a time that ignores queued kernels would report an impossible rate."""
    assert 1_000 < matmul_4096["metrics"]["gflops_per_s"] < 80_000
    assert np.isfinite(matmul_4096["metrics"]["time_iqr_s"])


@pytest.mark.xdist_group("matmul_4096")
def test_cuda_energy_per_call_from_nvml(matmul_4096):
    """With nvidia-ml-py (the GPU machine has it) a Volta or newer GPU reports its energy: it must be there;
    without it the record says why."""
    metrics, environment = matmul_4096["metrics"], matmul_4096["environment"]
    if importlib.util.find_spec("pynvml") is None:
        assert "nvidia-ml-py is not installed" in environment["energy_unavailable_reason"]
        pytest.skip("nvidia-ml-py is not installed here: checked that the record says so")
    assert "NVML" in environment.get("energy_source", ""), environment.get("energy_unavailable_reason")
    assert metrics["examples_per_j"] > 0
    # 2 n^3 FLOP a call at between 1 GFLOP and 1 TFLOP a joule (an H100 does ~0.1 TFLOP/J in float32): outside
    # that, the counter was read wrong or the calls were not counted
    assert 2 * 4096**3 / 1e12 < metrics["energy_per_call_j"] < 2 * 4096**3 / 1e9
    assert metrics["energy_per_call_j"] / metrics["time_median_s"] < 1.1 * environment["gpu_power_limit_w"]


@pytest.mark.xdist_group("matmul_4096")
def test_cuda_nvml_clocks_temperature_and_throttle_reasons(matmul_4096):
    if importlib.util.find_spec("pynvml") is None:
        pytest.skip("nvidia-ml-py is not installed here (the record then says why: tests/test_machine_state.py)")
    environment = matmul_4096["environment"]
    assert "gpu_state_unavailable_reason" not in environment, environment["gpu_state_unavailable_reason"]
    assert environment["gpu_sm_clock_mhz"] > 0 and environment["gpu_mem_clock_mhz"] > 0
    assert 5 < environment["gpu_temperature_c"] < 110
    assert isinstance(environment["gpu_throttle_reasons"], int)
    assert environment["gpu_throttle_reason_names"]  # 'none' or the reasons' names


# -- precision policies and the training step, on each backend that has them -----------------------------------


@pytest.fixture(scope="module")
def policy_sweeps(tmp_path_factory):
    """Per backend, once: the MLP's training step under every policy it runs, with sgd and with adam."""
    swept: dict[str, tuple] = {}

    def of(backend: str):
        needs_gpu(backend)
        if backend not in swept:
            folder = tmp_path_factory.mktemp(f"policies_{backend}")
            swept[backend] = sweep(
                folder,
                f"backend={backend}",
                "device=cuda",
                "model=mlp",
                "task=train_step",
                f"precision={','.join(POLICIES[backend])}",
                "optimizer=sgd,adam",
            )
        return swept[backend]

    return of


def on_policy_sweep(backend: str, *values: str):
    """A case reading policy_sweeps(backend): one xdist_group per backend, so that each backend's sweep is made
    once, and the backends' sweeps (~90 s each on an H100) in different workers."""
    return pytest.param(backend, *values, marks=pytest.mark.xdist_group(f"policy_sweeps_{backend}"))


POLICY_CASES = [on_policy_sweep(b, p) for b in POLICIES for p in POLICIES[b] if p != "full"]


@pytest.mark.parametrize(("backend", "precision"), POLICY_CASES, ids=lambda value: value)
def test_cuda_policy_trains_within_its_tolerance_and_says_what_it_ran(policy_sweeps, backend, precision):
    """Ten adam steps under the policy: within the tolerance of the dtype it computes in, the record naming the
    policy and the matmul precision the framework reports; the mixed policies measurably less exact than float32
    (the low-precision compute ran), fp16_mixed with its loss scaler."""
    saved = job_where(policy_sweeps(backend), precision=precision, optimizer="adam")
    metrics, environment = saved["metrics"], saved["environment"]
    assert environment["precision"] == precision and environment["precision_policy"]
    key, _, under_tf32 = REPORTED[backend]
    assert key in environment
    if precision == "tf32":
        assert environment[key] == under_tf32
    assert metrics["reference_tolerance"] == reference_tolerance("float32", precision, "cuda")
    assert metrics["within_reference_tolerance"] == 1.0, metrics["max_rel_err_vs_reference"]
    if precision in MIXED:
        assert metrics["max_rel_err_vs_reference"] > REL_TOLERANCE["float32"]
    if precision == "fp16_mixed":
        assert LOSS_SCALER[backend] in environment["precision_policy"]


@pytest.mark.parametrize(
    ("backend", "optimizer"), [on_policy_sweep(b, o) for b in POLICIES for o in ("sgd", "adam")], ids=lambda v: v
)
def test_cuda_train_step_agrees_with_float64_reference(policy_sweeps, backend, optimizer):
    """precision=full: ten steps of the optimizer in float32 on the GPU land on the float64 NumPy steps."""
    saved = job_where(policy_sweeps(backend), precision="full", optimizer=optimizer)
    assert saved["environment"][REPORTED[backend][0]] == REPORTED[backend][1]
    assert saved["metrics"]["max_rel_err_vs_reference"] < REL_TOLERANCE["float32"]


@pytest.mark.parametrize("backend", list(POLICIES))
def test_cuda_tf32_rounds_float32_matmuls(tmp_path, backend):
    """A 1024^3 float32 matmul: exact to float32 under full, TF32's 10-bit mantissa showing under tf32 (the
    switch reaches the GPU's kernels, not only the framework's flag)."""
    needs_gpu(backend)
    overrides = ("device=cuda", "model=matmul", "model.n=1024", "task=inference", "precision=full,tf32")
    swept = sweep(tmp_path, f"backend={backend}", *overrides)
    full, tf32 = job_where(swept, precision="full"), job_where(swept, precision="tf32")
    assert full["metrics"]["max_rel_err_vs_reference"] < REL_TOLERANCE["float32"]
    assert REL_TOLERANCE["float32"] < tf32["metrics"]["max_rel_err_vs_reference"] < REL_TOLERANCE["tfloat32"]


# -- the transformer and the generation task: the attention kernel that ran, recorded ---------------------------


@pytest.fixture(scope="module")
def transformer_sweep(tmp_path_factory):
    folder = tmp_path_factory.mktemp("transformer")
    overrides = ("backend=torch", "device=cuda", "model=transformer", "task=inference,gradients")
    return sweep(folder, *overrides, "precision=full,bf16_mixed")


@pytest.mark.xdist_group("transformer_sweep")
@pytest.mark.parametrize("precision", ["full", "bf16_mixed"])
@pytest.mark.parametrize("task", ["inference", "gradients"])
def test_cuda_transformer_records_the_attention_kernel_that_ran(transformer_sweep, task, precision):
    """The kernel scaled_dot_product_attention's dispatcher picks for the query it gets: float32 under full,
    bfloat16 under bf16_mixed (torch.autocast hands attention bfloat16 projections), where flash attention
    qualifies and float32 does not."""
    import torch

    from runner.backends import AttentionCall, torch_backend

    saved = job_where(transformer_sweep, task=task, precision=precision)
    model = saved["config"]["model"]
    compute = torch.bfloat16 if precision == "bf16_mixed" else torch.float32
    batch, seq, heads = saved["config"]["batch_size"], model["seq_len"], model["heads"]
    x = torch.empty((batch, seq, model["d_model"]), dtype=compute, device="cuda")
    shape = (batch, heads, seq, model["d_model"] // heads)
    call = AttentionCall(shape, seq, causal=model["causal"], differentiated=task != "inference")
    ran = torch_backend.attention_kernel(x, call)
    assert saved["environment"]["attention_kernel"] == ran
    assert saved["metrics"]["within_reference_tolerance"] == 1.0, saved["metrics"]["max_rel_err_vs_reference"]


def test_cuda_generation_records_its_attention_kernel(cli, tmp_path):
    """The prefill's and the decode step's attention over the cache, with its mask (flash attention takes none)."""
    saved, f = _run(cli, tmp_path, "backend=torch", "device=cuda", "model=gpt2", "task=generate", "dtype=bfloat16")
    f.close()
    kernel = saved["environment"]["attention_kernel"]  # one kernel, or the prefill's and the decode step's
    assert kernel.startswith(("scaled_dot_product_attention: ", "prefill: scaled_dot_product_attention: ")), kernel


# -- JAX and TensorFlow on cuda --------------------------------------------------------------------------------


def test_jax_on_cuda_eager_jit_and_xla(tmp_path):
    needs_gpu("jax")
    done, jobs = sweep(tmp_path, "backend=jax", "device=cuda", "task=gradients", "mode=eager,function,xla")
    assert sorted(saved["config"]["mode"]["name"] for saved in jobs.values()) == ["eager", "function", "xla"]
    for saved in jobs.values():
        assert saved["status"] == "FINISHED", saved.get("error")
        assert saved["environment"]["device"] == "cuda" and saved["environment"]["device_name"]
        assert saved["metrics"]["max_rel_err_vs_reference"] < 1e-4


def test_tensorflow_on_cuda_where_it_sees_the_gpu(cli, tmp_path):
    needs_gpu("tensorflow")
    saved, f = _run(cli, tmp_path, "backend=tensorflow", "device=cuda", "mode=function", "task=gradients")
    f.close()
    assert saved["metrics"]["max_rel_err_vs_reference"] < 1e-4 and saved["metrics"]["load_s"] > 0


# -- sweeps on the GPU: interleaved rounds with their intervals ----------------------------------------------------


def test_cuda_sweep_in_interleaved_rounds_with_intervals(tmp_path):
    """float32 (TF32 off) and bfloat16 matmuls take turns in 4 rounds: the samples keep their rounds, bfloat16's
    tensor cores come out fastest and float32's interval lies wholly above 1."""
    done = run_cli(
        "-m",
        "tracking=none",
        f"hydra.sweep.dir={tmp_path}",
        "backend=torch",
        "device=cuda",
        "model=matmul",
        "model.n=4096",
        "task=inference",
        "dtype=float32,bfloat16",
        "timing.rounds=4",
        "timing.processes=2",
        "timing.max_time_s=1",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for job in ("0", "1"):
        saved = json.loads((tmp_path / job / "result.json").read_text())
        assert saved["metrics"]["n_rounds"] == 4
        with h5py.File(tmp_path / job / "tensors.h5") as f:
            assert sorted(set(f["timings/sample_round"][()])) == [1, 2, 3, 4]
    rows = pd.read_csv(tmp_path / "report" / "runs.csv").set_index("dtype")
    assert rows.loc["bfloat16", "time_ratio"] == pytest.approx(1.0)  # the fastest
    float32 = rows.loc["float32"]
    said = f"{float32['within_noise']}; bfloat16: {rows.loc['bfloat16', 'within_noise']}"
    assert 1 < float32["time_ratio_ci_low"] <= float32["time_ratio"] <= float32["time_ratio_ci_high"], said


@pytest.mark.parametrize("backend", ["jax", "tensorflow"])
def test_cuda_rounds_of_a_framework_that_reserves_gpu_memory(tmp_path, backend):
    """JAX takes 75% of the GPU's memory when it starts, TensorFlow all of it; in interleaved rounds (a sweep's
    default) every job's workers are alive at once: two jobs, two processes each, here."""
    needs_gpu(backend)
    done = run_cli(
        "-m",
        "tracking=none",
        f"hydra.sweep.dir={tmp_path}",
        f"backend={backend}",
        "device=cuda",
        "task=gradients",
        "mode=eager,function",
        "timing.rounds=4",
        "timing.processes=2",
        "timing.max_time_s=1",
    )
    jobs = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("*/result.json"))]
    errors = [saved.get("error") for saved in jobs] or done.stderr[-3000:]
    assert [saved["status"] for saved in jobs] == ["FINISHED", "FINISHED"], errors
    assert all(saved["metrics"]["n_rounds"] == 4 for saved in jobs)


# -- parity on cuda -----------------------------------------------------------------------------------------------


def test_cuda_parity_benchmark_writes_rows_with_the_gpu_name(tmp_path):
    """Two rows (scripts/gpu-check.sh runs them all): the runner's call against a hand-written loop on the GPU."""
    out = tmp_path / "BENCHMARKS.md"
    command = [sys.executable, str(PROJECT_ROOT / "benchmarks" / "parity.py"), "--device", "cuda"]
    command += ["--backends", "torch", "--rows", "matmul,mlp_inference", "--budget", "0.2", "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in out.read_text().splitlines() if line.startswith("| torch | cuda (")]
    assert [row.split(" | ")[2] for row in rows] == ["matmul", "mlp_inference"]
    assert all("NVIDIA" in row or "H100" in row or "H200" in row for row in rows)


# -- generation on cuda ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("backend", "mode"), [("torch", "eager"), ("jax", "function"), ("tensorflow", "function")])
def test_cuda_generation_agrees_token_for_token(cli, tmp_path, backend, mode):
    """model=gpt2 task=generate on the GPU: every step's logits against float64 NumPy, the tokens where decided, each
    token timed after it reached the host (the clock after the device's work, not after its launch)."""
    needs_gpu(backend)
    saved, f = _run(cli, tmp_path, f"backend={backend}", "device=cuda", f"mode={mode}", "model=gpt2", "task=generate")
    f.close()
    m = saved["metrics"]
    assert m["within_reference_tolerance"] == 1.0 and m["tokens_differ"] == 0
    assert m["tpot_p50_s"] > 0 and m["ttft_s"] > 0
    assert saved["environment"]["device"] == "cuda"


# -- the slowest last (torch.compile, max-autotune, out of memory): a check stopped at its limit loses these -------


def test_cuda_torch_compile(cli, tmp_path):
    saved, f = _run(cli, tmp_path, "backend=torch", "device=cuda", "mode=function", "task=gradients")
    f.close()
    assert saved["metrics"]["first_call_s"] > saved["metrics"]["time_median_s"]  # compilation is in the first call
    assert saved["metrics"]["max_rel_err_vs_reference"] < 1e-4


def test_cuda_train_step_moves_the_weights_compiled(cli, tmp_path):
    saved, f = _run(cli, tmp_path, "backend=torch", "device=cuda", "task=train_step", "optimizer=adam", "mode=function")
    with f:
        trained, initial = f["trained/dense.weight"][()], f["weights/dense.weight"][()]
    assert np.abs(trained - initial).max() > 1e-4
    assert saved["metrics"]["max_rel_err_vs_reference"] < REL_TOLERANCE["float32"]


@pytest.mark.parametrize("mode", ["eager", "function", "xla", "vectorized_map", "map_fn"])
def test_cuda_every_mode_gradients(cli, tmp_path, mode):
    saved, f = _run(cli, tmp_path, "backend=torch", "device=cuda", f"mode={mode}", "batch_size=16")
    f.close()
    assert saved["metrics"]["max_rel_err_vs_reference"] < 1e-4
    assert saved["metrics"]["load_s"] > 0


def test_cuda_generation_with_cuda_graphs(cli, tmp_path):
    """torch.compile's reduce-overhead mode (CUDA graphs) for the decode step, the cache at a static address: each
    step's logits and token are read before the next replay overwrites them."""
    saved, f = _run(cli, tmp_path, "backend=torch", "device=cuda", "mode=function", "model=gpt2", "task=generate")
    f.close()
    m = saved["metrics"]
    assert m["within_reference_tolerance"] == 1.0 and m["tokens_differ"] == 0
    assert m["cache_vs_recompute_max_rel_err"] < REL_TOLERANCE["float32"]


@pytest.mark.gpu_alone  # it fills the GPU's memory: scripts/gpu-check.sh runs it after the others
def test_cuda_out_of_memory_fails_the_job_and_the_sweep_goes_on(cli, tmp_path):
    """resnet50 gradients at batch 4096 keep ~100 GB of activations: past the preflight (which counts
    weights and inputs), torch's own out-of-memory error ends the job."""
    result = cli(
        "-m",
        "tracking=none",
        f"hydra.sweep.dir={tmp_path}",
        "timing.max_time_s=1",
        "backend=torch",
        "device=cuda",
        "model=resnet50",
        "task=gradients",
        "batch_size=4096,2",
        timeout=900,
    )
    assert result.returncode == 1
    first = json.loads((tmp_path / "0" / "result.json").read_text())
    second = json.loads((tmp_path / "1" / "result.json").read_text())
    assert first["status"] == "FAILED" and "out of memory" in first["error"].lower()
    assert second["status"] == "FINISHED"
    assert "out of memory" in result.stdout.lower()  # the sweep's table says which job failed and why


def test_cuda_jacobian_of_two_outputs_takes_the_batched_backward_and_matches_the_reference(monkeypatch):
    """On a GPU an eager step is bound by its kernel launches: the MLP's 2-output jacobian takes one batched backward
    (autograd.functional.jacobian(vectorize=True)'s way), where the CPU takes one backward per output."""
    import torch

    from runner.backends import torch_backend

    batched = []
    grad = torch.autograd.grad

    def recorded(*args, **kwargs):
        batched.append(kwargs.get("is_grads_batched", False))
        return grad(*args, **kwargs)

    monkeypatch.setattr(torch.autograd, "grad", recorded)
    w1, b1, w2 = (torch.randn(*s, dtype=torch.float64, device="cuda") for s in ((32, 64), (64,), (64, 2)))
    jacobian = torch_backend.batch_jacobian(lambda p, x: torch.relu(x @ w1 + b1) @ w2, "eager", None)
    x = torch.randn(8, 32, dtype=torch.float64, device="cuda")
    jac = jacobian({}, x)
    assert batched == [True]
    expected = torch.einsum("bh,ho->boh", (x @ w1 + b1 > 0).double(), w2) @ w1.T  # (batch, out, in)
    torch.testing.assert_close(jac, expected)
