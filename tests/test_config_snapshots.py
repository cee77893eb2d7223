"""Every packaged config builds the same ConfigDict as before issue 27 moved the configs into their families.

tests/data/config_snapshots.json holds, per config name and `:arg`, the sha256 of `get_config(arg).to_dict()`
(sorted compact JSON) taken before the move, and the whole dict for the documented args, so a failure names
the keys that changed.
"""

import hashlib
import json
from pathlib import Path

import pytest

from primal_jax.cli.config_lookup import config_function

SNAPSHOT = json.loads((Path(__file__).parent / "data" / "config_snapshots.json").read_text())


def _as_json(name: str, arg: str):
  config = config_function(name)(arg or None)
  return json.loads(json.dumps(config.to_dict(), sort_keys=True, default=repr))


def _digest(value) -> str:
  return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@pytest.mark.parametrize("name", sorted(SNAPSHOT["sha256"]))
def test_every_recorded_arg_builds_the_same_config(name):
  changed = [arg for arg, digest in SNAPSHOT["sha256"][name].items() if _digest(_as_json(name, arg)) != digest]
  assert not changed, f"--config={name}:<arg> builds another config than before for {changed}"


@pytest.mark.parametrize(
  ("name", "arg"), [(name, arg) for name, args in sorted(SNAPSHOT["full"].items()) for arg in sorted(args)]
)
def test_documented_args_build_the_same_dict(name, arg):
  assert _as_json(name, arg) == SNAPSHOT["full"][name][arg]
