"""Any torchvision classifier (`model=torchvision model.arch=NAME`), run as torchvision's own module.

The module is called through `torch.func.functional_call` with the runner's parameters (the state dict's
floating-point entries, torch's names and layouts), so gradients, `torch.func.vmap` and `torch.compile`
work as for the built-in models. It needs the op family `torch_module`, which only the torch backend has:
other backends get one line pointing to the cross-framework routes (`supports.elsewhere` in its yaml).

Nothing heavy is imported at module level: the combination rules import this class before any framework.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import numpy as np

from runner.config import ConfigError
from runner.models import Workload
from runner.models.architectures import N_CLASSES
from runner.models.vision import top5

DEFAULT_IMAGE_SIZE = 224  # every torchvision classifier takes this size


class TorchvisionModel(Workload):
    builds_without_framework = False  # torchvision names its architectures
    """A torchvision classification model: seeded by torch (its own initialisation) or torchvision's weights."""

    numpy_reference = False  # no numpy implementation: torch is the only backend
    gradients = per_example_gradients = jacobian = None
    makes_images = False
    spec: dict[str, tuple]  # always: set in __init__

    def __init__(self, arch: str, image_size: int = DEFAULT_IMAGE_SIZE):
        import torch
        import torchvision

        known = torchvision.models.list_models(module=torchvision.models)
        if arch not in known:
            close = difflib.get_close_matches(arch, known, n=5, cutoff=0.4)
            hint = f"closest: {', '.join(close)}" if close else f"{len(known)} archs, e.g. {', '.join(known[:5])}"
            raise ConfigError(f"model.arch={arch} is not a torchvision classifier ({hint})")
        self.name, self.arch, self.image_size = arch, arch, image_size
        self._torch = torch
        with torch.device("meta"):  # shapes only: cheap even for the largest archs
            self._meta_module = torchvision.models.get_model(arch, weights=None).eval()
        self.spec = {k: tuple(v.shape) for k, v in self._meta_module.state_dict().items() if v.is_floating_point()}
        self._buffers = {name for name, _ in self._meta_module.named_buffers()}
        self.module: torch.nn.Module | None = None  # built by init_params

    def init_params(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """torchvision's own initialisation for this arch, seeded from the run's seed. Builds the module that
        `forward` calls (here, not lazily: its random initialisation must not run inside vmap or compile)."""
        import torchvision

        self._torch.manual_seed(int(rng.integers(2**31)))
        self.module = module = torchvision.models.get_model(self.arch, weights=None).eval()
        return {k: v.detach().double().numpy() for k, v in module.state_dict().items() if k in self.spec}

    def trainable(self, name: str) -> bool:
        return name not in self._buffers  # batch-norm statistics are constants

    def make_inputs(self, rng: np.random.Generator, batch_size: int) -> dict[str, np.ndarray]:
        self.check_size(self.image_size)
        x = rng.standard_normal((batch_size, 3, self.image_size, self.image_size))
        return {"x": x, "labels": self.make_labels(rng, x)}

    def make_labels(self, rng: np.random.Generator, x: np.ndarray) -> np.ndarray:
        return rng.standard_normal((len(x), N_CLASSES)) * 0.1

    def examples_per_call(self, batch_size: int) -> int:
        return batch_size

    def forward(self, ops, params: dict, x):
        return ops.functional_call(self.module, params, x)

    def loss(self, ops, params: dict, x, labels):
        """Sum of squared error against seeded targets, as for the built-in vision models."""
        return ops.sum(ops.square(self.forward(ops, params, x) - labels))

    def interpret(self, y: np.ndarray) -> dict:
        return {"predictions": top5(y)}

    def pretrained_path(self) -> Path:
        """torchvision's file for this arch's default weights in the local torch hub cache (never downloaded)."""
        return Path(self._torch.hub.get_dir()) / "checkpoints" / Path(self._weights().url).name

    def preprocess(self, image) -> np.ndarray:
        """A PIL image -> float64 CHW, through the arch's own weights' `transforms()` (resize, crop, normalise)."""
        return self._weights().transforms()(image).double().numpy()

    def _weights(self):
        import torchvision

        try:
            return torchvision.models.get_model_weights(self.arch).DEFAULT
        except ValueError:
            raise ConfigError(f"model.arch={self.arch} has no published torchvision weights") from None

    def check_images(self, x: np.ndarray, source: str) -> None:
        self.check_size(min(x.shape[-2:]), source)

    def check_size(self, size: int, source: str = "data.image_size") -> None:
        """One line with the smallest size this arch takes when it cannot take `size`."""
        if self._fits(size):
            return
        smallest = self._smallest_size(size)
        raise ConfigError(
            f"model.arch={self.arch} cannot take {size}x{size} images ({source}): the smallest size it takes is "
            f"{smallest} (data.image_size={smallest})"
        )

    def _fits(self, size: int) -> bool:
        x = self._torch.empty(1, 3, size, size, device="meta")
        try:
            with self._torch.no_grad():
                self._meta_module(x)
        except (RuntimeError, ValueError, AssertionError, IndexError, TypeError):
            return False
        return True

    def _smallest_size(self, failing: int) -> int:
        """The smallest size the forward pass takes: bisected below the first of 224 and 512 that works."""
        high = next((s for s in (DEFAULT_IMAGE_SIZE, 512) if self._fits(s)), None)
        if high is None:
            raise ConfigError(f"model.arch={self.arch} cannot take {failing}x{failing} images (nor 224x224 or 512x512)")
        low = failing if failing < high else 0
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (low, middle) if self._fits(middle) else (middle, high)
        return high
