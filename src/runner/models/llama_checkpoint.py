"""A Llama-family checkpoint's config.json as model=llama's settings, read as transformers' `from_pretrained` reads it:
LlamaConfig, Qwen2Config, Qwen3Config and MistralConfig (`model_type`), each key config.json leaves out taking that
class's documented default (FAMILIES), and both ways rope settings are written (transformers 5's `rope_parameters`, or
`rope_theta` beside `rope_scaling` before it).

What each family computes beyond Llama's arithmetic becomes a setting of model=llama: Qwen2's q/k/v biases (qkv_bias),
Llama's and Qwen3's `attention_bias` (qkv_bias and o_bias), Llama's `mlp_bias`, Qwen3's q/k RMSNorm (qk_norm) and its
head size apart from d_model / heads (head_dim), Mistral's and Qwen2/3's sliding window (sliding_window, in the layers
from full_attention_layers on: Qwen's max_window_layers). What none of
them computes is refused in one line naming the key: another activation, partial rotary embeddings, a rope type
outside runner.models.rope's.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from runner.config import ConfigError
from runner.models.checkpoints import Setting
from runner.models.rope import KINDS, checked_rope_scaling, yarn_attention_factor

# transformers' defaults where config.json leaves a key out: every family's, then each family's own
COMMON = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "rms_norm_eps": 1e-6,
          "tie_word_embeddings": False, "rope_theta": 10000.0, "hidden_act": "silu", "attention_bias": False,
          "mlp_bias": False, "use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28}  # fmt: skip
FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {"vocab_size": 32000, "intermediate_size": 11008, "max_position_embeddings": 2048},
    "qwen2": {"vocab_size": 151936, "intermediate_size": 22016, "max_position_embeddings": 32768},
    "qwen3": {"vocab_size": 151936, "intermediate_size": 22016, "max_position_embeddings": 32768, "head_dim": 128},
    "mistral": {"vocab_size": 32000, "intermediate_size": 14336, "max_position_embeddings": 131072,
                "num_key_value_heads": 8, "sliding_window": 4096},
}  # fmt: skip
# config.json's key -> model=llama's setting, the same value in both
SIZES = {"num_hidden_layers": "layers", "hidden_size": "d_model", "num_attention_heads": "heads",
         "intermediate_size": "ffn", "vocab_size": "vocab_size", "tie_word_embeddings": "tie_embeddings"}  # fmt: skip


# what each key config.json may set must hold, as transformers' config classes take it (TYPED)
POSITIVE = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size",
            "max_position_embeddings", "num_key_value_heads", "head_dim", "sliding_window")  # fmt: skip
TYPED: dict[str, tuple[str, Any]] = {
    **{key: ("a positive integer", lambda v: type(v) is int and v >= 1) for key in POSITIVE},
    **{key: ("true or false", lambda v: isinstance(v, bool))
       for key in ("tie_word_embeddings", "attention_bias", "mlp_bias", "use_sliding_window")},
    **{key: ("a finite number above 0", lambda v: type(v) in (int, float) and math.isfinite(v) and v > 0)
       for key in ("rms_norm_eps", "rope_theta", "rope_parameters.rope_theta")},
    "max_window_layers": ("an integer, 0 or more", lambda v: type(v) is int and v >= 0),
    "model_type": ("a string", lambda v: isinstance(v, str)),
    "hidden_act": ("a string", lambda v: isinstance(v, str)),
    "layer_types": ("a list of strings", lambda v: isinstance(v, list) and all(isinstance(t, str) for t in v)),
    "rope_scaling": ("an object", lambda v: isinstance(v, Mapping)),
    "rope_parameters": ("an object", lambda v: isinstance(v, Mapping)),
}  # fmt: skip
NULLABLE = ("num_key_value_heads", "head_dim", "sliding_window", "layer_types", "rope_scaling")


def check_types(config: Mapping[str, Any], source: Path) -> None:
    """Refuse, in one line naming the key, a value of config.json that is not of its type (hidden_size="64",
    rms_norm_eps=NaN, num_key_value_heads=0): never read as something else, nor offered back as the fix."""
    parameters = config.get("rope_parameters")
    nested = {f"rope_parameters.{k}": v for k, v in parameters.items()} if isinstance(parameters, Mapping) else {}
    for key, value in {**config, **nested}.items():
        if key not in TYPED or (value is None and key in NULLABLE):
            continue
        what, fits = TYPED[key]
        if not fits(value):
            shown = json.dumps(value) if isinstance(value, str | bool) or value is None else value
            raise ConfigError(f"{source}: {key}={shown} must be {what}{' or null' if key in NULLABLE else ''}")


def settings_of(config: Mapping[str, Any], source: Path, model: str = "llama") -> list[Setting]:
    """Every setting config.json sets for model=llama (`run` left None), each with the key it comes from; one line for
    a value of the wrong type, or a model_type or arithmetic model=llama does not compute."""
    check_types(config, source)
    family = config.get("model_type", "llama")
    if family not in FAMILIES:
        raise ConfigError(
            f"{source}: model_type={family}, not a Llama, Qwen2, Qwen3 or Mistral that model={model} runs"
        )

    def get(key: str) -> Any:
        return config[key] if key in config else FAMILIES[family].get(key, COMMON.get(key))

    _refuse_other_arithmetic(config, get, source, model)
    settings = [Setting(key, get(key), mine, None, get(key)) for key, mine in SIZES.items()]
    heads = get("num_attention_heads")
    kv_heads = get("num_key_value_heads") if get("num_key_value_heads") is not None else heads
    head_dim = get("head_dim") or get("hidden_size") // heads
    eps = float(get("rms_norm_eps"))
    settings += [
        Setting("num_key_value_heads", kv_heads, "kv_heads", None, kv_heads),
        Setting("head_dim", head_dim, "head_dim", None, None if head_dim == get("hidden_size") // heads else head_dim),
        Setting("rms_norm_eps", get("rms_norm_eps"), "rms_eps", None, eps),
        Setting("max_position_embeddings", get("max_position_embeddings"), "context", None,
                get("max_position_embeddings"), narrows=True),
        *_rope(config, get, source, model),
        *_family_arithmetic(family, get, source),
    ]  # fmt: skip
    return settings


def _refuse_other_arithmetic(config: Mapping[str, Any], get: Any, source: Path, model: str) -> None:
    if get("hidden_act") != "silu":
        raise ConfigError(f"{source}: hidden_act={get('hidden_act')!r}, but model={model} computes a SiLU-gated MLP")
    parameters = config.get("rope_parameters")
    rope: Mapping[str, Any] = parameters if isinstance(parameters, Mapping) else {}
    partial = rope.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
    if partial not in (None, 1, 1.0):
        raise ConfigError(f"{source}: partial_rotary_factor={partial}, but model={model} turns every feature of a head")


def _rope(config: Mapping[str, Any], get: Any, source: Path, model: str) -> list[Setting]:
    """The rotary base and scaling as transformers 5 writes them (`rope_parameters`) or as before (`rope_theta`,
    `rope_scaling`), in model.rope_scaling's form (runner.models.rope)."""
    if isinstance(config.get("rope_parameters"), Mapping):
        rope, theta_key, scaling_key = dict(config["rope_parameters"]), "rope_parameters.rope_theta", "rope_parameters"
        rope.setdefault("rope_theta", get("rope_theta"))
    else:
        rope = {**(config.get("rope_scaling") or {}), "rope_theta": get("rope_theta")}
        theta_key, scaling_key = "rope_theta", "rope_scaling"
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind != "default" and kind not in KINDS:
        raise ConfigError(
            f"{source}: {scaling_key}.rope_type={kind}, but model={model} computes rotary embeddings without scaling "
            f"(default) or with {', '.join(KINDS)} scaling"
        )
    theta = float(rope["rope_theta"])
    shown = {k: v for k, v in rope.items() if k != "rope_theta"} if kind != "default" else None
    scaling = None if kind == "default" else _scaling(kind, rope, get("max_position_embeddings"), source)
    return [
        Setting(theta_key, rope["rope_theta"], "rope_theta", None, theta),
        Setting(scaling_key, shown, "rope_scaling", None, scaling),
    ]


def _scaling(kind: str, rope: Mapping[str, Any], trained: int, source: Path) -> dict[str, Any] | None:
    """config.json's rope settings of that kind, the original positions defaulting to max_position_embeddings and
    YaRN's attention factor computed as transformers computes it where config.json leaves it out."""
    needed, optional = KINDS[kind]
    given = {k: rope[k] for k in (*needed, *optional) if rope.get(k) is not None}
    given.setdefault("original_max_position_embeddings", trained)
    if kind == "linear":
        given.pop("original_max_position_embeddings")
    if kind == "yarn":
        given.setdefault("factor", trained / given["original_max_position_embeddings"])
        given.setdefault("attention_factor", yarn_attention_factor(float(given["factor"]), rope.get("mscale"),
                                                                   rope.get("mscale_all_dim")))  # fmt: skip
    try:
        return checked_rope_scaling({"rope_type": kind, **given})
    except ConfigError as error:
        raise ConfigError(f"{source}: {error}") from None


def _family_arithmetic(family: str, get: Any, source: Path) -> list[Setting]:
    """Biases, Qwen3's q/k norm and the sliding window: what each family computes, as model=llama's settings."""
    biased = get("attention_bias") if family in ("llama", "qwen3") else family == "qwen2"
    o_bias = get("attention_bias") if family in ("llama", "qwen3") else False
    key = "attention_bias" if family in ("llama", "qwen3") else "model_type"
    shown = get("attention_bias") if family in ("llama", "qwen3") else family
    settings = [
        Setting(key, shown, "qkv_bias", None, bool(biased)),
        Setting(key, shown, "o_bias", None, bool(o_bias)),
        Setting("mlp_bias" if family == "llama" else "model_type", get("mlp_bias") if family == "llama" else family,
                "mlp_bias", None, bool(get("mlp_bias")) if family == "llama" else False),
        Setting("model_type", family, "qk_norm", None, family == "qwen3"),
    ]  # fmt: skip
    window, full = (get("sliding_window"), 0) if family == "mistral" else _qwen_window(get, source)
    return [
        *settings,
        Setting("sliding_window", get("sliding_window"), "sliding_window", None, window),
        Setting("max_window_layers", get("max_window_layers"), "full_attention_layers", None, full),
    ]


def _qwen_window(get: Any, source: Path) -> tuple[int | None, int]:
    """Qwen2's and Qwen3's window and the layers before the first that attends within it, where `use_sliding_window`
    and some layer does (from max_window_layers on, or as layer_types marks them: sliding ones after full ones)."""
    if not get("use_sliding_window") or get("sliding_window") is None:
        return None, 0
    layers = get("num_hidden_layers")
    types = get("layer_types") or ["sliding_attention" if i >= get("max_window_layers") else "full_attention"
                                   for i in range(layers)]  # fmt: skip
    sliding = [i for i, kind in enumerate(types) if kind == "sliding_attention"]
    if not sliding:
        return None, 0
    if sliding != list(range(sliding[0], len(types))):
        raise ConfigError(
            f"{source}: layer_types interleave full and sliding attention, but model=llama computes full attention "
            "in the first layers and sliding attention in every layer after them"
        )
    return get("sliding_window"), sliding[0]
