"""ListOps' vocabulary, token ids and LRA's text form: parsing text into ids and writing ids as text.

LRA's Source column writes every tree as nested binary tuples,
`[MAX 2 9 [MIN 4 7 ] 0 ]` as
`( ( ( ( ( [MAX 2 ) 9 ) ( ( ( [MIN 4 ) 7 ) ] ) ) 0 ) ] )`
(`listops_text`). LRA's input pipeline drops the parentheses, which carry no
information, and keeps the closing brackets (renamed "X" for its tokenizer),
so a model sees exactly one token per operator, digit and "]". Token ids
(LRA's encoder numbers its 15 symbols in Python set order, which is not
reproducible, so the order here is ours; 0 is padding as in LRA, whose extra
out-of-vocabulary id never occurs in ListOps and is left out):

  id    0      1..10       11     12     13     14    15
  token <pad>  "0".."9"    [MIN   [MAX   [MED   [SM   ]
"""

from __future__ import annotations

import types
from collections.abc import Mapping, Sequence

import numpy as np

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


def listops_symbols(expression: str | Sequence[int] | np.ndarray) -> list[str]:
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
  return np.array([TOKEN_IDS[s] for s in listops_symbols(expression)], dtype=np.int32)


def listops_text(tokens: Sequence[int] | np.ndarray, *, parens: bool = True) -> str:
  """Token ids as text: LRA's Source column (`parens=True`) or the plain bracket form.

  LRA writes an operator with arguments a1..ak as the left-nested pairs
  ((..((OP a1) a2)..ak) ]), each pair in "( ... )", so k + 1 "(" open before
  the operator and every argument and the "]" is followed by ")".
  """
  symbols = listops_symbols(tokens)
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
