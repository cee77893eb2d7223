"""Real English Wikipedia text for the embedded language-modelling default, from the `gensim` wheel on PyPI.

gensim 4.4.0 ships, as test data, the first pages of an English Wikipedia dump in raw MediaWiki XML, the
format enwik8 is cut from (`enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2`, 1.7 MB
bz2, 6,089,746 bytes of XML). It is fetched like the UEA files of the `aeon` wheel (`pypi_wheel`): pip
downloads the wheel (no install), the one member is read, checked against its pinned SHA-256, decompressed,
checked again, and cached as `<cache>/gensim_enwiki/enwiki-shortened.xml`. The `text_bytes` task then splits
it 90/5/5 by byte position as enwik8 is split.
"""

from __future__ import annotations

import bz2
import tempfile
from pathlib import Path

from primal_jax.data.cache import DatasetFetchError, cache_root, sha256_bytes, sha256_file, write_atomically
from primal_jax.data.sources import pypi_wheel

GENSIM_VERSION = "4.4.0"
MEMBER = "gensim/test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
MEMBER_SHA256 = "a53f4648dec40467ebdcbc7a1307eddb51fe6e28e9309f6ebde81ba0d04bea2d"
TEXT_SHA256 = "34c1c63050c87cc8477b9ae36b1cb0edf372612c92938b742e579a7109c20fa4"
TEXT_BYTES = 6_089_746
FILE_NAME = "enwiki-shortened.xml"


def _download_wheel(version: str, dest_dir: Path) -> Path:
  """The gensim wheel of `version` in dest_dir (tests replace this with a tiny local wheel)."""
  return pypi_wheel.download_wheel("gensim", version, dest_dir)


def fetch_enwiki_text(
  cache_dir: str | Path | None = None, *, version: str = GENSIM_VERSION, member_sha256: str = MEMBER_SHA256,
  text_sha256: str = TEXT_SHA256,
) -> Path:  # fmt: skip
  """The cached XML file (fetched on first use); a cached file with another checksum is fetched again.

  Raises:
    DatasetFetchError: pip failed, the member is missing, or a checksum (compressed or text) differs;
      nothing is written then.
  """
  target = cache_root(cache_dir) / "gensim_enwiki" / FILE_NAME
  if target.is_file() and sha256_file(target) == text_sha256:
    return target
  with tempfile.TemporaryDirectory(prefix="primal_jax_gensim_") as tmp:
    wheel = _download_wheel(version, Path(tmp))
    compressed = pypi_wheel.read_pinned_members(wheel, {MEMBER: member_sha256})[MEMBER]
  try:
    text = bz2.decompress(compressed)
  except OSError as e:
    raise DatasetFetchError(f"{MEMBER} of gensim=={version} is not valid bz2: {e}") from e
  if sha256_bytes(text) != text_sha256:
    raise DatasetFetchError(f"decompressed {MEMBER} has sha256 {sha256_bytes(text)}, pinned {text_sha256}")
  target.parent.mkdir(parents=True, exist_ok=True)
  write_atomically(target, text)
  return target
