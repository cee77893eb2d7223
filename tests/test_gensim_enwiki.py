"""Tests of primal_jax.data.sources.gensim_enwiki: the Wikipedia XML of the gensim wheel, and its text_bytes splits.

Offline: `_download_wheel` is replaced by a copy of a tiny wheel built here. The real fetch (a 28 MB wheel
from PyPI, the package registry CI can reach) runs with PRIMAL_JAX_NETWORK_TESTS=1, as the aeon one.
"""

from __future__ import annotations

import bz2
import hashlib
import os
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest

from primal_jax.data.cache import DatasetFetchError
from primal_jax.data.sources import gensim_enwiki
from primal_jax.tasks.lm import text_bytes

TEXT = b'<mediawiki xml:lang="en">\n  <page>\n    <title>Anarchism</title>\n    <text>Anarchism is ...</text>\n' * 50


def _sha(data: bytes) -> str:
  return hashlib.sha256(data).hexdigest()


@pytest.fixture
def serve_wheel(monkeypatch, tmp_path):
  """Serves a tiny gensim wheel holding `member_bytes` at the pinned member path; returns the call log."""
  calls: list[str] = []
  state = {"member": bz2.compress(TEXT)}

  def fake_download(version: str, dest_dir: Path) -> Path:
    calls.append(version)
    wheel = tmp_path / "wheels" / f"gensim-{version}-cp311-cp311-manylinux_2_28_x86_64.whl"
    wheel.parent.mkdir(exist_ok=True)
    with zipfile.ZipFile(wheel, "w") as archive:
      archive.writestr("gensim/__init__.py", "")
      archive.writestr(gensim_enwiki.MEMBER, state["member"])
    return Path(shutil.copy(wheel, dest_dir))

  monkeypatch.setattr(gensim_enwiki, "_download_wheel", fake_download)
  return state, calls


def _pins(member: bytes, text: bytes = TEXT) -> dict[str, str]:
  return {"member_sha256": _sha(member), "text_sha256": _sha(text)}


def test_fetch_decompresses_verifies_and_caches(tmp_path, serve_wheel):
  state, calls = serve_wheel
  path = gensim_enwiki.fetch_enwiki_text(tmp_path / "cache", **_pins(state["member"]))
  assert path == tmp_path / "cache" / "gensim_enwiki" / gensim_enwiki.FILE_NAME
  assert path.read_bytes() == TEXT
  assert gensim_enwiki.fetch_enwiki_text(tmp_path / "cache", **_pins(state["member"])) == path
  assert calls == [gensim_enwiki.GENSIM_VERSION]  # the second call is served from the cache


def test_a_wrong_checksum_writes_nothing(tmp_path, serve_wheel):
  state, _ = serve_wheel
  with pytest.raises(DatasetFetchError, match="checksum mismatch"):
    gensim_enwiki.fetch_enwiki_text(tmp_path, member_sha256="0" * 64, text_sha256=_sha(TEXT))
  with pytest.raises(DatasetFetchError, match="decompressed"):
    gensim_enwiki.fetch_enwiki_text(tmp_path, member_sha256=_sha(state["member"]), text_sha256="0" * 64)
  state["member"] = b"not bz2"
  with pytest.raises(DatasetFetchError, match="not valid bz2"):
    gensim_enwiki.fetch_enwiki_text(tmp_path, **_pins(b"not bz2"))
  assert not (tmp_path / "gensim_enwiki" / gensim_enwiki.FILE_NAME).exists()


def test_an_altered_cache_is_fetched_again(tmp_path, serve_wheel):
  state, calls = serve_wheel
  path = gensim_enwiki.fetch_enwiki_text(tmp_path, **_pins(state["member"]))
  path.write_bytes(TEXT[:-1])
  assert gensim_enwiki.fetch_enwiki_text(tmp_path, **_pins(state["member"])).read_bytes() == TEXT
  assert len(calls) == 2


def test_text_bytes_source_option(tmp_path):
  with pytest.raises(ValueError, match="data.source must be one of"):
    text_bytes.source_path({"source": "wikipedia", "path": ""})
  with pytest.raises(ValueError, match="data.path is empty"):
    text_bytes.source_path({"source": "file", "path": ""})
  assert text_bytes.source_path({"path": str(tmp_path / "x.txt")}) == tmp_path / "x.txt"  # "file" by default


@pytest.mark.skipif(
  os.environ.get("PRIMAL_JAX_NETWORK_TESTS") != "1", reason="set PRIMAL_JAX_NETWORK_TESTS=1 to download gensim"
)
def test_real_fetch_and_enwik8_style_splits(tmp_path, monkeypatch):
  monkeypatch.setenv("PRIMAL_JAX_DATA", str(tmp_path))
  path = gensim_enwiki.fetch_enwiki_text()
  data = path.read_bytes()
  assert len(data) == gensim_enwiki.TEXT_BYTES and data.startswith(b"<mediawiki")
  splits = text_bytes.read_splits(path, seq_len=256)
  streams = [np.asarray(splits[s].stream) for s in ("train", "validation", "test")]
  assert [len(s) for s in streams] == [5_480_771, 304_487, 304_488]  # 90 / 5 / 5 % of 6,089,746 bytes
  assert np.concatenate(streams).tobytes() == data  # contiguous, disjoint, byte-exact
