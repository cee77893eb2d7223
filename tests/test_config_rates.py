"""Dropout rates outside [0, 1) are refused by `TransformerConfig` in one line (issue 54, item 4).

Before: `dropout_rate=2.0`, `attention_dropout_rate=-0.1` or NaN were accepted (drop_path_rate was checked);
a rate of 1 or more drops everything (Flax's Dropout at rate 1 returns zeros), a negative one scales by 1/(1-r) < 1.
"""

import math

import pytest

from primal_jax.models.config import TransformerConfig
from primal_jax.validation import check_rate

BAD = (-0.1, 1.0, 2.0, math.nan, math.inf, "0.1", True)


@pytest.mark.parametrize("field", ["dropout_rate", "attention_dropout_rate", "drop_path_rate"])
@pytest.mark.parametrize("value", BAD)
def test_config_refuses_a_rate_outside_0_1(field, value):
  with pytest.raises(ValueError, match=rf"^{field} must be a number in \[0, 1\), got {value!r}$".replace("(", r"\(")):
    TransformerConfig(layers=("softmax",), **{field: value})


def test_a_layers_own_dropout_option_is_checked_too():
  with pytest.raises(ValueError, match=r"^layers\[0\] \(softmax\) attention option dropout_rate must be a number in"):
    TransformerConfig(layers=("softmax",), attention={"softmax": {"dropout_rate": 1.5}})


@pytest.mark.parametrize("value", [0, 0.0, 0.5, 0.999])
def test_rates_in_range_pass(value):
  check_rate(value, "rate")
  config = TransformerConfig(layers=("softmax",), dropout_rate=value, attention_dropout_rate=value)
  assert config.dropout_rate == value and config.layer_attention(0).dropout_rate == value
