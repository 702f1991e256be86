"""The wheel's packages, found when it is built (the rest of the metadata is pyproject.toml's).

The code is under src/. conf/ stays beside run.py, where the docs and tests name it, and ships inside the wheel as
the package tensor_runner_conf (its config groups as subpackages), so an installed `tensor-runner` composes the same
configs through Hydra's pkg://tensor_runner_conf. conf/experiment is a link to experiments/: its files are copied in.
Found, not listed, so a package or config group added later ships without an edit here (tests/test_install.py).
"""

from setuptools import find_namespace_packages, setup

CONFIG_PACKAGE = "tensor_runner_conf"
CODE = find_namespace_packages("src", include=["runner", "runner.*", "hydra_plugins.*"], exclude=["*__pycache__*"])
CONFIGS = [f"{CONFIG_PACKAGE}.{group}" for group in find_namespace_packages("conf", exclude=["*__pycache__*"])]

setup(
    package_dir={"": "src", CONFIG_PACKAGE: "conf"},
    packages=[*CODE, CONFIG_PACKAGE, *CONFIGS],
    package_data={"": ["*.yaml"], "runner.models": ["*.txt"]},  # the configs; the classifiers' labels
)
