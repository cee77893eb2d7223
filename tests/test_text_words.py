"""primal_jax.tasks.lm.text_words: WikiText-style files -> vocabulary, int32 streams and next-token windows."""

from __future__ import annotations

import ml_collections
import numpy as np
import pytest

from primal_jax.data.registry import get_input_pipeline
from primal_jax.tasks.lm import text_words as tw

TRAIN = " = Valkyria Chronicles = \n\n the game is a <unk> game . the game \n the end \n"
VALID = " the game is new . \n"
TEST = " a game \n\n"


@pytest.fixture
def wikitext(tmp_path):
  root = tmp_path / "wikitext-103"
  root.mkdir()
  for name, text in zip(tw.SPLIT_FILES.values(), (TRAIN, VALID, TEST), strict=True):
    (root / name).write_text(text, encoding="utf-8")
  return root


def test_tokenize_appends_eos_per_line_as_fairseq():
  assert tw.tokenize(" a b \n\n c\n") == ["a", "b", "<eos>", "<eos>", "c", "<eos>"]


def test_vocabulary_is_by_count_then_alphabetical_and_round_trips(wikitext, tmp_path):
  streams, vocab = tw.load_streams(wikitext, cache_dir=tmp_path / "cache")
  assert vocab[:2] == ["<eos>", "<unk>"]
  assert vocab[2:5] == ["game", "the", "="]  # counts 4, 4 (ties alphabetical), 2
  assert len(vocab) == len(set(vocab))
  for split, text in (("train", TRAIN), ("test", TEST)):
    assert tw.decode(streams[split], vocab) == tw.tokenize(text)  # every word is in the training vocabulary
  assert tw.decode(streams["validation"], vocab) == ["the", "game", "is", "<unk>", ".", "<eos>"]  # "new" is unseen
  assert all(s.dtype == np.int32 for s in streams.values())
  again, vocab2 = tw.load_streams(wikitext, cache_dir=tmp_path / "cache")  # from the cache
  assert vocab2 == vocab and all(np.array_equal(again[s], streams[s]) for s in streams)
  assert len(list((tmp_path / "cache" / "text_words").iterdir())) == 1


def test_pipeline_windows_cover_every_target_once(wikitext, monkeypatch, tmp_path):
  monkeypatch.setenv("PRIMAL_JAX_DATA", str(tmp_path / "cache"))
  config = ml_collections.ConfigDict(
    dict(task="text_words", path=str(wikitext), seq_len=4, batch_size=2, eval_batch_size=2, seed=0)
  )
  pipeline = get_input_pipeline(config)
  streams, vocab = tw.load_streams(wikitext)
  assert pipeline.info.vocab_size == len(vocab)
  targets = []
  for batch in pipeline.eval_batches("train"):
    targets += batch["targets"][batch["weight"] > 0].tolist()
  assert targets == streams["train"][1:].tolist()


def test_a_missing_file_is_named(tmp_path):
  with pytest.raises(FileNotFoundError, match="wiki.train.tokens"):
    tw.load_streams(tmp_path)
