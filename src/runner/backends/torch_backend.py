"""PyTorch backend, timed through its everyday API: torch.autograd on leaf tensors for gradients and
jacobians, torch.func only for vmap's per-example gradients, torch.compile(model) for compiled modes."""

from __future__ import annotations

import sys
import threading
import warnings
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from runner.backends import AttentionCall, table_layout_ops, torch_precision
from runner.backends.first_call import torch_parts as first_call_parts  # noqa: F401 - runner.backends.first_call
from runner.backends.optimizers import Optimizer
from runner.backends.torch_precision import set_precision, with_precision  # noqa: F401 - the backend function set
from runner.config import ConfigError

DTYPES = {
    "float16": torch.float16,
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
}
_ops = sys.modules[__name__]
torch_precision.remember_shipped()  # before prepare() changes them: what precision=default restores
# torch.compile's progress bar (torch.hub's tqdm, where tqdm is installed) takes a multiprocessing lock, whose semaphore
# a worker ending with os._exit left to the resource tracker: 'leaked semaphore objects' after each compiled run. No
# other process draws this bar: a thread's lock will do.
if hasattr(torch.hub.tqdm, "set_lock"):
    torch.hub.tqdm.set_lock(threading.RLock())


def set_threads(threads: int) -> None:
    torch.set_num_threads(threads)


def prepare(device: str, dtype: str) -> str:
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device=cuda but torch sees no CUDA device (use device=cpu or auto)")
    # TF32 would make float32 matmuls on Ampere+ GPUs disagree with the other backends.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    warnings.filterwarnings("ignore", message="TensorFloat32 tensor cores", category=UserWarning)  # off on purpose
    if device == "cuda":  # start the CUDA context now (inside load_s), not inside the first timed call
        torch.zeros(1, device="cuda")
        torch.cuda.synchronize()
    return device


def asarray(array: np.ndarray, device: str, dtype: str) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array)).to(device=device, dtype=DTYPES[dtype])


def to_numpy(native: torch.Tensor) -> np.ndarray:
    if isinstance(native, np.ndarray):  # already host memory (a conversion's result)
        return native
    tensor = native.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.float()
    return tensor.numpy()


def synchronizer(device: str) -> Callable[[], None]:
    return torch.cuda.synchronize if device == "cuda" else _no_sync


def _no_sync() -> None:
    return None


def compile_model(fn: Callable, mode: str, device: str) -> Callable:
    """torch.compile the model (forward or loss), as users do; autograd differentiates it from outside.

    Compiling the gradient step itself gains nothing: dynamo breaks the graph at torch.autograd.grad,
    and with fullgraph=True (mode=xla) it refuses it."""
    if mode == "function":
        return torch.compile(fn)
    if mode == "xla":  # torch has no XLA here: the strongest torch.compile stands in for it
        return torch.compile(fn, mode="max-autotune", fullgraph=True)
    return fn  # eager, and the per-example modes (vmap and the loop run eagerly)


def compile_step(fn: Callable, mode: str, device: str) -> Callable:
    return fn  # the model inside fn is compiled already (compile_model)


def trainable(params: dict) -> dict:
    """The weights as leaf tensors that require grad, as an nn.Module's parameters are."""
    return {name: p.detach().requires_grad_() for name, p in params.items()}


def grad(loss: Callable, numpy_backprop: Callable | None) -> Callable:
    def gradients(params: dict, x: torch.Tensor, labels: torch.Tensor) -> dict:
        return dict(zip(params, torch.autograd.grad(loss(params, x, labels), tuple(params.values())), strict=True))

    return gradients


# How the compiled modes compile task=train_step, for the record: dynamo compiles the step's forward and the
# optimizer's update as graphs of their own and runs loss.backward() between them, through AOTAutograd's
# compiled backward.
OPTIMIZER_CONVENTION = "torch"
TRAIN_STEP_COMPILED = {
    mode: f"torch.compile({options}) of the whole step; graph break at loss.backward()"
    for mode, options in (("function", ""), ("xla", 'mode="max-autotune"'))
}


def train_step(
    loss: Callable, params: dict, optimizer: Optimizer, mode: str, device: str, numpy_backprop: Callable | None
) -> tuple[Callable, Callable[[], dict]]:
    """torch.optim's step as its users write it: zero_grad(set_to_none=True), loss.backward(), step(); the
    compiled modes torch.compile the whole step (TRAIN_STEP_COMPILED). precision=fp16_mixed scales the loss
    (torch.amp.GradScaler: scale(loss).backward(), scaler.step(), scaler.update())."""
    weights = {name: p.detach().clone().requires_grad_() for name, p in params.items()}
    if optimizer.name == "sgd":
        torch_optimizer: torch.optim.Optimizer = torch.optim.SGD(
            weights.values(), lr=optimizer.lr, momentum=optimizer.momentum
        )
    else:
        betas = (optimizer.beta1, optimizer.beta2)
        torch_optimizer = torch.optim.Adam(weights.values(), lr=optimizer.lr, betas=betas, eps=optimizer.eps)
        for p in weights.values():  # compiled, Adam's step count is a tensor: in the weights' dtype, not float32's
            torch_optimizer.state[p] = {"step": torch.tensor(0.0, dtype=p.dtype), "exp_avg": torch.zeros_like(p),
                                        "exp_avg_sq": torch.zeros_like(p)}  # fmt: skip

    scaler = torch_precision.grad_scaler(device)

    def step(x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        torch_optimizer.zero_grad(set_to_none=True)
        value = loss(weights, x, labels)
        if scaler is None:
            value.backward()
            torch_optimizer.step()
        else:
            scaler.scale(value).backward()
            scaler.step(torch_optimizer)
            scaler.update()
        return value.detach()

    if mode == "function":
        step = torch.compile(step)
    elif mode == "xla":  # fullgraph=True would refuse the break at backward()
        step = torch.compile(step, mode="max-autotune")
    return step, lambda: weights


def per_example_grad(loss: Callable, mode: str, numpy_backprop: Callable | None) -> Callable:
    if mode == "vectorized_map":  # the one place torch.func is the idiom

        def single_loss(params: dict, x: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
            return loss(params, x.unsqueeze(0), label.unsqueeze(0))

        return torch.func.vmap(torch.func.grad(single_loss), in_dims=(None, 0, 0))
    batch_grad = grad(loss, numpy_backprop)

    def looped(params: dict, x: torch.Tensor, labels: torch.Tensor) -> dict:
        per_example = [batch_grad(params, x[i : i + 1], labels[i : i + 1]) for i in range(x.shape[0])]
        return {name: torch.cat([g[name].unsqueeze(0) for g in per_example]) for name in params}

    return looped


# measured: on the CPU one backward per output is faster up to 2 outputs, the batched backward beyond; on a GPU, where
# an eager step is bound by its kernel launches, the batched one is faster from 2 (an H200: 841 against 910 µs)
LOOPED_JACOBIAN_MAX_OUTPUTS = {"cpu": 2, "cuda": 1}


def batch_jacobian(forward: Callable, mode: str, numpy_backprop: Callable | None) -> Callable:
    """d y_b / d x_b for every example b, from the batch-summed output: examples are independent, so
    d (sum_b y_b) / d x_b = d y_b / d x_b. One backward per output (what autograd.functional.jacobian
    does without vectorize) for a few outputs, batched backward (its vectorize=True) for more. A compiled
    model's backward cannot always be batched (vmap refuses the in-place copy in the transformer's compiled
    backward), so compiled modes take one backward per output."""
    compiled = mode in ("function", "xla")

    def jacobian(params: dict, x: torch.Tensor) -> torch.Tensor:
        looped_up_to = float("inf") if compiled else LOOPED_JACOBIAN_MAX_OUTPUTS.get(x.device.type, 1)
        x = x.detach().requires_grad_()
        summed = forward(params, x).sum(0)
        y = summed.reshape(-1)
        if y.numel() <= looped_up_to:
            rows = [torch.autograd.grad(y[o], x, retain_graph=True)[0] for o in range(y.numel())]
            jac = torch.stack(rows, dim=1)
        else:
            eye = torch.eye(y.numel(), dtype=y.dtype, device=y.device)
            jac = torch.autograd.grad(y, x, eye, is_grads_batched=True)[0].transpose(0, 1)
        return jac.reshape(x.shape[0], *summed.shape, *x.shape[1:])  # (batch, *output, *input), as TF and JAX

    return jacobian


def reset_peak_memory(device: str) -> None:
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()


def peak_device_mb(device: str) -> float | None:
    if device != "cuda":
        return None
    return torch.cuda.max_memory_allocated() / 2**20


def environment(device: str) -> dict:
    env = {
        "framework": "torch",
        "framework_version": torch.__version__,
        "torch_num_threads": torch.get_num_threads(),
        "torch_num_interop_threads": torch.get_num_interop_threads(),
        "cuda_available": torch.cuda.is_available(),
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
    }
    if device == "cuda":
        env["device_name"] = torch.cuda.get_device_name()
        env["cuda_version"] = torch.version.cuda
        env["cudnn_version"] = torch.backends.cudnn.version()
    return env


# -- ops --------------------------------------------------------------------------------------

linear = F.linear
relu = torch.relu
matmul = torch.matmul
exp = torch.exp
square = torch.square
sum = torch.sum  # noqa: A001 - the ops namespace mirrors the frameworks' names


# -- attention ops (the transformer, GPT-2, Llama): F.scaled_dot_product_attention, which picks a fused kernel --------


def layer_norm(x, weight, bias, eps: float = 1e-5):
    return F.layer_norm(x, x.shape[-1:], weight, bias, eps)


def gelu(x):
    return F.gelu(x)  # the exact (erf) GELU: torch's default and nn.TransformerEncoderLayer's "gelu"


def split_heads(qkv: torch.Tensor, heads: int) -> tuple[torch.Tensor, ...]:
    """As nn.MultiheadAttention splits its packed projection."""
    batch, seq, three_d = qkv.shape
    return qkv.view(batch, seq, 3, heads, three_d // 3 // heads).permute(2, 0, 3, 1, 4).unbind(0)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    batch, heads, seq, size = x.shape
    return x.transpose(1, 2).reshape(batch, seq, heads * size)


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None, causal: bool = False
) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)


def attention_kernel(like: torch.Tensor, call: AttentionCall) -> str:
    """The kernel scaled_dot_product_attention's own dispatcher picks for these shapes, mask, dtype and device (flash,
    memory-efficient, cuDNN or the math fallback; flash takes no mask), for the dtype attention gets under the run's
    precision policy (bfloat16 under bf16_mixed, where flash attention qualifies)."""
    from torch.nn.attention import SDPBackend

    batch, heads, queries, size = call.shape
    dtype, grad = torch_precision.attention_dtype(like.dtype), call.differentiated
    q = torch.empty(call.shape, dtype=dtype, device=like.device, requires_grad=grad)
    k = torch.empty((batch, heads, call.keys, size), dtype=dtype, device=like.device, requires_grad=grad)
    mask = torch.ones((queries, call.keys), dtype=torch.bool, device=like.device) if call.masked else None
    choice = SDPBackend(torch._fused_sdp_choice(q, k, k, attn_mask=mask, is_causal=call.causal))
    return f"scaled_dot_product_attention: {choice.name.lower()}"


# -- convnet ops (NCHW, torch weight layouts) ----------------------------------------------------


def to_native_layout(array: np.ndarray) -> np.ndarray:
    return array  # torch layouts are the reference layouts


def from_native_layout(array: np.ndarray, per_example: bool = False) -> np.ndarray:
    return array


def from_nchw(x: torch.Tensor) -> torch.Tensor:
    return x


def to_nchw(x: torch.Tensor) -> torch.Tensor:
    return x


def conv2d(x, weight, bias=None, stride: int = 1, padding: int = 0):
    return F.conv2d(x, weight, bias, stride=stride, padding=padding)


def conv_transpose2d(x, weight, bias=None, stride: int = 1, padding: int = 0, output_padding: int = 0):
    return F.conv_transpose2d(x, weight, bias, stride=stride, padding=padding, output_padding=output_padding)


def batch_norm(x, mean, var, weight, bias, eps: float = 1e-5):
    return F.batch_norm(x, mean, var, weight, bias, training=False, eps=eps)


def instance_norm(x, eps: float = 1e-5):
    return F.instance_norm(x, eps=eps)


def max_pool2d(x, kernel: int, stride: int, padding: int = 0):
    return F.max_pool2d(x, kernel, stride, padding)


def adaptive_avg_pool2d(x, size: tuple[int, int]):
    return F.adaptive_avg_pool2d(x, size)


def reflection_pad2d(x, pad: int):
    return F.pad(x, (pad, pad, pad, pad), mode="reflect")


def flatten(x):
    return torch.flatten(x, 1)


tanh = torch.tanh


# -- torch modules (model=torchvision) and Keras 3 on torch (model=keras) ------------------------

KERAS_BACKEND = "torch"


def functional_call(module: torch.nn.Module, params: dict, x: torch.Tensor) -> torch.Tensor:
    return torch.func.functional_call(module, params, (x,))


# -- memory-layout ops (seeds 001 and 002) -------------------------------------------------------

FROM_HOST: dict[str, Callable[[np.ndarray], torch.Tensor]] = {  # numpy -> torch
    "from_numpy": torch.from_numpy,
    "as_tensor": torch.as_tensor,
    "tensor": torch.tensor,
    "from_dlpack": torch.from_dlpack,
}
RESHAPES = {
    "view": lambda x: x.view(-1),
    "reshape": lambda x: x.reshape(-1),
    "transpose_contiguous": lambda x: x.t().contiguous(),
    "transpose_reshape": lambda x: x.t().reshape(-1),
}


convert, reshape = table_layout_ops("torch", FROM_HOST, RESHAPES, to_host=lambda native: native.numpy())


def data_pointer(array) -> int:
    return array.data_ptr() if isinstance(array, torch.Tensor) else array.__array_interface__["data"][0]


from runner.backends.torch_decoder import *  # noqa: E402, F403 - op family `decoder` (model=gpt2)
