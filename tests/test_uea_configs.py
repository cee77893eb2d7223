"""The `uea` config (primal_jax/tasks/uea/config.py) for the ten datasets of the paper's Table 1 x three model
families: each loads, builds its model for the dataset's shapes (abstractly, no data), and carries the paper's
settings."""

from __future__ import annotations

import inspect
import re
import types

import jax
import numpy as np
import pytest

from primal_jax.cli.config_lookup import load_config
from primal_jax.models.registry import build_model
from primal_jax.tasks.uea import config as UEA
from primal_jax.tasks.uea.tfds_dataset import TABLE1_DATASETS

CONFIG = "uea"
MODELS = ("softmax", "primalformer", "primal_plus")  # Trans., PrimalFormer, Primal.+Trans.

# (channels, longest series, classes) of each problem in the UEA archive (Multivariate2018_ts).
SHAPES = {
  "EthanolConcentration": (3, 1751, 4),
  "FaceDetection": (144, 62, 2),
  "Handwriting": (3, 152, 26),
  "Heartbeat": (61, 405, 2),
  "JapaneseVowels": (12, 29, 9),
  "PEMS-SF": (963, 144, 7),
  "SelfRegulationSCP1": (6, 896, 2),
  "SelfRegulationSCP2": (7, 1152, 2),
  "SpokenArabicDigits": (13, 93, 10),
  "UWaveGestureLibrary": (3, 315, 8),
}
# The release's scripts: (s, eta, rank_multi) per dataset for PrimalFormer (UEA/bashes/run_primalformer.sh)
# and Primal.+Trans. (Primal.+Trans./bashes/run_primal_trans.sh).
RELEASE_PRIMALFORMER = {
  "EthanolConcentration": (30, 0.1, 10),
  "FaceDetection": (20, 0.1, 5),
  "Handwriting": (30, 0.2, 5),
  "Heartbeat": (30, 0.5, 10),
  "JapaneseVowels": (40, 0.5, 5),
  "PEMS-SF": (40, 0.1, 5),
  "SelfRegulationSCP1": (30, 0.5, 10),
  "SelfRegulationSCP2": (20, 0.0, 10),
  "SpokenArabicDigits": (20, 0.1, 5),
  "UWaveGestureLibrary": (20, 0.0, 10),
}
RELEASE_PRIMAL_PLUS = {
  "EthanolConcentration": (40, 0.2, 10),
  "FaceDetection": (40, 0.2, 5),
  "Handwriting": (20, 0.5, 5),
  "Heartbeat": (40, 0.5, 10),
  "JapaneseVowels": (30, 0.2, 5),
  "PEMS-SF": (40, 0.0, 5),
  "SelfRegulationSCP1": (30, 0.2, 10),
  "SelfRegulationSCP2": (20, 0.2, 10),
  "SpokenArabicDigits": (30, 0.2, 5),
  "UWaveGestureLibrary": (40, 0.1, 10),
}
# Paper appendix: rank_multi = 5 for these (shorter series), 10 otherwise.
RANK_MULTI_5 = {"FaceDetection", "Handwriting", "JapaneseVowels", "PEMS-SF", "SpokenArabicDigits"}


def test_table1_datasets_are_the_papers_ten():
  assert set(TABLE1_DATASETS) == set(SHAPES) == set(UEA.PAPER_TABLE1) == set(UEA.PAPER_TABLE6)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("dataset", TABLE1_DATASETS)
def test_every_config_loads_and_builds_its_model(dataset, model):
  config = load_config(f"{CONFIG}:dataset={dataset},model={model}")
  channels, length, classes = SHAPES[dataset]
  info = types.SimpleNamespace(seq_len=length, num_classes=classes, num_features=channels, vocab_size=0)
  built = build_model(config.model, info)
  inputs = (np.zeros((1, length, channels), np.float32), np.ones((1, length), bool))
  variables = jax.eval_shape(lambda: built.module.init(jax.random.key(0), *inputs, deterministic=True))
  leaves = {jax.tree_util.keystr(path): leaf.shape for path, leaf in jax.tree_util.tree_leaves_with_path(variables)}
  assert any(shape[-1] == classes for shape in leaves.values())  # the classification head
  s, rank_multi = config.model.attention.primal.low_rank, config.model.attention.primal.rank_multi
  n = min(s * rank_multi, length)  # rows sampled for the data-dependent W_e|X, W_r|X
  primal = {k: v for k, v in leaves.items() if re.search(r"\['W[er]'\]", k)}
  layers = {"softmax": 0, "primalformer": 2, "primal_plus": 1}[model]  # Primal.+Trans.: the last layer only
  assert len(primal) == 2 * layers and all(shape == (8, n, s) for shape in primal.values())
  if model == "primal_plus":
    assert all("block_1" in k for k in primal)
  assert config.data.dataset == dataset and config.num_epochs == (400 if dataset == "PEMS-SF" else 100)


@pytest.mark.parametrize("dataset", TABLE1_DATASETS)
def test_release_hyper_parameters(dataset):
  for model, table in (("primalformer", RELEASE_PRIMALFORMER), ("primal_plus", RELEASE_PRIMAL_PLUS)):
    config = load_config(f"{CONFIG}:dataset={dataset},model={model}")
    primal = config.model.attention.primal
    assert (primal.low_rank, config.ksvd.eta, primal.rank_multi) == table[dataset], model
    assert primal.rank_multi == (5 if dataset in RANK_MULTI_5 else 10)
  for model in MODELS:
    config = load_config(f"{CONFIG}:dataset={dataset},model={model}")
    assert config.optimizer.name == ("adam" if dataset == "SpokenArabicDigits" else "radam")
    assert (config.optimizer.learning_rate, config.data.batch_size, config.optimizer.grad_clip_norm) == (1e-3, 16, 4.0)
    assert (len(config.model.layers), config.model.dim, config.model.num_heads) == (2, 512, 8)
    assert config.model.dim // config.model.num_heads == 64 and config.model.attention.primal.data_dependent
    assert config.num_epochs == (400 if dataset == "PEMS-SF" else 100)
    assert config.best_metric == "test/accuracy" and config.test_eval == "every_eval"  # the release's protocol
  assert load_config(f"{CONFIG}:dataset={dataset},model=softmax").ksvd.eta == 0.0  # Trans. has no KSVD loss


@pytest.mark.parametrize("dataset", TABLE1_DATASETS)
def test_primalformer_setting_is_a_best_cell_of_table6_matching_table1(dataset):
  """The release's PrimalFormer (s, eta) is the Table 6 cell that the paper reports in Table 1."""
  s, eta, _ = RELEASE_PRIMALFORMER[dataset]
  row = UEA.PAPER_TABLE6[dataset]
  cell = row[s][UEA.PAPER_TABLE6_ETAS.index(eta)]
  assert cell == UEA.PAPER_TABLE1[dataset][1] == max(max(accuracies) for accuracies in row.values())


def test_docstring_states_the_papers_table1():
  doc = inspect.getdoc(UEA) or UEA.__doc__
  for dataset, accuracies in UEA.PAPER_TABLE1.items():
    (line,) = [line for line in doc.splitlines() if re.match(rf"  {dataset} +\d", line)]
    numbers = [float(x) for x in line.split("(")[0].split()[1:]]
    assert tuple(numbers) == accuracies, dataset
    s, eta, rank_multi = RELEASE_PRIMALFORMER[dataset]
    assert f"({s}, {eta}, {rank_multi})" in line
  averages = np.mean(list(UEA.PAPER_TABLE1.values()), axis=0)
  np.testing.assert_allclose(averages, (71.9, 73.0, 73.1), atol=0.05)  # the paper's "Average Accuracy" row
  assert "average                71.9    73.0     73.1" in doc


def test_a_missing_archive_names_the_missing_files(tmp_path):
  from primal_jax.data.registry import get_input_pipeline

  config = load_config(f"{CONFIG}:dataset=Heartbeat", lock=False)
  config.data.source = str(tmp_path / "Multivariate2018_ts")
  config.data.data_dir = str(tmp_path / "tfds")
  with pytest.raises(FileNotFoundError, match=r"Heartbeat_TRAIN\.ts, .*Heartbeat_TEST\.ts\. Download the UEA"):
    get_input_pipeline(config.data)
  config.data.source = "aeon"
  with pytest.raises(ValueError, match=r"source='aeon' has only BasicMotions, JapaneseVowels, not 'Heartbeat'"):
    get_input_pipeline(config.data)
