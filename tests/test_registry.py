"""primal_jax.registry.Registry: the one registry type behind attentions, tasks, models and objectives."""

import pytest

from primal_jax.errors import ConfigError
from primal_jax.registry import Lazy, Registry


def _positive(value):
  if not (isinstance(value, int) and value > 0):
    raise ValueError(f"value must be a positive int, got {value!r}")


def test_register_get_unregister_and_the_error_lists_the_names():
  reg = Registry("number", "config.number", _positive)
  reg.register("one", 1)
  reg.register("two", 2)
  assert reg.get("two") == 2 and reg["one"] == 1 and list(reg) == ["one", "two"] and len(reg) == 2
  with pytest.raises(ConfigError, match=r"^config.number must be one of \['one', 'two'\], got 'three'$"):
    reg.get("three")
  with pytest.raises(ConfigError, match=r"^where must be one of"):
    reg.get("three", "where")
  with pytest.raises(ValueError, match="already registered"):
    reg.register("one", 11)
  with pytest.raises(ValueError, match="positive int"):
    reg.register("bad", -1)
  reg.unregister("two")
  assert "two" not in reg
  with pytest.raises(ValueError, match="no number is registered as 'two'"):
    reg.unregister("two")


def test_a_replaced_builtin_comes_back_and_registered_cleans_up():
  reg = Registry("number", "n")
  reg.register("one", 1, builtin=True)
  with reg.registered("one", 100, replace=True):
    assert reg.get("one") == 100
  assert reg.get("one") == 1
  reg.unregister("one")  # a built-in entry stays
  assert reg.get("one") == 1
  with reg.registered("temp", 5):
    assert reg.get("temp") == 5
  assert "temp" not in reg


def test_lazy_entries_import_on_first_get_and_name_the_extra():
  reg = Registry("thing", "thing")
  reg.register("sqrt", Lazy("math:sqrt"), builtin=True)
  reg.register("missing", Lazy("no_such_module_xyz:f", ("rl",)), builtin=True)
  import math

  assert reg.lazy_entry("sqrt").module == "math"
  assert reg.get("sqrt") is math.sqrt
  assert reg.lazy_entry("sqrt") == Lazy("math:sqrt")  # still known after loading
  with pytest.raises(ConfigError, match=r"thing 'missing' needs the 'no_such_module_xyz' module.*primal-jax\[rl\]"):
    reg.get("missing")
  with pytest.raises(ValueError, match="'module:attribute'"):
    Lazy("math.sqrt")
