"""tensor-runner's Hydra configs, shipped in the wheel as the package `tensor_runner_conf` (pyproject.toml's
package-dir): an installed `tensor-runner` composes them through Hydra's pkg://tensor_runner_conf search path."""
