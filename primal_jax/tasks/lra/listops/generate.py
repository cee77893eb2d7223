"""The ListOps generator: LRA's expression distribution drawn from a seeded numpy Generator.

The distribution (LRA's `generate_tree`, defaults max_depth=10, max_args=10):
the root sits at depth 1; a node at depth < max_depth is an operator with
probability 0.25, else a digit; a node at depth max_depth is always a digit, so
expressions nest at most max_depth - 1 operators. Digits are uniform over 0-9;
an operator is uniform over MIN, MAX, MED, SM and takes uniformly 2..max_args
arguments, each drawn the same way one level deeper. A tree's length is its
token count (operators, digits, closing brackets), and it is kept iff
min_length < length < max_length (strictly, as LRA's `length > min_length and
length < max_length`), so the LRA defaults 500/2000 give 501..1999 tokens. A
candidate is dropped as soon as it must end up too long; since length only
grows while a tree is drawn, that leaves the distribution of kept trees
unchanged and only saves time. As LRA collects trees in a set, every example
is unique across all splits of a dataset (no test expression is also a
training expression). The label is the root's value (`evaluate` checks it).
"""

from __future__ import annotations

import dataclasses
import hashlib
import types
from collections.abc import Mapping, Sequence

import numpy as np

from primal_jax.data.checks import check_integer, check_nonnegative_int
from primal_jax.tasks.lra.listops.text import CLOSE_ID, DIGIT_OFFSET, FIRST_OPERATOR_ID, NUM_OPERATORS, listops_text

OPERATOR_PROBABILITY = 0.25  # LRA's VALUE_P: a node above the depth limit is an operator with this probability

# The LRA defaults (lra_benchmarks/data/listops.py flags).
LRA_SIZES: Mapping[str, int] = types.MappingProxyType({"train": 96_000, "validation": 2_000, "test": 2_000})

SPLITS: tuple[str, ...] = ("test", "validation", "train")  # generation order: test and validation never depend on
# the size of train. Each split has its own random stream, named by its position here.
_STREAM = 0x4C4F  # separates ListOps randomness from other uses of the same seed ("LO")
GENERATOR_VERSION = 1  # bump when a change alters generated data, so old caches are not reused
_UNIFORM_BLOCK = 1 << 16
_MAX_DUPLICATES_IN_A_ROW = 10_000


@dataclasses.dataclass(frozen=True)
class ListOpsParams:
  """The shape of the expression distribution (LRA's generator flags); see the module docstring."""

  min_length: int = 500  # kept lengths are > min_length ...
  max_length: int = 2000  # ... and < max_length
  max_depth: int = 10  # tree levels counting the root at 1 and digit leaves: <= max_depth - 1 nested operators
  max_args: int = 10  # arguments per operator lie in [2, max_args]

  def __post_init__(self) -> None:
    for name in ("min_length", "max_length", "max_depth", "max_args"):
      check_integer(getattr(self, name), name)
    if self.min_length < 0:
      raise ValueError(f"min_length must be >= 0, got {self.min_length}")
    if self.max_depth < 2:
      raise ValueError(
        f"max_depth must be >= 2 (depth 1 is the root; operators need a level below), got {self.max_depth}"
      )
    if self.max_args < 2:
      raise ValueError(f"max_args must be >= 2 (LRA operators take 2..max_args arguments), got {self.max_args}")
    if self.max_length < self.min_length + 2:
      raise ValueError(
        f"max_length must be >= min_length + 2 (kept lengths lie strictly between them), got "
        f"min_length={self.min_length}, max_length={self.max_length}"
      )
    # Lengths are 1 (a lone digit) and 4 ("[OP d d ]") up to a full tree of max_args-ary operators.
    longest = 1
    for _ in range(self.max_depth - 1):
      longest = 2 + self.max_args * longest
      if longest > self.max_length:
        break
    digits_only = self.min_length < 1 < self.max_length
    if not digits_only and max(self.min_length + 1, 4) > min(longest, self.max_length - 1):
      raise ValueError(
        f"no expression with max_depth={self.max_depth}, max_args={self.max_args} has a length in "
        f"({self.min_length}, {self.max_length}); raise max_depth/max_args or lower min_length"
      )


@dataclasses.dataclass(frozen=True)
class ListOpsSplit(Sequence):
  """Examples in a ragged layout: example i has tokens[offsets[i]:offsets[i + 1]] and labels[i].

  A random-access source for the input pipeline: item i is
  {"tokens": int32 [length], "label": int, "index": i}.
  """

  tokens: np.ndarray  # [total] uint8 token ids, examples back to back
  offsets: np.ndarray  # [n + 1] int64, offsets[0] = 0
  labels: np.ndarray  # [n] uint8 in [0, 10)

  def __post_init__(self) -> None:
    n = len(self.labels)
    if self.offsets.shape != (n + 1,) or self.offsets[0] != 0 or self.offsets[-1] != len(self.tokens):
      raise ValueError(f"offsets must have shape [{n + 1}], start at 0 and end at {len(self.tokens)}")
    if n and np.any(np.diff(self.offsets) <= 0):
      raise ValueError("offsets must be strictly increasing (every example has at least one token)")

  def __len__(self) -> int:
    return len(self.labels)

  def __getitem__(self, i):  # Sequence's slice form is not needed by the pipeline.
    if isinstance(i, slice):
      raise TypeError("ListOpsSplit supports integer indices only")
    i = int(i)
    if not -len(self) <= i < len(self):
      raise IndexError(f"index {i} out of range for {len(self)} examples")
    i %= len(self)
    tokens = self.tokens[self.offsets[i] : self.offsets[i + 1]].astype(np.int32)
    return {"tokens": tokens, "label": int(self.labels[i]), "index": i}

  @property
  def lengths(self) -> np.ndarray:
    """[n] int64 token counts."""
    return np.diff(self.offsets)

  def text(self, i: int, *, parens: bool = True) -> str:
    """Example i as LRA's Source text (`listops_text`)."""
    return listops_text(self[i]["tokens"], parens=parens)


def _sample_tree(uniforms: list[float], pos: int, params: ListOpsParams) -> tuple[list[int] | None, int, int]:
  """(token ids, label, next pos), or (None, -1, next pos) once the tree must end up >= max_length tokens.

  Draws the tree depth first from `uniforms[pos:]`, at most 3 uniforms per
  token: a node's kind (only above the depth limit), then a digit, or an
  argument count and an operator. Operators are applied as their brackets
  close, so the label costs no second pass.
  """
  max_depth, max_args, max_length = params.max_depth, params.max_args, params.max_length
  span = max_args - 1
  tokens: list[int] = []
  stack: list[list] = []  # open operators: [operator index, arguments still to come, argument values]
  while True:
    above_limit = len(stack) + 1 < max_depth  # the new node's depth is len(stack) + 1
    if above_limit and uniforms[pos] < OPERATOR_PROBABILITY:
      num_args = 2 + int(uniforms[pos + 1] * span)
      operator = int(uniforms[pos + 2] * NUM_OPERATORS)
      pos += 3
      tokens.append(FIRST_OPERATOR_ID + operator)
      stack.append([operator, num_args, []])
    else:
      value = int(uniforms[pos + above_limit] * 10)  # the kind was drawn only above the depth limit
      pos += 1 + above_limit
      tokens.append(DIGIT_OFFSET + value)
      while stack:  # close every operator this digit completes
        frame = stack[-1]
        frame[2].append(value)
        frame[1] -= 1
        if frame[1]:
          break
        stack.pop()
        tokens.append(CLOSE_ID)
        operator, args = frame[0], frame[2]
        if operator == 0:
          value = min(args)
        elif operator == 1:
          value = max(args)
        elif operator == 2:
          ordered = sorted(args)
          value = (ordered[(len(ordered) - 1) // 2] + ordered[len(ordered) // 2]) // 2
        else:
          value = sum(args) % 10
      else:
        return tokens, value, pos
    if len(tokens) + len(stack) >= max_length:  # every open operator still needs its "]"
      return None, -1, pos


def _generate(num_examples: int, entropy: Sequence[int], params: ListOpsParams, seen: set[bytes]) -> ListOpsSplit:
  """`num_examples` kept trees from the stream `entropy`, skipping (and then adding to `seen`) known ones."""
  rng = np.random.default_rng(list(entropy))
  reserve = 3 * params.max_length + 3  # uniforms one candidate may draw at most
  uniforms: list[float] = []
  pos = 0
  chunks: list[bytes] = []
  lengths: list[int] = []
  labels: list[int] = []
  duplicates = 0
  while len(labels) < num_examples:
    if len(uniforms) - pos < reserve:
      uniforms = uniforms[pos:] + rng.random(max(_UNIFORM_BLOCK, reserve)).tolist()
      pos = 0
    tokens, label, pos = _sample_tree(uniforms, pos, params)
    if tokens is None or not params.min_length < len(tokens) < params.max_length:
      continue
    encoded = bytes(tokens)
    digest = hashlib.blake2b(encoded, digest_size=16).digest()
    if digest in seen:
      duplicates += 1
      if duplicates > _MAX_DUPLICATES_IN_A_ROW:
        raise ValueError(
          f"{_MAX_DUPLICATES_IN_A_ROW} duplicate expressions in a row after {len(seen)} unique ones: "
          f"lengths in ({params.min_length}, {params.max_length}) hold too few distinct expressions for the "
          "requested number of examples; widen the length range or ask for fewer examples"
        )
      continue
    duplicates = 0
    seen.add(digest)
    chunks.append(encoded)
    lengths.append(len(tokens))
    labels.append(label)
  offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
  np.cumsum(lengths, out=offsets[1:])
  return ListOpsSplit(
    tokens=np.frombuffer(b"".join(chunks), dtype=np.uint8).copy(),
    offsets=offsets,
    labels=np.array(labels, dtype=np.uint8),
  )


def generate_listops(
  num_examples: int,
  *,
  seed: int,
  min_length: int = 500,
  max_length: int = 2000,
  max_depth: int = 10,
  max_args: int = 10,
) -> ListOpsSplit:
  """`num_examples` distinct ListOps expressions and labels; the same arguments give the same examples.

  Not cached (see `load_listops_splits` for cached train/validation/test
  splits). At LRA's lengths (500/2000) this draws 1,500 to 2,000 examples
  per second on one core.
  """
  params = ListOpsParams(min_length=min_length, max_length=max_length, max_depth=max_depth, max_args=max_args)
  return _generate(
    check_nonnegative_int(num_examples, "num_examples"), (check_nonnegative_int(seed, "seed"), _STREAM), params, set()
  )


def check_sizes(sizes: Mapping[str, int]) -> dict[str, int]:
  unknown = set(sizes) - set(SPLITS)
  if unknown:
    raise ValueError(f"sizes keys must be among {', '.join(SPLITS)}, got {sorted(unknown)}")
  return {split: check_nonnegative_int(sizes.get(split, 0), f"sizes[{split!r}]") for split in SPLITS}


def generate_listops_splits(
  sizes: Mapping[str, int] = LRA_SIZES, *, seed: int, params: ListOpsParams | None = None
) -> dict[str, ListOpsSplit]:
  """Splits {"train", "validation", "test"} -> ListOpsSplit with no expression in two splits (not cached).

  Each split has its own stream of the seed; test is drawn first, then
  validation avoiding test, then train avoiding both, so the evaluation
  splits stay the same when only the number of training examples changes.
  """
  counts = check_sizes(sizes)
  seed = check_nonnegative_int(seed, "seed")
  params = params or ListOpsParams()
  seen: set[bytes] = set()
  # Streams 1, 2, 3: numpy's SeedSequence ignores trailing zeros, so (seed, _STREAM, 0) would repeat
  # generate_listops' (seed, _STREAM).
  splits = {split: _generate(counts[split], (seed, _STREAM, k), params, seen) for k, split in enumerate(SPLITS, 1)}
  return {split: splits[split] for split in ("train", "validation", "test")}
