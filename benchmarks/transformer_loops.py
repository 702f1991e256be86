"""The hand-written side of parity.py's transformer rows: the modules users reach for, loaded with the runner's
weights (the same seeded values, by the same torch state-dict names).

torch: nn.TransformerEncoder(nn.TransformerEncoderLayer(norm_first=True, batch_first=True, activation="gelu"))
+ nn.Linear head; inference under inference_mode (the layer's fused fast path), gradients by torch.autograd.grad.
TensorFlow: Keras 3's MultiHeadAttention, LayerNormalization and Dense layers, the pre-norm block written with them,
gradients by GradientTape over their variables.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

SIZES = {"layers": 2, "d_model": 256, "heads": 4, "seq_len": 128, "out_features": 16}
BATCH = 8
OVERRIDES = ("model=transformer", *(f"model.{k}={v}" for k, v in SIZES.items()), f"batch_size={BATCH}")


def describe() -> str:
    return ", ".join(f"{k} {v}" for k, v in SIZES.items()) + f", batch {BATCH}"


def seeded() -> tuple[object, dict, np.ndarray, np.ndarray]:
    """The workload, its weights and a batch, float32, drawn as the runner draws them for seed 0."""
    from runner.models.transformer import Transformer

    model = Transformer(**SIZES)
    rng = np.random.default_rng(0)
    params = {k: v.astype(np.float32) for k, v in model.init_params(rng).items()}
    inputs = model.make_inputs(rng, BATCH)
    return model, params, inputs["x"].astype(np.float32), inputs["labels"].astype(np.float32)


def torch_transformer_loops(device: str) -> dict[str, list[tuple[str, Callable[[], object]]]]:
    import torch

    model, params, x, labels = seeded()
    layer = torch.nn.TransformerEncoderLayer(
        model.d_model, model.heads, model.hidden, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
    )
    encoder = torch.nn.TransformerEncoder(layer, model.layers, norm=torch.nn.LayerNorm(model.d_model))
    head = torch.nn.Linear(model.d_model, model.out_features)
    state = {k: torch.from_numpy(v) for k, v in params.items()}
    encoder.load_state_dict({k: v for k, v in state.items() if not k.startswith("head.")})
    head.load_state_dict({"weight": state["head.weight"], "bias": state["head.bias"]})
    net = torch.nn.Sequential(encoder, head).to(device)
    weights = tuple(net.parameters())
    x, labels = torch.from_numpy(x).to(device), torch.from_numpy(labels).to(device)

    @torch.inference_mode()
    def predict():
        return net(x)

    def gradients():
        return torch.autograd.grad(torch.sum(torch.square(net(x) - labels)), weights)

    return {
        "transformer_inference": [("nn.TransformerEncoder + head under inference_mode", predict)],
        "transformer_gradients": [("nn.TransformerEncoder + head + torch.autograd.grad", gradients)],
    }


def keras_blocks(model, params: dict) -> Callable:
    """The pre-norm stack written with Keras layers, loaded with `params` (torch names and layouts)."""
    import keras

    d, heads = model.d_model, model.heads
    blocks = []
    for i in range(model.layers):
        p = {k.removeprefix(f"layers.{i}."): v for k, v in params.items() if k.startswith(f"layers.{i}.")}
        attention = keras.layers.MultiHeadAttention(heads, d // heads)
        attention(np.zeros((1, 1, d), np.float32), np.zeros((1, 1, d), np.float32))  # builds its variables
        w, b = p["self_attn.in_proj_weight"], p["self_attn.in_proj_bias"]
        qkv = [array for j in range(3) for array in _projection(w, b, j, d, heads)]
        out_kernel = p["self_attn.out_proj.weight"].T.reshape(heads, d // heads, d)
        attention.set_weights([*qkv, out_kernel, p["self_attn.out_proj.bias"]])
        norms = [_keras_norm(p, name, d) for name in ("norm1", "norm2")]
        dense = [_keras_dense(p, name, shape) for name, shape in (("linear1", d), ("linear2", model.hidden))]
        blocks.append((attention, norms, dense))
    final_norm = _keras_norm({"norm.weight": params["norm.weight"], "norm.bias": params["norm.bias"]}, "norm", d)
    head = _keras_dense({"head.weight": params["head.weight"], "head.bias": params["head.bias"]}, "head", d)

    def forward(x):
        for attention, (norm1, norm2), (linear1, linear2) in blocks:
            h = norm1(x)
            x = x + attention(h, h)
            x = x + linear2(keras.activations.gelu(linear1(norm2(x)), approximate=False))
        return head(final_norm(x))

    layers = [layer for block in blocks for layer in (block[0], *block[1], *block[2])] + [final_norm, head]
    forward.trainable_variables = [v for layer in layers for v in layer.trainable_variables]
    return forward


def _projection(w: np.ndarray, b: np.ndarray, j: int, d: int, heads: int) -> list[np.ndarray]:
    """in_proj's j-th third (query, key, value) as a Keras EinsumDense kernel (d, heads, head_dim) and bias."""
    return [w[j * d : (j + 1) * d].T.reshape(d, heads, d // heads), b[j * d : (j + 1) * d].reshape(heads, d // heads)]


def _keras_norm(p: dict, name: str, d: int):
    import keras

    norm = keras.layers.LayerNormalization(epsilon=1e-5)
    norm.build((None, d))
    norm.set_weights([p[f"{name}.weight"], p[f"{name}.bias"]])
    return norm


def _keras_dense(p: dict, name: str, fan_in: int):
    import keras

    dense = keras.layers.Dense(p[f"{name}.weight"].shape[0])
    dense.build((None, fan_in))
    dense.set_weights([p[f"{name}.weight"].T, p[f"{name}.bias"]])
    return dense


def tensorflow_transformer_loops(device: str) -> dict[str, list[tuple[str, Callable[[], object]]]]:
    import tensorflow as tf

    model, params, x, labels = seeded()
    forward = keras_blocks(model, params)
    x, labels = tf.constant(x), tf.constant(labels)

    def gradients():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(forward(x) - labels))
        return tape.gradient(loss, forward.trainable_variables)

    return {
        "transformer_inference": [("Keras MultiHeadAttention blocks, called in a plain loop", lambda: forward(x))],
        "transformer_gradients": [("Keras MultiHeadAttention blocks + GradientTape", gradients)],
    }
