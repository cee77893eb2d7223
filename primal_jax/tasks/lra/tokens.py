"""Input pipelines of token-sequence classification tasks (Long Range Arena).

A task supplies its splits as random-access sequences of examples
{"tokens": int [length], "label": int, "index": int} (plus "tokens2" for
two-document retrieval); this module turns them into the same `InputPipeline`
the UEA tasks use, with `TokenCollate` batches:

  inputs  int32   [b, seq_len]   token ids, 0 = padding
  mask    bool    [b, seq_len]
  label, weight, index           as for UEA (weight 0 marks padding rows)
  inputs2, mask2                 second document (retrieval only)
"""

from __future__ import annotations

import types
from collections.abc import Mapping, Sequence
from typing import Any

from primal_jax.data.core import DatasetInfo, InputPipeline, TokenCollate, pipeline_from_config
from primal_jax.data.pipeline import Example


def token_pipeline(
  name: str,
  splits: Mapping[str, Sequence[Example]],
  class_names: Sequence[str],
  vocab_size: int,
  data_config: Any,
  *,
  seq_len: int,
  pairs: bool = False,
  process_index: int = 0,
  process_count: int = 1,
) -> InputPipeline:
  """An InputPipeline over token examples; `splits` must hold "train" and may hold "validation"/"test".

  `seq_len` is the fixed padded length (LRA: 2000 for ListOps, 1024 for
  Pathfinder and Image, 4000 for Text and Retrieval); longer sequences keep
  their first `seq_len` tokens.
  """
  if "train" not in splits:
    raise ValueError(f"splits must include 'train', got {sorted(splits)}")
  unknown = set(splits) - {"train", "validation", "test"}
  if unknown:
    raise ValueError(f"split names must be train/validation/test, got {sorted(unknown)}")
  info = DatasetInfo(
    name=name,
    num_classes=len(class_names),
    num_features=1,
    seq_len=seq_len,
    max_length=seq_len,
    split_sizes=types.MappingProxyType({k: len(v) for k, v in splits.items()}),
    class_names=tuple(class_names),
    vocab_size=vocab_size,
  )
  return pipeline_from_config(
    data_config,
    info,
    splits,
    TokenCollate(seq_len, vocab_size, pairs),
    process_index=process_index,
    process_count=process_count,
  )
