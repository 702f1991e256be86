"""A stack of pre-layer-norm transformer blocks, written once against the backend ops (families `dense`, `attention`).

    x (batch, seq_len, d_model): the embedded input, i.e. what a token + position embedding hands the stack
    for each layer i:  x = x + out_proj(attention(in_proj(norm1(x))))     multi-head self-attention
                       x = x + linear2(gelu(linear1(norm2(x))))           the MLP, exact (erf) GELU
    y = head(norm(x))                                                      (batch, seq_len, out_features)

Parameters carry the names and shapes of torch's state dict for

    nn.TransformerEncoder(nn.TransformerEncoderLayer(d_model, heads, d_model * mlp_ratio, dropout=0,
        activation="gelu", batch_first=True, norm_first=True), layers, norm=nn.LayerNorm(d_model))

(`layers.0.self_attn.in_proj_weight`, ..., `norm.weight`) plus `head.weight` / `head.bias` for an
nn.Linear(d_model, out_features), so that module loads them directly. Loss: sum of squared error against
seeded targets, as for the other models. The float64 NumPy backprop is runner.models.transformer_backprop.
"""

from __future__ import annotations

import numpy as np

from runner.backends import AttentionCall
from runner.config import ConfigError, require_positive
from runner.models import ForwardSize, Workload
from runner.models import transformer_backprop as backprop


def transformer_spec(layers: int, d_model: int, hidden: int, out_features: int) -> dict[str, tuple]:
    """{torch state-dict name: shape} of the stack, its final norm and its head."""
    spec: dict[str, tuple] = {}
    for i in range(layers):
        p = f"layers.{i}."
        spec[p + "self_attn.in_proj_weight"] = (3 * d_model, d_model)
        spec[p + "self_attn.in_proj_bias"] = (3 * d_model,)
        spec[p + "self_attn.out_proj.weight"] = (d_model, d_model)
        spec[p + "self_attn.out_proj.bias"] = (d_model,)
        spec[p + "linear1.weight"] = (hidden, d_model)
        spec[p + "linear1.bias"] = (hidden,)
        spec[p + "linear2.weight"] = (d_model, hidden)
        spec[p + "linear2.bias"] = (d_model,)
        for norm in ("norm1", "norm2"):
            spec[p + f"{norm}.weight"] = (d_model,)
            spec[p + f"{norm}.bias"] = (d_model,)
    spec["norm.weight"] = spec["norm.bias"] = (d_model,)
    spec["head.weight"] = (out_features, d_model)
    spec["head.bias"] = (out_features,)
    return spec


def mlp_width(d_model: int, mlp_ratio: float) -> int:
    """The MLP's hidden width d_model * mlp_ratio; one line when it is not a positive whole number."""
    width = d_model * mlp_ratio
    if mlp_ratio <= 0 or width != int(width):
        raise ConfigError(
            f"model.mlp_ratio={mlp_ratio}: d_model * mlp_ratio ({d_model} * {mlp_ratio}) must be a positive whole "
            "number, the MLP's width"
        )
    return int(width)


class Transformer(Workload):
    name = "transformer"
    spec: dict[str, tuple]  # always: set in __init__

    def __init__(
        self,
        layers: int = 2,
        d_model: int = 64,
        heads: int = 4,
        mlp_ratio: float = 4.0,
        seq_len: int = 32,
        causal: bool = False,
        out_features: int = 16,
    ):
        require_positive(layers=layers, d_model=d_model, heads=heads, seq_len=seq_len, out_features=out_features)
        if d_model % heads:
            raise ConfigError(
                f"model.d_model={d_model} is not divisible by model.heads={heads}: each head takes d_model / heads "
                "features"
            )
        self.layers, self.d_model, self.heads, self.seq_len = layers, d_model, heads, seq_len
        self.causal, self.out_features = causal, out_features
        self.hidden = mlp_width(d_model, mlp_ratio)
        self.spec = transformer_spec(layers, d_model, self.hidden, out_features)

    def init_params(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Projections N(0, 1/fan_in), the residual branches' last projections further scaled by
        1/sqrt(2 layers) (GPT-2's rule: the residual stream stays bounded however deep); biases and norms
        mildly off their defaults, so every parameter matters to the checks."""
        residual_scale = 1 / np.sqrt(2 * self.layers)
        params = {}
        for name, shape in self.spec.items():
            if len(shape) == 2:
                scale = residual_scale if name.endswith(("out_proj.weight", "linear2.weight")) else 1.0
                params[name] = rng.standard_normal(shape) * scale / np.sqrt(shape[1])
            elif "norm" in name and name.endswith("weight"):
                params[name] = 1 + 0.1 * rng.standard_normal(shape)
            else:
                params[name] = 0.1 * rng.standard_normal(shape)
        return params

    def make_inputs(self, rng: np.random.Generator, batch_size: int) -> dict[str, np.ndarray]:
        return {
            "x": rng.standard_normal((batch_size, self.seq_len, self.d_model)),
            "labels": rng.standard_normal((batch_size, self.seq_len, self.out_features)),
        }

    def size_setting(self, batch_size: int) -> str:
        return f"model.seq_len={self.seq_len} batch_size={batch_size}"  # both set the size

    def examples_per_call(self, batch_size: int) -> int:
        return batch_size

    # -- written once, run on every backend's ops --------------------------------------------

    def forward(self, ops, params: dict, x):
        for i in range(self.layers):
            x = self._block(ops, params, f"layers.{i}.", x)
        x = ops.layer_norm(x, params["norm.weight"], params["norm.bias"])
        return ops.linear(x, params["head.weight"], params["head.bias"])

    def _block(self, ops, p: dict, prefix: str, x):
        h = ops.layer_norm(x, p[prefix + "norm1.weight"], p[prefix + "norm1.bias"])
        qkv = ops.linear(h, p[prefix + "self_attn.in_proj_weight"], p[prefix + "self_attn.in_proj_bias"])
        attended = ops.merge_heads(ops.attention(*ops.split_heads(qkv, self.heads), causal=self.causal))
        x = x + ops.linear(attended, p[prefix + "self_attn.out_proj.weight"], p[prefix + "self_attn.out_proj.bias"])
        h = ops.layer_norm(x, p[prefix + "norm2.weight"], p[prefix + "norm2.bias"])
        h = ops.gelu(ops.linear(h, p[prefix + "linear1.weight"], p[prefix + "linear1.bias"]))
        return x + ops.linear(h, p[prefix + "linear2.weight"], p[prefix + "linear2.bias"])

    def loss(self, ops, params: dict, x, labels):
        return ops.sum(ops.square(self.forward(ops, params, x) - labels))

    def describe(self, ops, params: dict, inputs: dict, backward: bool) -> dict[str, str]:
        batch, seq, d = (int(n) for n in inputs["x"].shape)
        shape = (batch, self.heads, seq, d // self.heads)
        call = AttentionCall(shape, keys=seq, causal=self.causal, differentiated=backward)
        return {"attention_kernel": ops.attention_kernel(inputs["x"], call)}

    # -- explicit backprop in float64 numpy: numpy's gradients and the reference ----------------

    def gradients(self, params: dict, x: np.ndarray, labels: np.ndarray) -> dict[str, np.ndarray]:
        return backprop.gradients(self, params, x, labels)

    def per_example_gradients(self, params: dict, x: np.ndarray, labels: np.ndarray) -> dict[str, np.ndarray]:
        per_example = [self.gradients(params, x[i : i + 1], labels[i : i + 1]) for i in range(len(x))]
        return {name: np.stack([g[name] for g in per_example]) for name in per_example[0]}

    def jacobian(self, params: dict, x: np.ndarray) -> np.ndarray:
        return backprop.jacobian(self, params, x)

    # -- sizes: the memory check and the cost note ------------------------------------------

    def forward_size(self, batch_size: int) -> ForwardSize:
        """Weights, inputs, outputs, and what one layer holds (the attention probabilities' batch * heads *
        seq_len^2 among them)."""
        tokens, d = batch_size * self.seq_len, self.d_model
        outputs = tokens * self.out_features
        attention = 2 * batch_size * self.heads * self.seq_len**2  # scores and probabilities
        layer_flops = 2 * tokens * (4 * d * d + 2 * d * self.hidden) + 4 * tokens * self.seq_len * d
        return ForwardSize(
            weights=sum(int(np.prod(shape)) for shape in self.spec.values()),
            inputs=tokens * d + outputs,
            outputs=outputs,
            examples=batch_size,
            x_per_example=self.seq_len * d,
            flops=float(self.layers * layer_flops + 2 * tokens * d * self.out_features),
            layer_activations=tokens * (8 * d + 2 * self.hidden) + attention,
            layers=self.layers,
        )
