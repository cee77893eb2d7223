"""Long Range Arena ListOps: our own deterministic generator, an independent evaluator, and the input pipeline.

Why generate instead of downloading: LRA's released `.tsv` files live outside the
package registries, and LRA's own generator cannot reproduce them (it collects
trees in a Python `set` of string-hashed tuples, so even its split assignment
changes with `PYTHONHASHSEED`). This module samples from the same distribution
as LRA's `lra_benchmarks/data/listops.py` with a seeded numpy Generator, so a
seed names one dataset on every machine.

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
training expression).

Operators (the label is the root's value, one of 10 classes):

  MIN, MAX  smallest / largest argument
  MED       LRA's `int(np.median(args))`: the middle argument for an odd count;
            for an even count the mean of the two middle arguments rounded
            down (digits are >= 0, so int() truncation is floor), e.g.
            [MED 1 4 ] = 2 (statistics.median_low would give 1)
  SM        sum of the arguments modulo 10

Text: LRA's Source column writes every tree as nested binary tuples,
`[MAX 2 9 [MIN 4 7 ] 0 ]` as
`( ( ( ( ( [MAX 2 ) 9 ) ( ( ( [MIN 4 ) 7 ) ] ) ) 0 ) ] )`
(`listops_text`). LRA's input pipeline drops the parentheses, which carry no
information, and keeps the closing brackets (renamed "X" for its tokenizer),
so a model sees exactly the `length` tokens above. Token ids (LRA's encoder
numbers its 15 symbols in Python set order, which is not reproducible, so the
order here is ours; 0 is padding as in LRA, whose extra out-of-vocabulary id
never occurs in ListOps and is left out):

  id    0      1..10       11     12     13     14    15
  token <pad>  "0".."9"    [MIN   [MAX   [MED   [SM   ]

`evaluate_listops` parses text or token ids with a stack machine of its own,
sharing no evaluation code with the generator, so tests can check every
generated label against it.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import statistics
import tempfile
import types
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from primal_jax.data.aeon_wheel import default_cache_dir

if TYPE_CHECKING:
  from primal_jax.data.tasks import InputPipeline

PAD_ID = 0
VOCAB: tuple[str, ...] = ("<pad>", *(str(d) for d in range(10)), "[MIN", "[MAX", "[MED", "[SM", "]")
TOKEN_IDS: Mapping[str, int] = types.MappingProxyType({token: i for i, token in enumerate(VOCAB) if i != PAD_ID})
VOCAB_SIZE = len(VOCAB)
NUM_CLASSES = 10
CLASS_NAMES: tuple[str, ...] = tuple(str(d) for d in range(NUM_CLASSES))
DIGIT_OFFSET = TOKEN_IDS["0"]  # digit d has id d + DIGIT_OFFSET
FIRST_OPERATOR_ID = TOKEN_IDS["[MIN"]  # operator k of (MIN, MAX, MED, SM), LRA's order, has id FIRST_OPERATOR_ID + k
NUM_OPERATORS = 4
CLOSE_ID = TOKEN_IDS["]"]
OPERATOR_PROBABILITY = 0.25  # LRA's VALUE_P: a node above the depth limit is an operator with this probability

# The LRA defaults (lra_benchmarks/data/listops.py flags).
LRA_SIZES: Mapping[str, int] = types.MappingProxyType({"train": 96_000, "validation": 2_000, "test": 2_000})
LRA_SEQ_LEN = 2000

SPLITS: tuple[str, ...] = ("test", "validation", "train")  # generation order: test and validation never depend on
# the size of train. Each split has its own random stream, named by its position here.
_STREAM = 0x4C4F  # separates ListOps randomness from other uses of the same seed ("LO")
_FORMAT_VERSION = 1  # bump when a change alters generated data, so old caches are not reused
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
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ValueError(f"{name} must be an integer, got {value!r}")
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


# ----------------------------------------------------------------------------------------------------------------------
# Generator


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


def _check_count(value: Any, name: str) -> int:
  """`pipeline.check_nonnegative_int`, which this module cannot import without grain."""
  if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
    raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
  return int(value)


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
  return _generate(_check_count(num_examples, "num_examples"), (_check_count(seed, "seed"), _STREAM), params, set())


def _check_sizes(sizes: Mapping[str, int]) -> dict[str, int]:
  unknown = set(sizes) - set(SPLITS)
  if unknown:
    raise ValueError(f"sizes keys must be among {', '.join(SPLITS)}, got {sorted(unknown)}")
  return {split: _check_count(sizes.get(split, 0), f"sizes[{split!r}]") for split in SPLITS}


def generate_listops_splits(
  sizes: Mapping[str, int] = LRA_SIZES, *, seed: int, params: ListOpsParams | None = None
) -> dict[str, ListOpsSplit]:
  """Splits {"train", "validation", "test"} -> ListOpsSplit with no expression in two splits (not cached).

  Each split has its own stream of the seed; test is drawn first, then
  validation avoiding test, then train avoiding both, so the evaluation
  splits stay the same when only the number of training examples changes.
  """
  counts = _check_sizes(sizes)
  seed = _check_count(seed, "seed")
  params = params or ListOpsParams()
  seen: set[bytes] = set()
  # Streams 1, 2, 3: numpy's SeedSequence ignores trailing zeros, so (seed, _STREAM, 0) would repeat
  # generate_listops' (seed, _STREAM).
  splits = {split: _generate(counts[split], (seed, _STREAM, k), params, seen) for k, split in enumerate(SPLITS, 1)}
  return {split: splits[split] for split in ("train", "validation", "test")}


def _cache_key(counts: Mapping[str, int], seed: int, params: ListOpsParams) -> dict[str, Any]:
  return {"format": _FORMAT_VERSION, "seed": seed, "sizes": dict(counts), **dataclasses.asdict(params)}


def listops_cache_path(
  sizes: Mapping[str, int] = LRA_SIZES,
  *,
  seed: int,
  params: ListOpsParams | None = None,
  cache_dir: str | Path | None = None,
) -> Path:
  """`<cache_dir>/listops/<hash of sizes, seed, params>/`; cache_dir defaults to `aeon_wheel.default_cache_dir()`."""
  key = json.dumps(
    _cache_key(_check_sizes(sizes), _check_count(seed, "seed"), params or ListOpsParams()), sort_keys=True
  )
  root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
  return root / "listops" / hashlib.sha256(key.encode()).hexdigest()[:16]


def _atomic_write(path: Path, write: Callable[[Any], None]) -> None:
  """Write through a temporary file in the same folder, then rename, so readers never see a partial file."""
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
  try:
    with os.fdopen(fd, "wb") as f:
      write(f)
    os.replace(tmp, path)
  except BaseException:
    Path(tmp).unlink(missing_ok=True)
    raise


def _read_cache(folder: Path, key: Mapping[str, Any]) -> dict[str, ListOpsSplit] | None:
  """The cached splits, or None when absent, unreadable or written for other parameters."""
  try:
    if json.loads((folder / "params.json").read_text()) != key:
      return None
    with np.load(folder / "splits.npz") as z:
      splits = {
        split: ListOpsSplit(tokens=z[f"{split}_tokens"], offsets=z[f"{split}_offsets"], labels=z[f"{split}_labels"])
        for split in ("train", "validation", "test")
      }
  except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
    return None
  if any(len(splits[split]) != key["sizes"][split] for split in splits):
    return None
  return splits


def load_listops_splits(
  sizes: Mapping[str, int] = LRA_SIZES,
  *,
  seed: int,
  params: ListOpsParams | None = None,
  cache_dir: str | Path | None = None,
) -> dict[str, ListOpsSplit]:
  """`generate_listops_splits`, stored under `listops_cache_path(...)` on first use and read back afterwards.

  The folder holds `splits.npz` (per split: uint8 tokens back to back, int64
  offsets, uint8 labels) and `params.json` (what it was generated from). Both
  are written atomically, so a reader sees a whole cache or none, and a cache
  that is unreadable or does not match is regenerated. Generating LRA's
  96k/2k/2k examples takes about a minute; reading them back well under a
  second.
  """
  counts = _check_sizes(sizes)
  seed = _check_count(seed, "seed")
  params = params or ListOpsParams()
  key = _cache_key(counts, seed, params)
  folder = listops_cache_path(counts, seed=seed, params=params, cache_dir=cache_dir)
  cached = _read_cache(folder, key)
  if cached is not None:
    return cached
  splits = generate_listops_splits(counts, seed=seed, params=params)
  folder.mkdir(parents=True, exist_ok=True)
  arrays = {}
  for split, data in splits.items():
    arrays.update({f"{split}_tokens": data.tokens, f"{split}_offsets": data.offsets, f"{split}_labels": data.labels})
  _atomic_write(folder / "splits.npz", lambda f: np.savez_compressed(f, **arrays))
  _atomic_write(folder / "params.json", lambda f: f.write(json.dumps(key, sort_keys=True).encode()))
  return splits


# ----------------------------------------------------------------------------------------------------------------------
# Text form


def _symbols(expression: str | Sequence[int] | np.ndarray) -> list[str]:
  """The symbols of `expression` (VOCAB strings), parentheses dropped as LRA's tokenizer does, checked to balance.

  Token ids may end in padding (0), which is dropped; padding anywhere else
  is an error, as is any id or word outside the vocabulary.
  """
  if isinstance(expression, str):
    symbols, depth = [], 0
    for position, word in enumerate(expression.split()):
      if word == "(":
        depth += 1
      elif word == ")":
        depth -= 1
        if depth < 0:
          raise ValueError(f"expression has an unmatched ')' at word {position}")
      elif word in TOKEN_IDS:
        symbols.append(word)
      else:
        raise ValueError(f"expression has an unknown token {word!r} at word {position}; tokens are {VOCAB[1:]}")
    if depth:
      raise ValueError(f"expression has {depth} unclosed '('")
    return symbols
  ids = np.asarray(expression)
  if ids.ndim != 1 or not (ids.size == 0 or np.issubdtype(ids.dtype, np.integer)):
    raise ValueError(f"expression must be a string or a 1-D sequence of integer token ids, got shape {ids.shape}")
  real = np.flatnonzero(ids != PAD_ID)
  ids = ids[: real[-1] + 1] if real.size else ids[:0]  # trailing padding is not part of the expression
  for position, token in enumerate(ids.tolist()):
    if not 0 < token < VOCAB_SIZE:
      what = "padding (0) before the end" if token == PAD_ID else f"an unknown token id {token}"
      raise ValueError(f"expression has {what} at position {position}; ids lie in [1, {VOCAB_SIZE})")
  return [VOCAB[token] for token in ids.tolist()]


def tokenize_listops(expression: str) -> np.ndarray:
  """int32 [length] token ids of LRA text (with or without its parentheses): LRA's tokenisation, ids of VOCAB."""
  if not isinstance(expression, str):
    raise ValueError(f"expression must be a string, got {type(expression).__name__}")
  return np.array([TOKEN_IDS[s] for s in _symbols(expression)], dtype=np.int32)


def listops_text(tokens: Sequence[int] | np.ndarray, *, parens: bool = True) -> str:
  """Token ids as text: LRA's Source column (`parens=True`) or the plain bracket form.

  LRA writes an operator with arguments a1..ak as the left-nested pairs
  ((..((OP a1) a2)..ak) ]), each pair in "( ... )", so k + 1 "(" open before
  the operator and every argument and the "]" is followed by ")".
  """
  symbols = _symbols(tokens)
  if not parens:
    return " ".join(symbols)
  num_args: dict[int, int] = {}  # position of an operator -> its argument count
  open_ops: list[int] = []
  for position, symbol in enumerate(symbols):
    if open_ops and symbol != "]":
      num_args[open_ops[-1]] += 1
    if symbol.startswith("["):
      num_args[position] = 0
      open_ops.append(position)
    elif symbol == "]":
      if not open_ops:
        raise ValueError(f"expression has an unmatched ']' at position {position}")
      open_ops.pop()
  if open_ops:
    raise ValueError(f"expression has {len(open_ops)} unclosed operators")
  words: list[str] = []
  depth = 0  # operators open at this point
  for position, symbol in enumerate(symbols):
    if position in num_args:
      words.extend(["("] * (num_args[position] + 1) + [symbol])
      depth += 1
      continue
    if symbol == "]":
      depth -= 1
      words.extend(["]", ")"])  # the pair (... ]) of the operator itself
    else:
      words.append(symbol)
    if depth:  # the pair that ends with this argument of the enclosing operator; a lone digit is written bare
      words.append(")")
  return " ".join(words)


# ----------------------------------------------------------------------------------------------------------------------
# Independent evaluator


def _sum_mod_10(args: Sequence[int]) -> int:
  return functools.reduce(lambda total, x: (total + x) % 10, args, 0)


# Written apart from the generator's inline arithmetic on purpose: a test checks one against the other.
_EVALUATE: Mapping[str, Callable[[Sequence[int]], int]] = types.MappingProxyType(
  {
    "[MIN": min,
    "[MAX": max,
    "[MED": lambda args: int(statistics.median(args)),  # LRA: int(np.median(args)), floor of the mean of the middle two
    "[SM": _sum_mod_10,
  }
)


def evaluate_listops(expression: str | Sequence[int] | np.ndarray) -> int:
  """The value (label) of one ListOps expression given as text or token ids.

  Accepts LRA text with or without its parentheses, or token ids (trailing
  padding allowed). A bare digit is an expression too. An operator may take
  any positive number of arguments.

  Raises:
    ValueError: unknown token, unbalanced brackets or parentheses, an operator
      without arguments, an empty expression, or more than one top-level value.
  """
  symbols = _symbols(expression)
  if not symbols:
    raise ValueError("expression is empty")
  frames: list[tuple[str, list[int]]] = []  # open operators and the values of their arguments so far
  results: list[int] = []  # completed top-level values
  for position, symbol in enumerate(symbols):
    if symbol in _EVALUATE:
      frames.append((symbol, []))
      continue
    if symbol == "]":
      if not frames:
        raise ValueError(f"expression has an unmatched ']' at position {position}")
      operator, args = frames.pop()
      if not args:
        raise ValueError(f"operator {operator} closed at position {position} has no arguments")
      value = _EVALUATE[operator](args)
    else:
      value = int(symbol)
    (frames[-1][1] if frames else results).append(value)
  if frames:
    raise ValueError(f"expression has {len(frames)} unclosed operators (missing ']')")
  if len(results) != 1:
    raise ValueError(f"expression has {len(results)} top-level values; a ListOps expression is a single value")
  return results[0]


# ----------------------------------------------------------------------------------------------------------------------
# Input pipeline


def make_listops_pipeline(data_config: Any, *, process_index: int = 0, process_count: int = 1) -> InputPipeline:
  """The LRA ListOps InputPipeline: 10 classes, VOCAB_SIZE token ids, batches padded to `seq_len`.

  Reads from `data_config` (defaults: LRA's): num_train 96000,
  num_validation 2000, num_test 2000 (0 leaves a split out), min_length 500,
  max_length 2000, max_depth 10, max_args 10, seq_len 2000 (0: the longest
  example), data_seed (default `seed`; fixes the dataset, while `seed` also
  fixes the epoch orders), data_dir (cache root, default
  `aeon_wheel.default_cache_dir()`), and batch_size, eval_batch_size, seed.
  """
  from primal_jax.data.token_tasks import token_pipeline  # needs grain; generation and evaluation do not

  def get(key: str, default: Any = None) -> Any:
    return getattr(data_config, key, default)

  for key in ("batch_size", "eval_batch_size", "seed"):
    if get(key) is None:
      raise ValueError(f"data_config has no attribute {key!r}; ListOps needs batch sizes and a seed")
  sizes = {
    split: _check_count(get(f"num_{split}", LRA_SIZES[split]), f"num_{split}")
    for split in ("train", "validation", "test")
  }
  if sizes["train"] == 0:
    raise ValueError("num_train must be a positive integer, got 0")
  params = ListOpsParams(
    min_length=get("min_length", 500),
    max_length=get("max_length", 2000),
    max_depth=get("max_depth", 10),
    max_args=get("max_args", 10),
  )
  seed = _check_count(get("seed"), "seed")
  data_seed = seed if get("data_seed") is None else _check_count(get("data_seed"), "seed")
  splits = load_listops_splits(sizes, seed=data_seed, params=params, cache_dir=get("data_dir"))
  splits = {split: data for split, data in splits.items() if len(data)}
  seq_len = _check_count(get("seq_len", LRA_SEQ_LEN), "seq_len")
  if seq_len == 0:
    seq_len = int(max(data.lengths.max() for data in splits.values()))
  return token_pipeline(
    "listops",
    splits,
    CLASS_NAMES,
    VOCAB_SIZE,
    data_config,
    seq_len=seq_len,
    process_index=process_index,
    process_count=process_count,
  )
