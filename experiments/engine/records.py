"""Records: a sweep run's result.json, the JSON record of a one-off experiment binary, and the mapping that turns
a recorded command into the one that runs now (experiments/results/recorded_commands.json)."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

from primal_jax.atomic_files import read_json, write_json_atomically

RESULT_FILE = "result.json"  # runs/<hash>/result.json: the record of a finished sweep run; its presence means done
COMMAND_MAP = Path(__file__).resolve().parents[1] / "results" / "recorded_commands.json"


def write_record(path: str | Path, record: Any) -> None:
  """`record` as indented JSON at `path`, atomically: a reader sees the old file, or none, or the whole new one."""
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  write_json_atomically(path, record, indent=1, default=str)


def read_result(run_dir: str | Path) -> dict | None:
  """The run's result.json, None if it has none; a damaged one is a DamagedFileError naming it."""
  path = Path(run_dir) / RESULT_FILE
  return read_json(path, "a finished run's record") if path.exists() else None


def existing_record_error(out: str | Path | None, overwrite: bool) -> str | None:
  """The message refusing to replace a recorded result at `out` without `--overwrite`; None when writing is fine."""
  if out is None or overwrite or not Path(out).exists():
    return None
  return f"--out {out} exists (a recorded result); pass --overwrite to replace it, or another --out"


def read_jsonl(path: str | Path) -> list[dict]:
  """The records of a JSON-lines file (metrics.jsonl), [] if it does not exist."""
  path = Path(path)
  if not path.exists():
    return []
  return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@functools.cache
def _config_map() -> tuple[tuple[str, str], ...]:
  mapping = read_json(COMMAND_MAP, "the recorded-command mapping")["config"]
  return tuple(sorted(mapping.items(), key=lambda item: -len(item[0])))


def current_config(spec: str) -> str:
  """The `--config` value that runs now for a recorded one: `experiments/configs/uea.py:smoke` (a file that
  is gone; also under any directory, as benchmark records name it absolute) -> `uea:smoke`; any other unchanged."""
  path, sep, arg = spec.partition(":")
  for old, new in _config_map():
    if path == old or path.endswith("/" + old):
      return new + sep + arg
  return spec


def current_command(command: str) -> str:
  """A recorded command line with every `--config=...` value mapped by `current_config`."""
  return re.sub(r"(--config=)(\S+)", lambda m: m.group(1) + current_config(m.group(2)), command)
