"""`with registered_X(name, value, replace=True)` restores exactly the state before the block (issue 54, item 9).

Before: the block's exit called `unregister`, which put the built-in back (not the user's own entry the block
replaced) and deleted a user's entry that the block registered again. Checked on the attention registry and
the objectives registry (the one `Registry` class is behind both), and on a bare `Registry`.
"""

import dataclasses

import pytest

from primal_jax.attention.registry import (
  ATTENTIONS,
  get_attention,
  register_attention,
  registered_attention,
  unregister_attention,
)
from primal_jax.attention.softmax import SoftmaxAttention
from primal_jax.registry import Registry
from primal_jax.training.objectives import (
  OBJECTIVES,
  NextToken,
  get_objective,
  register_objective,
  registered_objective,
  unregister_objective,
)


class MineA(SoftmaxAttention):
  pass


class MineB(SoftmaxAttention):
  pass


def test_attention_block_over_a_replaced_builtin_gives_back_the_users_entry():
  builtin = get_attention("softmax")
  register_attention("softmax", MineA, replace=True)
  try:
    with registered_attention("softmax", MineB, replace=True):
      assert get_attention("softmax") is MineB
    assert get_attention("softmax") is MineA  # before: the built-in SoftmaxAttention
  finally:
    unregister_attention("softmax")
  assert get_attention("softmax") is builtin


def test_attention_block_over_a_users_entry_keeps_it():
  register_attention("mine_h2", MineA)
  try:
    with registered_attention("mine_h2", MineB, replace=True):
      assert get_attention("mine_h2") is MineB
    assert get_attention("mine_h2") is MineA  # before: deleted
  finally:
    unregister_attention("mine_h2")
  assert "mine_h2" not in ATTENTIONS


def test_attention_block_of_a_new_name_leaves_nothing_behind_even_if_replaced_inside():
  with registered_attention("mine_h2", MineA):
    register_attention("mine_h2", MineB, replace=True)
  assert "mine_h2" not in ATTENTIONS
  with registered_attention("softmax", MineA, replace=True):
    register_attention("softmax", MineB, replace=True)
  assert get_attention("softmax") is SoftmaxAttention
  unregister_attention("softmax")  # a built-in that is not replaced stays
  assert get_attention("softmax") is SoftmaxAttention


@dataclasses.dataclass(frozen=True)
class _Tagged(NextToken):
  tag: str = ""


def test_objective_blocks_restore_the_users_entries():
  builtin = get_objective("next_token")
  mine, other = _Tagged(tag="mine"), _Tagged(tag="other")
  register_objective("next_token", mine, replace=True)
  register_objective("mine_h2", mine)
  try:
    with registered_objective("next_token", other, replace=True), registered_objective("mine_h2", other, replace=True):
      assert get_objective("next_token") is other and get_objective("mine_h2") is other
    assert get_objective("next_token") is mine and get_objective("mine_h2") is mine
  finally:
    unregister_objective("next_token")
    unregister_objective("mine_h2")
  assert get_objective("next_token") is builtin and "mine_h2" not in OBJECTIVES


def test_nested_blocks_unwind_in_order():
  reg = Registry("number", "n")
  reg.register("x", 1, builtin=True)
  reg.register("x", 2, replace=True)
  with reg.registered("x", 3, replace=True):
    with reg.registered("x", 4, replace=True):
      assert reg.get("x") == 4
    assert reg.get("x") == 3
  assert reg.get("x") == 2
  reg.unregister("x")
  assert reg.get("x") == 1


def test_a_refused_block_changes_nothing():
  reg = Registry("number", "n")
  reg.register("x", 1)
  with pytest.raises(ValueError, match="already registered"), reg.registered("x", 2):
    pass
  assert reg.get("x") == 1
