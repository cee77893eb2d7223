"""Long Range Arena ListOps: our own deterministic generator, an independent checker, and the input pipeline.

Why generate instead of downloading: LRA's released `.tsv` files live outside the
package registries, and LRA's own generator cannot reproduce them (it collects
trees in a Python `set` of string-hashed tuples, so even its split assignment
changes with `PYTHONHASHSEED`). This package samples from the same distribution
as LRA's `lra_benchmarks/data/listops.py` with a seeded numpy Generator, so a
seed names one dataset on every machine.

  generate        the distribution (see its docstring) and `generate_listops(_splits)`
  evaluate        `evaluate_listops`, a stack machine sharing no code with the generator
  text            the vocabulary, LRA's text form, `tokenize_listops` / `listops_text`
  input_pipeline  cached splits (`load_listops_splits`) and `make_listops_pipeline` (task "listops")

Operators (the label is the root's value, one of 10 classes): MIN, MAX, MED
(LRA's `int(np.median(args))`) and SM (sum modulo 10); see `evaluate`.
Generation and checking need numpy only; the pipeline needs grain.
"""

from primal_jax.tasks.lra.listops.evaluate import evaluate_listops
from primal_jax.tasks.lra.listops.generate import (
  GENERATOR_VERSION,
  LRA_SIZES,
  OPERATOR_PROBABILITY,
  SPLITS,
  ListOpsParams,
  ListOpsSplit,
  generate_listops,
  generate_listops_splits,
)
from primal_jax.tasks.lra.listops.input_pipeline import (
  LRA_SEQ_LEN,
  listops_cache_path,
  load_listops_splits,
  make_listops_pipeline,
)
from primal_jax.tasks.lra.listops.text import (
  CLASS_NAMES,
  CLOSE_ID,
  DIGIT_OFFSET,
  FIRST_OPERATOR_ID,
  NUM_CLASSES,
  NUM_OPERATORS,
  PAD_ID,
  TOKEN_IDS,
  VOCAB,
  VOCAB_SIZE,
  listops_symbols,
  listops_text,
  tokenize_listops,
)

__all__ = [
  "CLASS_NAMES",
  "CLOSE_ID",
  "DIGIT_OFFSET",
  "FIRST_OPERATOR_ID",
  "GENERATOR_VERSION",
  "LRA_SEQ_LEN",
  "LRA_SIZES",
  "NUM_CLASSES",
  "NUM_OPERATORS",
  "OPERATOR_PROBABILITY",
  "PAD_ID",
  "SPLITS",
  "TOKEN_IDS",
  "VOCAB",
  "VOCAB_SIZE",
  "ListOpsParams",
  "ListOpsSplit",
  "evaluate_listops",
  "generate_listops",
  "generate_listops_splits",
  "listops_cache_path",
  "listops_symbols",
  "listops_text",
  "load_listops_splits",
  "make_listops_pipeline",
  "tokenize_listops",
]
