"""Tests of primal_jax.tasks.uea.aeon_wheel: pinned UEA files extracted from the aeon wheel.

Everything except the last test runs offline: `_download_wheel` is replaced by a
function that copies a fake wheel built in tmp_path, and pip failures are
simulated through `subprocess.run`. The real fetch runs only with
PRIMAL_JAX_NETWORK_TESTS=1 (it downloads the ~6 MB aeon wheel from PyPI).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import pytest

from primal_jax.tasks.uea import aeon_wheel
from primal_jax.tasks.uea.aeon_wheel import DatasetFetchError, fetch_aeon_dataset, load_aeon_split, member_path
from primal_jax.tasks.uea.archive import load_uea

TOY_TRAIN = b"@problemName Toy\n@dimensions 2\n@classLabel true a b\n@data\n1,2:3,4:a\n5:6:b\n"
TOY_TEST = b"@problemName Toy\n@dimensions 2\n@classLabel true a b\n@data\n7,8,9:1,2,3:b\n"


def _sha(data: bytes) -> str:
  return hashlib.sha256(data).hexdigest()


def _fake_wheel(directory: Path, members: dict[str, bytes]) -> Path:
  """A zip named like the pinned wheel, holding `members` (path in wheel -> bytes)."""
  directory.mkdir(parents=True, exist_ok=True)
  wheel = directory / f"aeon-{aeon_wheel.AEON_VERSION}-py3-none-any.whl"
  with zipfile.ZipFile(wheel, "w") as archive:
    archive.writestr("aeon/__init__.py", "")
    for name, data in members.items():
      archive.writestr(name, data)
  return wheel


@pytest.fixture
def toy_pinned(monkeypatch):
  """Pins a 'Toy' dataset to TOY_TRAIN/TOY_TEST, leaving the real pins untouched."""
  monkeypatch.setitem(aeon_wheel.AEON_DATASETS, "Toy", {"Toy_TRAIN.ts": _sha(TOY_TRAIN), "Toy_TEST.ts": _sha(TOY_TEST)})


@pytest.fixture
def serve_wheel(monkeypatch):
  """Makes `_download_wheel` copy a given fake wheel; returns (set_wheel, calls)."""
  state: dict[str, Path] = {}
  calls: list[str] = []

  def fake_download(version: str, dest_dir: Path) -> Path:
    calls.append(version)
    return Path(shutil.copy(state["wheel"], dest_dir))

  monkeypatch.setattr(aeon_wheel, "_download_wheel", fake_download)

  def set_wheel(wheel: Path) -> None:
    state["wheel"] = wheel

  return set_wheel, calls


def _toy_members(train: bytes = TOY_TRAIN, test: bytes | None = TOY_TEST) -> dict[str, bytes]:
  members = {member_path("Toy", "Toy_TRAIN.ts"): train}
  if test is not None:
    members[member_path("Toy", "Toy_TEST.ts")] = test
  return members


def test_fetch_extracts_verifies_and_caches(tmp_path, toy_pinned, serve_wheel):
  set_wheel, calls = serve_wheel
  set_wheel(_fake_wheel(tmp_path / "wheel", _toy_members()))
  cache = tmp_path / "cache"
  dataset_dir = fetch_aeon_dataset("Toy", cache)
  assert dataset_dir == cache / "Toy"
  assert sorted(p.name for p in dataset_dir.iterdir()) == ["Toy_TEST.ts", "Toy_TRAIN.ts"]  # no temp files left
  assert (dataset_dir / "Toy_TRAIN.ts").read_bytes() == TOY_TRAIN
  assert calls == [aeon_wheel.AEON_VERSION]

  # Cached with the right checksums: no second download, and the archive-layout loader reads it.
  assert fetch_aeon_dataset("Toy", cache) == dataset_dir
  assert len(calls) == 1
  train, test = load_uea(cache, "Toy")
  assert (len(train), len(test), train.num_channels) == (2, 1, 2)
  assert len(load_aeon_split("Toy", "test", cache)) == 1


def test_checksum_mismatch_writes_nothing(tmp_path, toy_pinned, serve_wheel):
  set_wheel, _ = serve_wheel
  # The first member is fine, the second is not: neither may be written.
  set_wheel(_fake_wheel(tmp_path / "wheel", _toy_members(test=TOY_TEST + b"tampered")))
  cache = tmp_path / "cache"
  with pytest.raises(DatasetFetchError, match=r"checksum mismatch for aeon/datasets/data/Toy/Toy_TEST.ts") as e:
    fetch_aeon_dataset("Toy", cache)
  assert _sha(TOY_TEST) in str(e.value) and "nothing was written" in str(e.value)
  assert not (cache / "Toy").exists() or not any((cache / "Toy").iterdir())


def test_checksum_mismatch_against_the_real_pins(tmp_path, serve_wheel):
  """A wheel whose JapaneseVowels differs from the pinned files is refused."""
  set_wheel, _ = serve_wheel
  members = {member_path("JapaneseVowels", f): TOY_TRAIN for f in aeon_wheel.AEON_DATASETS["JapaneseVowels"]}
  set_wheel(_fake_wheel(tmp_path / "wheel", members))
  with pytest.raises(DatasetFetchError, match="checksum mismatch"):
    aeon_wheel.fetch_japanese_vowels(tmp_path / "cache")
  assert not (tmp_path / "cache" / "JapaneseVowels").exists()


def test_missing_member(tmp_path, toy_pinned, serve_wheel):
  set_wheel, _ = serve_wheel
  set_wheel(_fake_wheel(tmp_path / "wheel", _toy_members(test=None)))
  with pytest.raises(DatasetFetchError, match=r"has no member aeon/datasets/data/Toy/Toy_TEST.ts"):
    fetch_aeon_dataset("Toy", tmp_path / "cache")


def test_corrupt_cache_is_refetched_with_a_warning(tmp_path, toy_pinned, serve_wheel):
  set_wheel, calls = serve_wheel
  set_wheel(_fake_wheel(tmp_path / "wheel", _toy_members()))
  cache = tmp_path / "cache"
  fetch_aeon_dataset("Toy", cache)
  (cache / "Toy" / "Toy_TEST.ts").write_bytes(b"truncated")
  with pytest.warns(RuntimeWarning, match="replacing .*Toy_TEST.ts"):
    fetch_aeon_dataset("Toy", cache)
  assert (cache / "Toy" / "Toy_TEST.ts").read_bytes() == TOY_TEST
  assert len(calls) == 2


def test_bad_zip(tmp_path, toy_pinned, serve_wheel):
  set_wheel, _ = serve_wheel
  bogus = tmp_path / "wheel" / f"aeon-{aeon_wheel.AEON_VERSION}-py3-none-any.whl"
  bogus.parent.mkdir()
  bogus.write_bytes(b"not a zip")
  set_wheel(bogus)
  with pytest.raises(DatasetFetchError, match="not a valid wheel"):
    fetch_aeon_dataset("Toy", tmp_path / "cache")


def test_unknown_dataset():
  with pytest.raises(ValueError, match="no pinned aeon dataset 'Nope'; available: BasicMotions, JapaneseVowels"):
    fetch_aeon_dataset("Nope", "/nonexistent")


def test_pip_failure_shows_stderr_tail(tmp_path, monkeypatch):
  seen: list[list[str]] = []

  def failing_run(cmd, **kwargs):
    seen.append(cmd)
    return subprocess.CompletedProcess(cmd, 1, stdout="", stderr="noise\n" * 1000 + "ERROR: No matching distribution")

  monkeypatch.setattr(aeon_wheel.subprocess, "run", failing_run)
  with pytest.raises(DatasetFetchError, match=r"(?s)exit code 1; stderr tail:\n.*ERROR: No matching distribution") as e:
    aeon_wheel._download_wheel("1.6.0", tmp_path)
  assert len(str(e.value)) < 3000  # a tail, not the whole log
  cmd = seen[0]
  assert cmd[1:4] == ["-m", "pip", "download"] and "--no-deps" in cmd and "aeon==1.6.0" in cmd


def test_pip_success_without_a_wheel(tmp_path, monkeypatch):
  monkeypatch.setattr(aeon_wheel.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 0, "", ""))
  with pytest.raises(DatasetFetchError, match=r"left no aeon-1.6.0-\*.whl"):
    aeon_wheel._download_wheel("1.6.0", tmp_path)


@pytest.mark.skipif(
  os.environ.get("PRIMAL_JAX_NETWORK_TESTS") != "1", reason="set PRIMAL_JAX_NETWORK_TESTS=1 to download aeon from PyPI"
)
def test_real_fetch_japanese_vowels_and_basic_motions(tmp_path):
  """The facts of the paper's default UEA problem, on the real files from the pinned wheel."""
  dataset_dir = aeon_wheel.fetch_japanese_vowels(tmp_path)
  assert dataset_dir == tmp_path / "JapaneseVowels"
  train, test = load_uea(tmp_path, "JapaneseVowels")
  assert (len(train), len(test)) == (270, 370)
  assert train.num_channels == test.num_channels == 12
  assert train.class_names == tuple(str(i) for i in range(1, 10))
  lengths = np.concatenate([train.lengths, test.lengths])
  assert (lengths.min(), lengths.max()) == (7, 29)
  np.testing.assert_array_equal(np.bincount(train.labels), [30] * 9)  # 30 utterances per speaker

  fetch_aeon_dataset("BasicMotions", tmp_path)
  train, test = load_uea(tmp_path, "BasicMotions")
  assert (len(train), len(test), train.num_channels, train.num_classes) == (40, 40, 6, 4)
  assert set(train.lengths) == set(test.lengths) == {100}
