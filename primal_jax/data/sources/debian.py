"""Files from a pinned Debian package (`.deb`), fetched through the package registry and checked by SHA-256.

Why Debian: some data sets ship as Debian packages (Fashion-MNIST as
`dataset-fashion-mnist`), and a machine that can install system packages can
obtain them with no access beyond its package mirror. `download_deb` tries
`apt-get download` (the system's own mirror, proxy and signature checks), then
an HTTP GET of the same pool file from a Debian mirror; either way the file's
SHA-256 must equal the one pinned from Debian's signed Packages index. The
`.deb` (an ar archive holding `data.tar.*`) is unpacked in Python
(`deb_data_files`), so neither dpkg nor root is needed, and `fetch_deb_files`
checks every wanted file against its own pinned SHA-256 before writing any.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import shutil
import subprocess
import tarfile
import tempfile
import urllib.request
import warnings
from collections.abc import Mapping
from pathlib import Path

from primal_jax.data.cache import DatasetFetchError, sha256_bytes, sha256_file, write_atomically

DEBIAN_MIRROR = "http://deb.debian.org/debian"  # plain HTTP is fine: every file is checked against a pinned SHA-256
_APT_TIMEOUT_S = 900
_HTTP_TIMEOUT_S = 60
_STDERR_TAIL_CHARS = 2000


class DebianFetchUnavailable(DatasetFetchError):
  """Neither apt nor the Debian mirror could provide the package (no registry access); checksum errors are not this."""


@dataclasses.dataclass(frozen=True)
class DebianPackage:
  """One pinned `.deb`: where a Debian mirror keeps it and its SHA-256 from Debian's signed Packages index."""

  name: str
  version: str
  pool_path: str  # path under a mirror's root (the `Filename:` field of `apt-cache show`)
  sha256: str
  size: int

  @property
  def file_name(self) -> str:
    return self.pool_path.rsplit("/", 1)[-1]


def _tail(text: str | None) -> str:
  return (text or "")[-_STDERR_TAIL_CHARS:]


def _apt_get_download(package: DebianPackage, dest_dir: Path) -> Path:
  """`apt-get download <name>=<version>` into dest_dir: the system's own mirror, proxy and signature checks."""
  apt = shutil.which("apt-get")
  if apt is None:
    raise DebianFetchUnavailable("apt-get is not installed")
  cmd = [apt, "download", f"{package.name}={package.version}"]
  try:
    proc = subprocess.run(cmd, cwd=dest_dir, capture_output=True, text=True, timeout=_APT_TIMEOUT_S, check=False)
  except subprocess.TimeoutExpired as e:
    raise DebianFetchUnavailable(f"`{' '.join(cmd)}` did not finish within {_APT_TIMEOUT_S} s") from e
  # apt names the file with the version's ':' escaped as '%3a'; '~' is kept.
  path = dest_dir / package.file_name
  if proc.returncode != 0 or not path.is_file():
    raise DebianFetchUnavailable(
      f"`{' '.join(cmd)}` failed with exit code {proc.returncode}; stderr tail:\n{_tail(proc.stderr or proc.stdout)}"
    )
  return path


def _http_download(package: DebianPackage, dest_dir: Path, mirror: str) -> Path:
  """GET <mirror>/<pool_path> into dest_dir (any urllib URL: http(s)://, file://)."""
  url = f"{mirror.rstrip('/')}/{package.pool_path}"
  path = dest_dir / package.file_name
  try:
    with urllib.request.urlopen(url, timeout=_HTTP_TIMEOUT_S) as response, open(path, "wb") as f:
      shutil.copyfileobj(response, f, 1 << 20)
  except OSError as e:  # URLError, HTTPError, timeouts
    raise DebianFetchUnavailable(f"GET {url} failed: {e}") from e
  return path


def download_deb(package: DebianPackage, dest_dir: Path, *, mirror: str = DEBIAN_MIRROR) -> Path:
  """The pinned `.deb` in dest_dir, by `apt-get download` or else from `mirror`; its SHA-256 is checked.

  Raises:
    DebianFetchUnavailable: neither route could get the file (both errors are given).
    DatasetFetchError: a file was obtained but its SHA-256 is not the pinned one.
  """
  errors = []
  for fetch in (lambda: _apt_get_download(package, dest_dir), lambda: _http_download(package, dest_dir, mirror)):
    try:
      path = fetch()
    except DebianFetchUnavailable as e:
      errors.append(str(e))
      continue
    actual = sha256_file(path)
    if actual != package.sha256:
      raise DatasetFetchError(
        f"{path.name}: sha256 {actual}, pinned {package.sha256} ({package.name} {package.version}); nothing was written"
      )
    return path
  raise DebianFetchUnavailable(
    f"could not obtain {package.name} {package.version}:\n- " + "\n- ".join(errors) + "\nDownload "
    f"{DEBIAN_MIRROR}/{package.pool_path} by other means and pass it as deb_path."
  )


def _ar_members(data: bytes, where: str) -> dict[str, bytes]:
  """{name: bytes} of a Unix ar archive (a .deb's outer format: 60-byte headers, members padded to even offsets)."""
  if data[:8] != b"!<arch>\n":
    raise DatasetFetchError(f"{where} is not a Debian package (no ar archive header)")
  members, pos = {}, 8
  while pos + 60 <= len(data):
    header = data[pos : pos + 60]
    if header[58:60] != b"`\n":
      raise DatasetFetchError(f"{where}: corrupt ar member header at byte {pos}")
    name = header[:16].decode("ascii").strip().rstrip("/")
    size = int(header[48:58].decode("ascii").strip())
    members[name] = data[pos + 60 : pos + 60 + size]
    pos += 60 + size + (size & 1)
  return members


def deb_data_files(deb: bytes, where: str) -> dict[str, bytes]:
  """{path: bytes} of the regular files a `.deb` installs (paths without the leading './'), parsed in Python."""
  members = _ar_members(deb, where)
  data_names = [name for name in members if name.startswith("data.tar")]
  if len(data_names) != 1:
    raise DatasetFetchError(f"{where} has no single data.tar.* member (members: {', '.join(members)})")
  try:  # gz, xz and bz2 are in the standard library; zstd (data.tar.zst) is not before Python 3.14.
    archive = tarfile.open(fileobj=io.BytesIO(members[data_names[0]]), mode="r:*")
  except tarfile.TarError as e:
    raise DatasetFetchError(f"{where}: cannot read {data_names[0]} ({e}); extract it with `dpkg-deb -x`") from e
  with archive:
    return {m.name.removeprefix("./"): archive.extractfile(m).read() for m in archive if m.isfile()}


def decompressed(data: bytes) -> bytes:
  """`data` gunzipped if it is gzip (by its magic bytes), else as it is."""
  return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def _check_files(files: Mapping[str, bytes], pinned: Mapping[str, str], where: str) -> None:
  for name, sha in pinned.items():
    actual = sha256_bytes(files[name])
    if actual != sha:
      raise DatasetFetchError(f"checksum mismatch for {name} from {where}: sha256 {actual}, pinned {sha}")


def fetch_deb_files(
  package: DebianPackage,
  member_dir: str,
  pinned: Mapping[str, str],
  dest_dir: str | Path,
  *,
  deb_path: str | Path | None = None,
  mirror: str = DEBIAN_MIRROR,
) -> Path:
  """Ensures dest_dir holds the files `pinned` names (decompressed), taken from `member_dir` in a Debian package.

  Files already in dest_dir with the pinned checksums are used as they are
  (nothing is downloaded). Otherwise the `.deb` is taken from `deb_path` or
  downloaded (`download_deb`), each file is looked up as `<member_dir>/<name>`
  or `<name>.gz`, decompressed, and all are verified before any is written
  (atomically). Returns dest_dir.
  """
  dest_dir = Path(dest_dir).expanduser()
  if all((dest_dir / name).is_file() and sha256_file(dest_dir / name) == sha for name, sha in pinned.items()):
    return dest_dir
  with tempfile.TemporaryDirectory(prefix="primal_jax_deb_") as tmp:
    path = Path(deb_path).expanduser() if deb_path is not None else download_deb(package, Path(tmp), mirror=mirror)
    installed = deb_data_files(path.read_bytes(), path.name)
  files = {}
  for name in pinned:
    member = f"{member_dir.strip('/')}/{name}"
    found = [m for m in (member, member + ".gz") if m in installed]
    if not found:
      raise DatasetFetchError(f"{path.name} has no {member}(.gz); expected it in {package.name} {package.version}")
    files[name] = decompressed(installed[found[0]])
  _check_files(files, pinned, path.name)
  dest_dir.mkdir(parents=True, exist_ok=True)
  for name, data in files.items():
    target = dest_dir / name
    if target.exists() and not (target.is_file() and sha256_file(target) == pinned[name]):
      warnings.warn(f"replacing {target}: its sha256 differs from the pinned file", RuntimeWarning, stacklevel=2)
    write_atomically(target, data)
  return dest_dir
