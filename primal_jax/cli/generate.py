r"""`primal-generate`: text from a trained byte-level language model (a workdir of the `lm` config).

  primal-generate --workdir=/tmp/lm_primalformer --prompt="Anarchism is" \
    --prompt="The " --max_new_tokens=200 --temperature=0.8 --top_p=0.95 --seed=0

(the console script; `python -m experiments.generate ...` in a checkout runs the same `main`).

Loads the run's config and checkpoint (the latest, or `--step`), encodes each prompt as UTF-8 bytes and
samples `--max_new_tokens` bytes after it (`primal_jax.models.generation`: Primal layers decode from their
O(1) running sums, softmax layers from a key/value cache; the prompts are prefilled in chunks; one compiled
step for the whole batch). Prints each prompt followed by its continuation (invalid UTF-8 shown as U+FFFD).
Sampling is per prompt: a prompt's continuation is what it gives alone with the same `--seed`, whatever the
other prompts (identical prompts get identical continuations; vary `--seed` for other samples). User errors (no
checkpoint, a model that is not a causal LM, an empty or too long prompt, top_p outside (0, 1], a temperature
between 0 and 1.18e-38, a seed outside 64 bits) end in one line on stderr and exit status 2.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence


def generate_from_run(
  workdir: str, prompts: Sequence[str], *, max_new_tokens: int, temperature: float, top_k: int, top_p: float,
  seed: int, step: int | None = None, prefill_chunk: int = 64,
) -> list[str]:  # fmt: skip
  """The continuation of every prompt, decoded from bytes (see the module doc)."""
  from primal_jax.models import generation
  from primal_jax.training.experiment import load_run_config, load_state

  options = generation.SamplingOptions(temperature=temperature, top_k=top_k, top_p=top_p)
  if any(not p for p in prompts):  # refused here, before the checkpoint is loaded
    raise ValueError("--prompt must not be empty: a causal LM needs at least one byte to condition on")
  if max_new_tokens < 1:
    raise ValueError(f"--max_new_tokens must be >= 1, got {max_new_tokens}")
  config = load_run_config(workdir)
  if config.model.name != "lm":
    raise ValueError(
      f"--workdir {workdir} holds a {config.model.name!r} model; generation needs a causal language model "
      "(model.name='lm', the lm config)"
    )
  if config.data.task != "text_bytes":
    raise ValueError(f"--workdir {workdir}: prompts are encoded as bytes; its task is {config.data.task!r}")
  ids = [list(p.encode("utf-8")) for p in prompts]
  _check_checkpoint(workdir, step)
  # A step named by --step is read as it is, whatever the state of the latest one (its own restore verifies it).
  experiment, state = load_state(config, workdir, step=step, allow_corrupt=step is not None)
  out = generation.generate(
    experiment.built.module, state.params, ids, max_new_tokens=max_new_tokens, options=options, seed=seed,
    prefill_chunk=prefill_chunk,
  )  # fmt: skip
  return [bytes(tokens).decode("utf-8", errors="replace") for tokens in out]


def _check_checkpoint(workdir: str, step: int | None) -> None:
  """ValueError telling a CLI user what to pass unless `workdir` holds a checkpoint (of `step`, if given)."""
  from pathlib import Path

  from primal_jax.training.checkpointing.format import WORKDIR_SUBDIR

  directory = Path(workdir) / WORKDIR_SUBDIR
  steps = sorted(int(d.name) for d in directory.iterdir() if d.name.isdigit()) if directory.is_dir() else []
  if not steps:
    raise ValueError(
      f"--workdir {workdir} holds no checkpoint (nothing in {directory}): pass --workdir of a run that saved one "
      "(python -m experiments.main --config=lm ... --workdir=DIR trains one)"
    )
  if step is not None and step not in steps:
    raise ValueError(f"--step {step}: {directory} holds the steps {steps}; pass one of them (no --step: the latest)")
  if step is None:
    _check_latest_readable(workdir, directory, steps)


def _check_latest_readable(workdir: str, directory, steps: list[int]) -> None:
  """ValueError naming --step (the flag a CLI user has) when the latest checkpoint cannot be opened; the
  Checkpointer's own refusal speaks to Python callers (allow_corrupt=True), which this command is not."""
  from primal_jax.training.checkpointing.checkpointer import Checkpointer
  from primal_jax.training.checkpointing.format import CheckpointError

  try:
    Checkpointer(directory, max_to_keep=None).close()  # reads each step's small records, no array data
  except CheckpointError as err:
    text = str(err)
    if "Cause: " in text:  # "... or pass allow_corrupt=True to open DIR anyway (...). Cause: <reason>"
      text = f"the latest checkpoint {directory / str(steps[-1])} is unreadable ({text.rpartition('Cause: ')[2]})"
    earlier = err.previous_good
    if earlier is None:
      earlier = max((s for s in steps if s < steps[-1]), default=None)
    action = (
      f"pass --step={earlier} to generate from an earlier step (saved: {steps}), or move the damaged step away"
      if earlier is not None
      else "no earlier step was saved: train the run again"
    )
    raise ValueError(f"--workdir {workdir}: {' '.join(text.split()).rstrip('.')}; {action}") from err


def main(argv: Sequence[str] | None = None) -> None:
  from absl import flags

  fv = flags.FlagValues()
  on = {"flag_values": fv}
  flags.DEFINE_string("workdir", None, "Run directory of an LM run (config.json, checkpoints/).", **on)
  flags.DEFINE_multi_string("prompt", None, "A prompt; repeat for a batch (lengths may differ).", **on)
  flags.DEFINE_integer("max_new_tokens", 200, "Bytes to generate after each prompt.", **on)
  flags.DEFINE_float("temperature", 1.0, "Softmax temperature; 0 is greedy.", **on)
  flags.DEFINE_integer("top_k", 0, "Keep the k most probable bytes (0: all).", **on)
  flags.DEFINE_float("top_p", 1.0, "Nucleus: the smallest most-probable set reaching this mass, in (0, 1].", **on)
  flags.DEFINE_integer(
    "seed", 0, "Sampling seed (64-bit); a prompt's continuation depends on it and the prompt only.",
    lower_bound=-(2**63), upper_bound=2**63 - 1, **on,
  )  # fmt: skip
  flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).", **on)
  flags.DEFINE_integer("prefill_chunk", 64, "Prompt tokens fed per prefill call.", **on)
  flags.mark_flags_as_required(["workdir", "prompt"], flag_values=fv)
  try:
    rest = fv(list(sys.argv if argv is None else argv))
    if len(rest) > 1:
      raise ValueError(f"unexpected positional arguments: {rest[1:]}")
    start = time.perf_counter()
    texts = generate_from_run(
      fv.workdir, fv.prompt, max_new_tokens=fv.max_new_tokens, temperature=fv.temperature, top_k=fv.top_k,
      top_p=fv.top_p, seed=fv.seed, step=fv.step, prefill_chunk=fv.prefill_chunk,
    )  # fmt: skip
  except (flags.Error, ValueError, FileNotFoundError) as err:
    sys.stderr.write(f"error: {err}\n")
    sys.exit(2)
  for prompt, text in zip(fv.prompt, texts, strict=True):
    print(f"--- {prompt!r}\n{prompt}{text}\n")
  tokens = len(texts) * fv.max_new_tokens
  print(f"{tokens} bytes in {time.perf_counter() - start:.1f} s (loading and compiling included)")


if __name__ == "__main__":
  main()
