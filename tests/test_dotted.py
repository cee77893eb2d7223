"""primal_jax.dotted: the one dotted-key setter (and getter) for configs and nested mappings."""

import ml_collections
import pytest

from primal_jax.dotted import get_dotted, set_dotted
from primal_jax.errors import ConfigError


def _config():
  return ml_collections.ConfigDict({"optimizer": {"learning_rate": 1e-3}, "seed": 0})


def test_set_dotted_sets_an_existing_field_and_names_a_missing_one():
  config = _config()
  set_dotted(config, "optimizer.learning_rate", 0.5)
  set_dotted(config, "seed", 3)
  assert config.optimizer.learning_rate == 0.5 and config.seed == 3
  with pytest.raises(ConfigError, match="'optimizer.nope': the config has no field 'nope'"):
    set_dotted(config, "optimizer.nope", 1)
  with pytest.raises(ConfigError, match="no field 'model'"):
    set_dotted(config, "model.dim", 1)


def test_set_dotted_new_leaf_adds_an_option_to_an_unlocked_config_only():
  config = _config()
  set_dotted(config, "optimizer.beta", 0.9, new_leaf=True)
  assert config.optimizer.beta == 0.9
  config.lock()
  with pytest.raises(KeyError, match="cannot be added since the config is locked"):
    set_dotted(config, "optimizer.gamma", 0.1, new_leaf=True)


def test_get_dotted_reads_nested_mappings_with_a_default():
  record = {"xla_memory": {"total_bytes": 10, "peak": None}, "n": 1}
  assert get_dotted(record, "xla_memory.total_bytes") == 10
  assert get_dotted(record, "xla_memory.peak") is None
  assert get_dotted(record, "rss.peak_delta_bytes", default=-1) == -1
  assert get_dotted(record, "n.more") is None
  assert get_dotted(_config(), "optimizer.learning_rate") == 1e-3
