"""model=transformer: the float64 NumPy backprop against torch.autograd, the torch path against
nn.TransformerEncoder with the same weights, every backend x mode x task against the float64 reference,
the presets' sizes and the refusals."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml

from runner.config import ConfigError, compose
from runner.measure.job import run_and_record
from runner.models.transformer import Transformer
from runner.record.naming import job_spec

CONF = Path(__file__).parents[1] / "conf"
BACKENDS = sorted(path.stem for path in (CONF / "backend").glob("*.yaml"))
PER_EXAMPLE = {p.stem for p in (CONF / "mode").glob("*.yaml") if yaml.safe_load(p.read_text())["per_example"]}
SIZES = ["model.layers=2", "model.d_model=16", "model.heads=2", "model.seq_len=8", "model.out_features=3"]
FAST = ["timing.warmup_s=0", "timing.min_warmup_calls=1", "timing.min_repeats=2", "timing.max_time_s=0.05"]


def slow(backend: str, mode: str, task: str) -> bool:
    """What runs only with -m slow, so the default set stays near 5 s a backend: torch.compile (inductor's first
    compile takes tens of seconds on 2 cores), eager JAX (each op compiled at its first call: 4-10 s), and beyond
    one compiled mode per backend (xla, map_fn and eager jacobians on TensorFlow repeat what function covers)."""
    if backend == "torch":
        return mode in ("function", "xla")
    if backend == "jax" and mode == "eager":
        return True
    return backend != "numpy" and (mode in ("xla", "map_fn") or (mode == "eager" and task == "jacobian"))


def heavy(backend: str, mode: str, task: str) -> bool:
    """What CI runs after the default set (-m heavy): the jacobians and the float64 per-example gradients of the
    compiled TensorFlow and JAX modes, 2-4 s each of tracing on 2 cores. The default set keeps each backend's
    inference and gradients here, the jacobians of torch and numpy, and every backend's per-example gradients in
    float32 (test_float32_per_example_gradients_agree_with_the_reference)."""
    return backend in ("tensorflow", "tnp", "jax") and (task == "jacobian" or mode in PER_EXAMPLE)


def small(**changes) -> Transformer:
    sizes = {"layers": 2, "d_model": 16, "heads": 2, "seq_len": 8, "out_features": 3, **changes}
    return Transformer(**sizes)


def seeded(model: Transformer, batch: int = 3):
    rng = np.random.default_rng(0)
    return model.init_params(rng), model.make_inputs(rng, batch)


def run(tmp_path, *overrides):
    cfg = compose([*FAST, "model=transformer", *SIZES, "batch_size=4", "tracking=none", *overrides])
    outcome = run_and_record(job_spec(cfg), tmp_path)
    assert outcome.status == "FINISHED", outcome.error
    return outcome


# -- the float64 backprop is torch.autograd's -----------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
def test_numpy_backprop_is_torch_autograd_in_float64(causal):
    import torch

    from runner.backends import torch_backend

    model = small(causal=causal)
    params, inputs = seeded(model)
    weights = {k: torch.from_numpy(v).requires_grad_() for k, v in params.items()}
    x, labels = torch.from_numpy(inputs["x"]), torch.from_numpy(inputs["labels"])
    loss = model.loss(torch_backend, weights, x, labels)
    expected = dict(zip(weights, torch.autograd.grad(loss, list(weights.values())), strict=True))
    grads = model.gradients(params, inputs["x"], inputs["labels"])
    assert list(grads) == list(model.spec)
    for name, value in grads.items():
        np.testing.assert_allclose(value, expected[name].numpy(), rtol=0, atol=1e-11, err_msg=name)
    single = lambda x: model.forward(torch_backend, weights, x[None])[0]  # noqa: E731
    jac = torch.stack([torch.autograd.functional.jacobian(single, x[b]) for b in range(len(x))])
    np.testing.assert_allclose(model.jacobian(params, inputs["x"]), jac.numpy(), rtol=0, atol=1e-12)


def test_per_example_gradients_sum_to_the_batch_gradient():
    model = small()
    params, inputs = seeded(model)
    per_example = model.per_example_gradients(params, inputs["x"], inputs["labels"])
    for name, batch in model.gradients(params, inputs["x"], inputs["labels"]).items():
        assert per_example[name].shape == (3, *batch.shape)
        np.testing.assert_allclose(per_example[name].sum(0), batch, rtol=0, atol=1e-12)


# -- the torch path is nn.TransformerEncoder(norm_first=True, batch_first=True) ---------------------------------


def nn_transformer(model: Transformer, params: dict, dtype):
    """torch's own modules at the model's sizes, loaded with its weights by their names."""
    import torch

    layer = torch.nn.TransformerEncoderLayer(
        model.d_model, model.heads, model.hidden, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
    )
    norm = torch.nn.LayerNorm(model.d_model)
    encoder = torch.nn.TransformerEncoder(layer, model.layers, norm=norm, enable_nested_tensor=False).to(dtype)
    head = torch.nn.Linear(model.d_model, model.out_features).to(dtype)
    state = {k: torch.from_numpy(v).to(dtype) for k, v in params.items()}
    encoder.load_state_dict({k: v for k, v in state.items() if not k.startswith("head.")})
    head.load_state_dict({"weight": state["head.weight"], "bias": state["head.bias"]})
    mask = torch.nn.Transformer.generate_square_subsequent_mask(model.seq_len, dtype=dtype) if model.causal else None

    def forward(x):
        return head(encoder(x, mask=mask, is_causal=model.causal))

    state_dict = {**encoder.state_dict(), **{f"head.{k}": v for k, v in head.state_dict().items()}}
    return forward, [*encoder.parameters(), *head.parameters()], state_dict


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("dtype", "atol"), [("float64", 1e-12), ("float32", 1e-5)])
def test_torch_path_is_nn_transformer_encoder(causal, dtype, atol):
    import torch

    from runner.backends import torch_backend

    model = small(causal=causal)
    params, inputs = seeded(model)
    module, module_params, state_dict = nn_transformer(model, params, getattr(torch, dtype))
    assert sorted(state_dict) == sorted(model.spec)  # one naming: the state dict's
    names = list(state_dict)
    weights = {k: torch.from_numpy(v).to(getattr(torch, dtype)) for k, v in params.items()}
    x = torch.from_numpy(inputs["x"]).to(getattr(torch, dtype))
    with torch.inference_mode():  # the module's fast path where it takes it
        expected = module(x)
    np.testing.assert_allclose(model.forward(torch_backend, weights, x).numpy(), expected.numpy(), rtol=0, atol=atol)
    labels = torch.from_numpy(inputs["labels"]).to(x.dtype)
    module_grads = torch.autograd.grad(torch.sum(torch.square(module(x) - labels)), module_params)
    trainable = torch_backend.trainable(weights)
    ours = torch_backend.grad(lambda p, x, t: model.loss(torch_backend, p, x, t), None)(trainable, x, labels)
    scale = max(float(g.abs().max()) for g in module_grads)
    for name, grad in zip(names, module_grads, strict=True):
        np.testing.assert_allclose(ours[name].numpy(), grad.numpy(), rtol=0, atol=atol * scale, err_msg=name)


# -- every backend, mode and task against the float64 reference ---------------------------------------------------


def combinations() -> list:
    """(backend, mode, task) for every mode each backend's yaml allows: per-example modes with gradients, the
    others with inference, gradients and jacobian; `slow` and `heavy` ones marked so."""
    found = []
    for backend in BACKENDS:
        for mode in yaml.safe_load((CONF / "backend" / f"{backend}.yaml").read_text())["modes"]:
            tasks = ["gradients"] if mode in PER_EXAMPLE else ["inference", "gradients", "jacobian"]
            found += [
                pytest.param(backend, mode, t, id=f"{backend}-{mode}-{t}", marks=marks(backend, mode, t)) for t in tasks
            ]
    return found


def marks(backend: str, mode: str, task: str) -> list:
    return [pytest.mark.slow] if slow(backend, mode, task) else [pytest.mark.heavy] * heavy(backend, mode, task)


@pytest.mark.parametrize(("backend", "mode", "task"), combinations())
def test_float64_agrees_with_the_reference(tmp_path, backend, mode, task):
    outcome = run(tmp_path, f"backend={backend}", f"mode={mode}", f"task={task}", "dtype=float64", "model.causal=true")
    assert outcome.metrics["max_abs_err_vs_reference"] < 1e-9
    assert outcome.environment["attention_kernel"]  # which attention ran is in the record


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("task", ["inference", "gradients"])
def test_float32_agrees_with_the_reference(tmp_path, backend, task):
    mode = "function" if backend == "jax" else "eager"  # eager JAX: see `slow`
    outcome = run(tmp_path, f"backend={backend}", f"task={task}", f"mode={mode}")
    assert outcome.metrics["max_abs_err_vs_reference"] < 1e-4
    with h5py.File(tmp_path / "tensors.h5", "r") as f:
        assert f["outputs/y"].shape == (4, 8, 3) and f["outputs/y"].dtype == np.float32
        if task == "gradients":
            assert f["gradients/layers.1.self_attn.in_proj_weight"].shape == (48, 16)  # torch's layout everywhere


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "numpy"])
def test_float32_per_example_gradients_agree_with_the_reference(tmp_path, backend):
    """vectorized_map in float32: TensorFlow's broadcasting batch matmul crashed the process here (now tensordot)."""
    outcome = run(tmp_path, f"backend={backend}", "task=gradients", "mode=vectorized_map")
    assert outcome.metrics["max_rel_err_vs_reference"] < 1e-4


def test_torch_records_the_kernel_scaled_dot_product_attention_picked(tmp_path):
    outcome = run(tmp_path, "backend=torch", "task=inference")
    assert outcome.environment["attention_kernel"].startswith("scaled_dot_product_attention: ")
    assert outcome.environment["attention_kernel"].split(": ")[1] in {"flash_attention", "math"}  # on a CPU


def test_torch_picks_the_recorded_kernel_for_the_dtype_attention_gets_under_bf16_mixed(tmp_path, monkeypatch):
    """torch.autocast hands attention bfloat16 projections from float32 weights and inputs: the kernel is chosen
    for a bfloat16 query, the dtype scaled_dot_product_attention really gets (on cuda, flash attention qualifies
    for it and not for float32)."""
    import torch
    import torch.nn.functional as F

    got, chosen_for = set(), []
    attention, choice = F.scaled_dot_product_attention, torch._fused_sdp_choice

    def attention_spy(q, *args, **kwargs):
        got.add(q.dtype)
        return attention(q, *args, **kwargs)

    def choice_spy(q, *args, **kwargs):
        chosen_for.append(q.dtype)
        return choice(q, *args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", attention_spy)
    monkeypatch.setattr(torch, "_fused_sdp_choice", choice_spy)
    outcome = run(tmp_path, "backend=torch", "task=inference", "precision=bf16_mixed")
    assert got == {torch.bfloat16} and chosen_for == [torch.bfloat16]
    assert outcome.environment["attention_kernel"].startswith("scaled_dot_product_attention: ")


def test_attention_dtype_follows_the_policy():
    import torch

    from runner.backends.torch_precision import attention_dtype

    assert attention_dtype(torch.float32, "bf16_mixed") == torch.bfloat16
    assert attention_dtype(torch.float32, "fp16_mixed") == torch.float16
    assert attention_dtype(torch.float64, "bf16_mixed") == torch.float64  # autocast leaves float64 alone
    assert attention_dtype(torch.float32, "full") == attention_dtype(torch.float32, "tf32") == torch.float32


# -- sizes and refusals ----------------------------------------------------------------------------------------


def test_presets_have_the_published_sizes():
    bert = compose(["model=transformer_bert_base"]).model
    gpt2 = compose(["model=transformer_gpt2_small"]).model
    for preset in (bert, gpt2):
        assert (preset.layers, preset.d_model, preset.heads, preset.mlp_ratio) == (12, 768, 12, 4.0)
    assert (bert.causal, bert.seq_len, gpt2.causal, gpt2.seq_len, gpt2.out_features) == (False, 128, True, 1024, 50257)
    encoder = Transformer(12, 768, 12, 4.0, 128, False, 2)
    body = sum(int(np.prod(s)) for name, s in encoder.spec.items() if name.startswith("layers."))
    assert body == 85_054_464  # BERT-base's 12 encoder layers (its 110M include the embeddings and pooler)


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (["model.d_model=30", "model.heads=4"], "model.d_model=30 is not divisible by model.heads=4"),
        (["model.mlp_ratio=0.1", "model.d_model=16"], r"model.mlp_ratio=0.1: d_model \* mlp_ratio \(16 \* 0.1\)"),
        (["model.layers=0"], "model.layers=0: must be a positive integer"),
    ],
)
def test_bad_sizes_are_one_line(tmp_path, overrides, line):
    cfg = compose([*FAST, "model=transformer", "tracking=none", *overrides])
    outcome = run_and_record(job_spec(cfg), tmp_path)
    assert outcome.status == "FAILED" and "\n" not in outcome.error
    with pytest.raises(ConfigError, match=line):
        Transformer(**{k.split(".")[1]: yaml.safe_load(v) for k, v in (o.split("=") for o in overrides)})


def test_a_sequence_beyond_the_machine_is_refused_before_it_starts(tmp_path):
    """seq_len 65536: attention's batch * heads * seq_len^2 probabilities alone are 1.6e11 floats."""
    cfg = compose([*FAST, "model=transformer_gpt2_small", "model.seq_len=65536", "batch_size=8", "tracking=none"])
    outcome = run_and_record(job_spec(cfg), tmp_path)
    assert outcome.status == "FAILED" and "\n" not in outcome.error
    assert outcome.error.startswith("model=transformer model.seq_len=65536 batch_size=8 dtype=float32 needs about")
    assert "of host memory (inputs, weights, results, activations, float64 reference)" in outcome.error


def test_the_memory_estimate_grows_with_the_square_of_seq_len():
    from runner.measure.limits import memory_needed
    from runner.tasks.builtin import Gradients

    def host_bytes(seq_len: int) -> int:
        model = small(seq_len=seq_len, d_model=64, heads=8)
        return memory_needed(Gradients("gradients").array_elements(model, 8, False), 4, "cpu", False)[0]

    second_difference = host_bytes(3072) - 2 * host_bytes(2048) + host_bytes(1024)  # = 2 * 1024^2 * (s^2 term)
    probabilities_and_scores = 2 * 8 * 8 * 2  # per s^2: 2 arrays x batch 8 x heads 8 x layers 2
    assert second_difference == 4 * probabilities_and_scores * 2 * 1024**2  # float32


def test_jax_float32_jacobians_are_refused_with_the_reason(tmp_path):
    """They run, but XLA's CPU code returns wrong values at moderate sizes (docs/transformer.md): refused, not
    recorded as a result. float64 runs (test_float64_agrees_with_the_reference)."""
    cfg = compose([*FAST, "model=transformer", *SIZES, "tracking=none", "backend=jax", "task=jacobian"])
    outcome = run_and_record(job_spec(cfg), tmp_path)
    assert outcome.status == "FAILED" and "\n" not in outcome.error
    assert outcome.error.startswith("model=transformer with backend=jax task=jacobian dtype=float32 is refused: JAX")


def test_a_state_dict_of_torchs_modules_loads_as_model_weights(tmp_path):
    """model.weights=FILE: nn.TransformerEncoder's own state dict (and the head's) is the model's weights file."""
    import torch

    model = small()
    params, inputs = seeded(model)
    module, _, state_dict = nn_transformer(model, params, torch.float64)
    torch.save(state_dict, tmp_path / "encoder.pth")
    outcome = run(tmp_path, "backend=numpy", "task=inference", "dtype=float64", f"model.weights={tmp_path}/encoder.pth")
    with h5py.File(tmp_path / "tensors.h5", "r") as f:
        x = torch.from_numpy(f["inputs/x"][()])
        with torch.no_grad():
            np.testing.assert_allclose(f["outputs/y"][()], module(x).numpy(), rtol=0, atol=1e-12)
    assert outcome.metrics["max_abs_err_vs_reference"] == 0
