"""The experiment families, one folder each, and the one list of them (`FAMILIES`).

A family's folder holds its config (`config.py`, `get_config(arg)`, named on the command line:
`primal-train --config=uea:smoke`), its input pipeline(s) and its own data code; it never imports another
family's folder (what two families share lives in `primal_jax.data` or `primal_jax.tasks.common`). The
families::

  uea/         UEA multivariate time-series classification (paper Table 1)
  lra/         Long Range Arena: listops/, pathfinder/, text, retrieval, image (Table 2)
  vision/      image classification with ViTs (Table 5)
  lm/          byte- and word-level causal language modelling
  offline_rl/  D4RL-style offline RL with the Decision Transformer (Table 4), its datasets, behaviour policies
               (package data) and their SAC trainer
  uncertainty/ KEP-SVGP against softmax ViTs (MSP, temperature, MC dropout, ensembles): failure prediction,
               calibration, corruptions, OOD (issue 56); trains on the vision family's `images` task

Importing this package registers every family's tasks in the task registry (`primal_jax.data.registry`) and
its config name in `CONFIGS`, all as lazy `"module:attribute"` entries: nothing of a family is imported
until a config or a `data.task` names it. Adding a task is its module in its family's folder plus its line
below; adding a family is its folder plus one `Family` entry.
"""

from __future__ import annotations

import dataclasses

from primal_jax.data.registry import register_task
from primal_jax.registry import Lazy, Registry


@dataclasses.dataclass(frozen=True)
class Family:
  """A family's folder (`primal_jax.tasks.<folder>`), its config name, its tasks ({task: "module:function"},
  the module relative to the folder) and the setup.cfg extras that install their imports."""

  folder: str
  config: str
  tasks: dict[str, str]
  extras: tuple[str, ...] = ("train",)

  @property
  def package(self) -> str:
    return f"{__name__}.{self.folder}"

  def task_entries(self) -> dict[str, Lazy]:
    return {task: Lazy(f"{self.package}.{target}", self.extras) for task, target in self.tasks.items()}

  def config_entry(self) -> Lazy:
    return Lazy(f"{self.package}.config:get_config", self.extras)


FAMILIES: tuple[Family, ...] = (
  Family("uea", "uea", {"uea": "input_pipeline:make_uea_pipeline"}),
  Family(
    "lra",
    "lra",
    {
      "listops": "listops:make_listops_pipeline",
      "pathfinder": "pathfinder:make_pathfinder_pipeline",
      "lra_image": "image:make_lra_image_pipeline",
      "lra_text": "text:make_lra_text_pipeline",
      "lra_retrieval": "retrieval:make_lra_retrieval_pipeline",
    },
  ),
  Family("vision", "vit", {"images": "input_pipeline:make_image_pipeline"}),
  Family(
    "lm",
    "lm",
    {"text_bytes": "text_bytes:make_text_bytes_pipeline", "text_words": "text_words:make_text_words_pipeline"},
  ),
  Family("offline_rl", "d4rl", {"d4rl": "input_pipeline:make_offline_rl_pipeline"}, ("train", "rl")),
  Family("uncertainty", "uncertainty", {}),
)


def _check_config(get_config) -> None:
  if not callable(get_config):
    raise ValueError(f"a config must be its get_config(arg) function, got {get_config!r}")


# config name -> get_config(arg): what `--config=NAME[:arg]` runs (`primal_jax.cli.config_lookup`).
CONFIGS: Registry = Registry("config", "--config", _check_config)


def register_config(name: str, get_config, *, replace: bool = False) -> None:
  """Makes `--config=name[:arg]` build `get_config(arg)`."""
  CONFIGS.register(name, get_config, replace=replace)


def unregister_config(name: str) -> None:
  """Removes a config added by `register_config` (a replaced built-in gets its own back)."""
  CONFIGS.unregister(name)


def registered_config(name: str, get_config, *, replace: bool = False):
  """`register_config` for the duration of a `with` block."""
  return CONFIGS.registered(name, get_config, replace=replace)


def get_config_function(name: str):
  """The `get_config(arg)` registered as `name` (imported now if it is a built-in not used yet)."""
  return CONFIGS.get(name)


for _family in FAMILIES:
  CONFIGS.register(_family.config, _family.config_entry(), builtin=True)
  for _task, _entry in _family.task_entries().items():
    register_task(_task, _entry, builtin=True)
