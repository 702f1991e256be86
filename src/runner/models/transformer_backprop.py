"""The transformer's backprop written out in float64 NumPy: numpy's gradients and jacobians (it has no
autodiff) and the reference every backend is checked against (tests/test_transformer.py checks it
against torch.autograd in float64).

The forward pass here keeps what the backward pass needs; it computes what runner.models.transformer's
forward computes on the numpy backend. Cotangents may carry leading axes (the jacobian pushes many
output directions back at once): every op works on the last axes and broadcasts the rest.
"""

from __future__ import annotations

import numpy as np

EPS = 1e-5  # torch.nn.LayerNorm's
JACOBIAN_CHUNK_ELEMENTS = 2**24  # output directions pushed back at once: at most this many elements per array


def gradients(model, params: dict, x: np.ndarray, labels: np.ndarray) -> dict[str, np.ndarray]:
    """d/dparams of sum((y - labels)^2), in the spec's order."""
    y, caches = _forward(model, params, x)
    grads: dict[str, np.ndarray] = {}
    _backward(model, params, caches, 2 * (y - labels), grads)
    return {name: grads[name] for name in model.spec}


def jacobian(model, params: dict, x: np.ndarray) -> np.ndarray:
    """d y_b / d x_b for every example b: (batch, seq_len, out_features, seq_len, d_model). Examples are
    independent, so each output direction is pushed back for the whole batch at once."""
    y, caches = _forward(model, params, x)
    batch, seq, out = y.shape
    n_out = seq * out
    widest = max(model.heads * seq * seq, seq * model.hidden, seq * 3 * model.d_model)
    chunk = max(1, JACOBIAN_CHUNK_ELEMENTS // (batch * widest))
    rows = []
    for start in range(0, n_out, chunk):
        outputs = np.arange(start, min(n_out, start + chunk))
        directions = np.zeros((len(outputs), batch, n_out))
        directions[np.arange(len(outputs)), :, outputs] = 1.0
        rows.append(_backward(model, params, caches, directions.reshape(len(outputs), batch, seq, out), None))
    jac = np.concatenate(rows).swapaxes(0, 1)  # (batch, n_out, seq, d_model)
    return jac.reshape(batch, seq, out, *x.shape[1:])


# -- forward with what the backward pass needs ------------------------------------------------------


def _forward(model, p: dict, x: np.ndarray):
    layer_caches = []
    for i in range(model.layers):
        x, cache = _block(model, p, f"layers.{i}.", x)
        layer_caches.append(cache)
    z, norm = _layer_norm(x, p["norm.weight"], p["norm.bias"])
    return z @ p["head.weight"].T + p["head.bias"], (layer_caches, norm, z)


def _block(model, p: dict, prefix: str, x: np.ndarray):
    h1, norm1 = _layer_norm(x, p[prefix + "norm1.weight"], p[prefix + "norm1.bias"])
    qkv = h1 @ p[prefix + "self_attn.in_proj_weight"].T + p[prefix + "self_attn.in_proj_bias"]
    attended, attention = _attention(qkv, model.heads, model.causal)
    x = x + attended @ p[prefix + "self_attn.out_proj.weight"].T + p[prefix + "self_attn.out_proj.bias"]
    h2, norm2 = _layer_norm(x, p[prefix + "norm2.weight"], p[prefix + "norm2.bias"])
    u = h2 @ p[prefix + "linear1.weight"].T + p[prefix + "linear1.bias"]
    g, gelu = _gelu(u)
    x = x + g @ p[prefix + "linear2.weight"].T + p[prefix + "linear2.bias"]
    return x, (h1, norm1, attention, attended, h2, norm2, gelu, g)


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray):
    centred = x - x.mean(-1, keepdims=True)
    rstd = 1 / np.sqrt(np.square(centred).mean(-1, keepdims=True) + EPS)
    normed = centred * rstd
    return normed * weight + bias, (normed, rstd, weight)


def _attention(qkv: np.ndarray, heads: int, causal: bool):
    *lead, seq, three_d = qkv.shape
    d = three_d // 3
    q, k, v = np.moveaxis(qkv.reshape(*lead, seq, 3, heads, d // heads), -3, 0).swapaxes(-2, -3)
    scale = 1 / np.sqrt(d // heads)
    scores = (q @ k.swapaxes(-1, -2)) * scale
    if causal:
        scores = np.where(np.tri(seq, dtype=bool), scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return (probs @ v).swapaxes(-2, -3).reshape(*lead, seq, d), (q, k, v, probs, scale)


def _gelu(u: np.ndarray):
    from scipy.special import erf

    cdf = 0.5 * (1 + erf(u * np.sqrt(0.5)))
    return u * cdf, (u, cdf)


# -- backward ------------------------------------------------------------------------------------------


def _backward(model, p: dict, caches, d_y: np.ndarray, grads: dict | None) -> np.ndarray:
    """d_x from d_y; the weights' gradients into `grads` (None: not wanted, as for the jacobian)."""
    layer_caches, norm, z = caches
    _linear_grads(grads, "head.weight", "head.bias", d_y, z)
    d_x = _layer_norm_back(d_y @ p["head.weight"], norm, grads, "norm.")
    for i in reversed(range(model.layers)):
        d_x = _block_back(model, p, f"layers.{i}.", layer_caches[i], d_x, grads)
    return d_x


def _block_back(model, p: dict, prefix: str, cache, d_x: np.ndarray, grads: dict | None) -> np.ndarray:
    h1, norm1, attention, attended, h2, norm2, gelu, g = cache
    _linear_grads(grads, prefix + "linear2.weight", prefix + "linear2.bias", d_x, g)
    d_u = _gelu_back(d_x @ p[prefix + "linear2.weight"], gelu)
    _linear_grads(grads, prefix + "linear1.weight", prefix + "linear1.bias", d_u, h2)
    d_x = d_x + _layer_norm_back(d_u @ p[prefix + "linear1.weight"], norm2, grads, prefix + "norm2.")
    out_proj = prefix + "self_attn.out_proj."
    _linear_grads(grads, out_proj + "weight", out_proj + "bias", d_x, attended)
    d_qkv = _attention_back(d_x @ p[out_proj + "weight"], attention, model.heads)
    in_proj = prefix + "self_attn.in_proj_"
    _linear_grads(grads, in_proj + "weight", in_proj + "bias", d_qkv, h1)
    return d_x + _layer_norm_back(d_qkv @ p[in_proj + "weight"], norm1, grads, prefix + "norm1.")


def _linear_grads(grads: dict | None, weight: str, bias: str, d_y: np.ndarray, x: np.ndarray) -> None:
    if grads is None:
        return
    d_y2, x2 = d_y.reshape(-1, d_y.shape[-1]), x.reshape(-1, x.shape[-1])
    grads[weight], grads[bias] = d_y2.T @ x2, d_y2.sum(0)


def _layer_norm_back(d_y: np.ndarray, cache, grads: dict | None, prefix: str) -> np.ndarray:
    normed, rstd, weight = cache
    if grads is not None:
        grads[prefix + "weight"] = (d_y * normed).reshape(-1, d_y.shape[-1]).sum(0)
        grads[prefix + "bias"] = d_y.reshape(-1, d_y.shape[-1]).sum(0)
    d_normed = d_y * weight
    mean_d = d_normed.mean(-1, keepdims=True)
    return rstd * (d_normed - mean_d - normed * (d_normed * normed).mean(-1, keepdims=True))


def _attention_back(d_out: np.ndarray, cache, heads: int) -> np.ndarray:
    q, k, v, probs, scale = cache
    *lead, seq, d = d_out.shape
    d_o = d_out.reshape(*lead, seq, heads, d // heads).swapaxes(-2, -3)  # (..., heads, seq, head_dim)
    d_probs = d_o @ v.swapaxes(-1, -2)
    d_v = probs.swapaxes(-1, -2) @ d_o
    d_scores = probs * (d_probs - (d_probs * probs).sum(-1, keepdims=True)) * scale  # softmax's backward
    d_q, d_k = d_scores @ k, d_scores.swapaxes(-1, -2) @ q
    d_qkv = np.moveaxis(np.stack(np.broadcast_arrays(d_q, d_k, d_v), axis=-4), -2, -4)  # (..., seq, 3, heads, hd)
    return d_qkv.reshape(*lead, seq, 3 * d)


def _gelu_back(d_g: np.ndarray, cache) -> np.ndarray:
    u, cdf = cache
    return d_g * (cdf + u * np.exp(-0.5 * u * u) / np.sqrt(2 * np.pi))
