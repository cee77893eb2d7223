"""Tests of primal_jax.sampling: the release's integer linspace and padding-aware sampling (SPEC 2)."""

import glob
import os

import jax
import jax.numpy as jnp
import numpy as np
import numpy_reference as ref
import pytest

from primal_jax.sampling import num_sampled_rows, padding_aware_positions, release_sample_indices

REFERENCE_DIR = "/work/shared/reference"


def test_matches_independent_emulation_on_a_grid():
  """Equals a float64 scalar emulation of torch.linspace(0, N-1, n, dtype=int64) for all N, n <= 60."""
  for length in range(1, 61):
    for num in range(1, 61):
      got = release_sample_indices(length, num)
      assert got.shape == (num,)
      np.testing.assert_array_equal(got, ref.torch_int_linspace(length, num), err_msg=f"N={length} n={num}")


@pytest.mark.parametrize(
  "length,num,expected",
  [
    (10, 4, [0, 3, 6, 9]),
    (5, 3, [0, 2, 4]),
    (7, 1, [0]),
    (1, 3, [0, 0, 0]),
    (3, 5, [0, 0, 1, 1, 2]),  # n > N: indices repeat (release LRA)
    (4, 6, [0, 0, 1, 1, 2, 3]),  # second half computed from the end: 3 - 0.6*2 = 1.8 -> 1
    (11, 4, [0, 3, 6, 10]),
    (300, 8, [0, 42, 85, 128, 170, 213, 256, 299]),
    # floor(i (N-1)/(n-1)) = 21 here, but 42 - (42/38)*19 = 20.999999999999996 truncates to 20.
    (
      43,
      39,
      [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]
      + [22, 23, 24, 25, 26, 27, 28, 29, 30, 32, 33, 34, 35, 36, 37, 38, 39, 40, 42],
    ),
  ],
)
def test_known_values(length, num, expected):
  """Hand-checked outputs of the release rule, including a case where it differs from floor."""
  np.testing.assert_array_equal(release_sample_indices(length, num), expected)


def test_known_difference_from_floor():
  """N=43, n=39, i=19: exact floor(19 * 42 / 38) = 21, the release gives 20 (float64 round-off)."""
  assert 19 * 42 // 38 == 21
  assert release_sample_indices(43, 39)[19] == 20


def test_output_properties():
  """int32, first 0, last N-1, non-decreasing, all in [0, N)."""
  for length, num in [(300, 200), (29, 29), (17, 40), (2, 2)]:
    idx = release_sample_indices(length, num)
    assert idx.dtype == np.int32
    assert idx[0] == 0 and idx[-1] == length - 1
    assert np.all(np.diff(idx) >= 0) and idx.max() < length


def test_differs_from_floor_where_torch_does():
  """Brute force over N, n <= 120: where the release rule differs from floor(i(N-1)/(n-1)), follow the release."""
  differing = []
  for length in range(2, 121):
    for num in range(2, 121):
      release = ref.torch_int_linspace(length, num)
      floor = ref.floor_linspace(length, num)
      if np.any(release != floor):
        differing.append((length, num))
        np.testing.assert_array_equal(release_sample_indices(length, num), release, err_msg=f"N={length} n={num}")
        assert np.any(release_sample_indices(length, num) != floor)
  # The rules disagree on roughly 1% of pairs (SPEC 2); both with n <= N and with repeats (n > N).
  assert 0.002 * 119**2 < len(differing) < 0.05 * 119**2
  assert any(num <= length for length, num in differing)
  assert any(num > length for length, num in differing)
  assert (43, 39) in differing


def _golden_cases():
  cases = []
  for path in sorted(glob.glob(os.path.join(REFERENCE_DIR, "*.npz"))):
    with np.load(path) as z:
      if "sampled_indices" not in z.files:
        continue
      # We [H, n, s] (the DeiT case names it `we`). The DeiT case's length is that of its escores
      # [B, H, N, s]: N counts the class token, which its image input does not show.
      we_keys = [k for k in z.files if k.endswith(("We", "/we"))]
      num = z[we_keys[0]].shape[1]
      if "input_ids" in z.files or "x" in z.files:
        length = z["input_ids"].shape[1] if "input_ids" in z.files else z["x"].shape[1]
      else:
        length = z[next(k for k in z.files if k.endswith("escore"))].shape[2]
      cases.append(pytest.param(path, length, num, id=os.path.basename(path)))
  return cases


@pytest.mark.skipif(not os.path.isdir(REFERENCE_DIR), reason="golden reference folder not available")
@pytest.mark.parametrize("path,length,num", _golden_cases())
def test_golden_sampled_indices(path, length, num):
  """Bit-exact against `sampled_indices` saved from the official PyTorch code."""
  with np.load(path) as z:
    golden = z["sampled_indices"]
  assert golden.shape == (num,)
  np.testing.assert_array_equal(release_sample_indices(length, num), golden)


def test_golden_cases_found():
  """The golden files above are really exercised (LRA N=300 n=200/300; time series N=n=29)."""
  if not os.path.isdir(REFERENCE_DIR):
    pytest.skip("golden reference folder not available")
  found = {(c.values[1], c.values[2]) for c in _golden_cases()}
  assert {(300, 200), (300, 300), (29, 29)} <= found


@pytest.mark.parametrize("length,num,name", [(0, 3, "length"), (5, 0, "num_samples"), (-1, 3, "length")])
def test_invalid_arguments(length, num, name):
  """Non-positive sizes raise ValueError naming the argument."""
  with pytest.raises(ValueError, match=name):
    release_sample_indices(length, num)


def test_num_sampled_rows():
  """n = low_rank * rank_multi, capped at max_len when given (SPEC 2)."""
  assert num_sampled_rows(20, 10) == 200
  assert num_sampled_rows(30, 10) == 300
  assert num_sampled_rows(20, 5, max_len=29) == 29
  assert num_sampled_rows(20, 10, max_len=500) == 200
  assert num_sampled_rows(4, 5) == 20
  with pytest.raises(ValueError, match="low_rank"):
    num_sampled_rows(0, 10)
  with pytest.raises(ValueError, match="rank_multi"):
    num_sampled_rows(20, 0)


def _random_masks(seed, batch, length):
  rng = np.random.default_rng(seed)
  valid = rng.random((batch, length)) < 0.6  # padding anywhere, not only a suffix
  valid[0] = True  # no padding
  valid[1, :] = False
  valid[1, [2, 5, 11]] = True  # a few scattered real positions
  valid[2] = np.arange(length) < length - 4  # suffix padding (the LRA layout)
  valid[3] = np.arange(length) >= 3  # prefix padding
  return valid


@pytest.mark.parametrize("num", [1, 5, 12, 23])
def test_padding_aware_positions(num):
  """Sample m is the release_sample_indices(L_b, n)[m]-th real position of sequence b."""
  length = 17
  valid = _random_masks(num, 7, length)
  got = np.asarray(padding_aware_positions(jnp.asarray(valid), num))
  assert got.shape == (7, num) and got.dtype == np.int32
  np.testing.assert_array_equal(got, ref.padding_aware(valid, num))
  for b in range(7):
    assert np.all(valid[b, got[b]]), "a padded position was sampled"
  # Without padding the rule is exactly the release's indices.
  np.testing.assert_array_equal(got[0], ref.torch_int_linspace(length, num))


def test_padding_aware_without_padding_equals_release():
  """An all-real mask gives release_sample_indices(N, n) for every sequence."""
  valid = np.ones((3, 29), bool)
  got = np.asarray(padding_aware_positions(jnp.asarray(valid), 20))
  np.testing.assert_array_equal(got, np.broadcast_to(release_sample_indices(29, 20), (3, 20)))


def test_padding_aware_all_padding_falls_back_to_zero():
  """A sequence without real positions samples position 0 (its outputs are masked anyway)."""
  valid = np.zeros((2, 9), bool)
  valid[1, 4:] = True
  got = np.asarray(padding_aware_positions(jnp.asarray(valid), 3))
  np.testing.assert_array_equal(got[0], [0, 0, 0])
  np.testing.assert_array_equal(got[1], [4, 6, 8])


def test_padding_aware_under_jit_with_traced_mask():
  """Works on a traced mask (lengths looked up in a host-built table), same values as eager."""
  valid = _random_masks(3, 7, 15)
  fn = jax.jit(padding_aware_positions, static_argnums=1)
  np.testing.assert_array_equal(fn(jnp.asarray(valid), 6), ref.padding_aware(valid, 6))
