"""Tests of the LRA baseline attentions (linear, performer, linformer, nystromformer, cosformer).

Each module is compared with a float64 NumPy forward written here from the
mechanism's definition (the N x M score matrix formed explicitly, loops over
batch and heads), never by calling `primal_jax`. Tolerances: max relative error
(`numpy_reference.rel_err`) 1e-5 for float32 against float64, except where a
test states otherwise and why.
"""

from __future__ import annotations

import functools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import numpy_reference as ref
import pytest
from attention_utils import normal, padding_mask, random_params, to_numpy
from flax import linen as nn

from primal_jax.attention import ATTENTIONS, SoftmaxAttention, get_attention
from primal_jax.attention.baselines import (
  NystromAttention,
  PerformerAttention,
  iterative_pinv,
  orthogonal_random_features,
  performer_attention,
)
from primal_jax.models import SequenceClassifier, TransformerConfig

# Compares with float64 NumPy or golden numbers at float32 tolerances: full float32 matmuls on every platform.
pytestmark = pytest.mark.matmul_precision("highest")

B, N, D, H = 3, 9, 16, 2
P = D // H
F64 = np.float64
LANDMARKS = 3
BASELINES = ("linear", "performer", "linformer", "nystromformer", "cosformer")
# Small settings of each baseline for the [B, N, D] test inputs.
MODULE_KWARGS = {
  "linear": {},
  "performer": dict(num_features=24),
  "linformer": dict(max_len=12, linformer_k=5),
  "nystromformer": dict(num_landmarks=LANDMARKS, conv_kernel_size=5),
  "cosformer": {},
}
# float32 vs float64: 1e-5, except through jnp.linalg.pinv (float32 SVD of a landmark kernel with
# condition number ~1e2-1e3, which it amplifies to ~3e-5).
EXACT_PINV_TOLERANCE = 1e-4


def _module(name, **kwargs):
  return get_attention(name)(num_heads=H, **{**MODULE_KWARGS[name], **kwargs})


def _mask(kind, seed=0):
  pad = padding_mask(seed, B, N)
  return pad, {None: None, "padding": pad, "attention": nn.make_attention_mask(pad, pad)}[kind]


# ============================================================================ float64 NumPy references


def _heads(params, xq, xkv):
  """q [B, H, N, p], k, v [B, H, M, p] from the query/key/value DenseGeneral parameters."""
  xq, xkv = np.asarray(xq, F64), np.asarray(xkv, F64)
  q = np.einsum("bnd,dhp->bhnp", xq, params["query"]["kernel"]) + params["query"]["bias"][None, :, None]
  k = np.einsum("bmd,dhp->bhmp", xkv, params["key"]["kernel"]) + params["key"]["bias"][None, :, None]
  v = np.einsum("bmd,dhp->bhmp", xkv, params["value"]["kernel"]) + params["value"]["bias"][None, :, None]
  return q, k, v


def _merge(params, heads_out):
  """heads_out [B, H, N, p] -> out [B, N, D]: merged heads times the output kernel, plus its bias."""
  return np.einsum("bhnp,hpd->bnd", heads_out, params["out"]["kernel"]) + params["out"]["bias"]


def _weights(valid, b, m):
  return np.ones(m) if valid is None else np.asarray(valid[b], F64)


def _normalised(scores, v, w, causal, eps):
  """out_i = sum_j w_j s_ij v_j / max(sum_j w_j s_ij, eps), j <= i if causal (scores [N, M])."""
  s = scores * w[None, :]
  if causal:
    s = s * np.tril(np.ones_like(s))
  return (s @ v) / np.maximum(s.sum(-1), eps)[:, None]


def linear_ref(q, k, v, valid=None, causal=False, normalize=True, eps=1e-6):
  """Katharopoulos et al.: s_ij = <elu(q_i) + 1, elu(k_j) + 1>; unnormalised: (S w) V / sqrt(p)."""
  elu1 = lambda z: np.where(z > 0, z + 1.0, np.exp(z))  # elu(z) + 1
  out = np.zeros(q.shape)
  for b in range(q.shape[0]):
    w = _weights(valid, b, k.shape[2])
    for h in range(q.shape[1]):
      s = elu1(q[b, h]) @ elu1(k[b, h]).T
      if normalize:
        out[b, h] = _normalised(s, v[b, h], w, causal, eps)
      else:
        out[b, h] = (s * w[None]) @ v[b, h] / np.sqrt(q.shape[-1])
  return out


def performer_ref(q, k, v, projection, valid=None, eps=1e-4):
  """FAVOR+: phi(x) = (exp(W x' - |x'|^2/2 - c) + eps) / sqrt(m), x' = x p^-1/4; c per query row / per key set."""
  w_dir = np.asarray(projection, F64)
  m, p = w_dir.shape
  out = np.zeros(q.shape)
  for b in range(q.shape[0]):
    w = _weights(valid, b, k.shape[2])
    real = w > 0
    for h in range(q.shape[1]):
      xq, xk = q[b, h] * p**-0.25, k[b, h] * p**-0.25
      lq, lk = xq @ w_dir.T, xk @ w_dir.T  # [N, m], [M, m]
      cq = lq.max(axis=1, keepdims=True)
      ck = lk[real].max() if real.any() else 0.0
      phi_q = (np.exp(lq - 0.5 * (xq**2).sum(1, keepdims=True) - cq) + eps) / np.sqrt(m)
      phi_k = (np.exp(lk - 0.5 * (xk**2).sum(1, keepdims=True) - ck) + eps) / np.sqrt(m)
      out[b, h] = _normalised(phi_q @ phi_k.T, v[b, h], w, False, 1e-300)
  return out


def cosformer_ref(q, k, v, valid=None, causal=False, eps=1e-6):
  """cosFormer: s_ij = <relu(q_i), relu(k_j)> cos(pi/2 (i - j) / M), M = max(N, M_keys)."""
  n, mk = q.shape[2], k.shape[2]
  horizon = max(n, mk)
  reweight = np.cos(np.pi / 2 * (np.arange(n)[:, None] - np.arange(mk)[None, :]) / horizon)
  out = np.zeros(q.shape)
  for b in range(q.shape[0]):
    w = _weights(valid, b, mk)
    for h in range(q.shape[1]):
      s = (np.maximum(q[b, h], 0) @ np.maximum(k[b, h], 0).T) * reweight
      out[b, h] = _normalised(s, v[b, h], w, causal, eps)
  return out


def _softmax_rows(s):
  s = s - s.max(-1, keepdims=True)
  e = np.exp(s)
  return e / e.sum(-1, keepdims=True)


def linformer_ref(q, k, v, e_proj, f_proj, valid=None):
  """softmax(Q (E K)^T / sqrt(p)) (F V) with padded keys/values zeroed; E, F truncated to M columns."""
  mk, p = k.shape[2], q.shape[-1]
  out = np.zeros(q.shape)
  for b in range(q.shape[0]):
    w = _weights(valid, b, mk)[:, None]
    for h in range(q.shape[1]):
      ek = np.asarray(e_proj, F64)[h, :, :mk] @ (k[b, h] * w)
      fv = np.asarray(f_proj, F64)[h, :, :mk] @ (v[b, h] * w)
      out[b, h] = _softmax_rows(q[b, h] @ ek.T / np.sqrt(p)) @ fv
  return out


def _segment_means(x, m):
  """Landmark j = mean of the rows i with floor(i m / L) == j."""
  length = x.shape[0]
  seg = np.array([i * m // length for i in range(length)])
  return np.stack([x[seg == j].mean(axis=0) for j in range(m)])


def _newton_schulz_pinv(a, iterations):
  """Z0 = A^T / (max col sum * max row sum); Z <- Z (13 I - AZ (15 I - AZ (7 I - AZ))) / 4."""
  eye = np.eye(a.shape[0])
  z = a.T / (np.abs(a).sum(0).max() * np.abs(a).sum(1).max())
  for _ in range(iterations):
    az = a @ z
    z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
  return z


def nystrom_ref(q, k, v, valid=None, *, m, pinv="iterative", iterations=6, conv=None):
  """softmax(Q Kl^T) pinv(softmax(Ql Kl^T)) softmax(Ql K^T - 1e9 pad) V [+ depthwise conv of the zeroed V].

  q, k scaled by p^-1/4 and zeroed at padded positions before the landmark means; conv [K, H] taps.
  """
  p, mk = q.shape[-1], k.shape[2]
  out = np.zeros(q.shape)
  for b in range(q.shape[0]):
    w = _weights(valid, b, mk)
    for h in range(q.shape[1]):
      qs, ks = q[b, h] * p**-0.25 * w[:, None], k[b, h] * p**-0.25 * w[:, None]
      ql, kl = _segment_means(qs, m), _segment_means(ks, m)
      k1 = _softmax_rows(qs @ kl.T)
      k2 = _softmax_rows(ql @ kl.T)
      k3 = _softmax_rows(ql @ ks.T - 1e9 * (1 - w)[None, :])
      inv = np.linalg.pinv(k2) if pinv == "exact" else _newton_schulz_pinv(k2, iterations)
      out[b, h] = k1 @ inv @ k3 @ v[b, h]
      if conv is not None:
        taps = np.asarray(conv, F64)[:, h]
        half = len(taps) // 2
        vz = np.concatenate([np.zeros((half, p)), v[b, h] * w[:, None], np.zeros((half, p))])
        out[b, h] += sum(taps[t] * vz[t : t + mk] for t in range(len(taps)))
  return out


def reference(name, params, x, valid, module):
  """Float64 forward of `module` (registered as `name`) on x [B, N, D] with key padding `valid`."""
  p64 = to_numpy(params)
  q, k, v = _heads(p64, x, x)
  if name == "linear":
    heads = linear_ref(q, k, v, valid, causal=module.causal, normalize=module.normalize)
  elif name == "performer":
    projection = orthogonal_random_features(jax.random.key(module.feature_seed), module.num_features, P)
    heads = performer_ref(q, k, v, projection, valid)
  elif name == "linformer":
    f = p64["E"] if module.share_kv else p64["F"]
    heads = linformer_ref(q, k, v, p64["E"], f, valid)
  elif name == "nystromformer":
    conv = p64["conv"] if module.conv_kernel_size else None
    heads = nystrom_ref(q, k, v, valid, m=module.num_landmarks, pinv=module.pinv, conv=conv)
  else:
    heads = cosformer_ref(q, k, v, valid, causal=module.causal)
  return _merge(p64, heads)


# ============================================================================ forward against the references


CASES = [(name, {}) for name in BASELINES] + [
  ("linear", dict(causal=True)),
  ("linear", dict(normalize=False)),
  ("cosformer", dict(causal=True)),
  ("linformer", dict(share_kv=True)),
  ("nystromformer", dict(conv_kernel_size=0)),
  ("nystromformer", dict(pinv="exact")),
]


@pytest.mark.parametrize("mask_kind", [None, "padding", "attention"])
@pytest.mark.parametrize(
  "name,kwargs", CASES, ids=[f"{n}-{'-'.join(map(str, k.items())) or 'default'}" for n, k in CASES]
)
def test_forward_matches_numpy(name, kwargs, mask_kind):
  """[B, N, D] -> [B, N, D] equal to the float64 definition, with no mask, a [B, N] mask or a Flax mask."""
  module = _module(name, **kwargs)
  x = normal(1, (B, N, D))
  pad, mask = _mask(mask_kind)
  params = random_params(module, x, mask=mask)
  out = module.apply({"params": params}, x, mask=mask)
  chex.assert_shape(out, (B, N, D))
  expected = reference(name, params, x, None if mask is None else pad, module)
  tol = EXACT_PINV_TOLERANCE if kwargs.get("pinv") == "exact" else 1e-5
  ref.assert_rel_close(out, expected, tol, f"{name} {kwargs} mask={mask_kind}")


@pytest.mark.parametrize("name,kwargs", [(n, {}) for n in BASELINES] + [("linear", dict(causal=True))])
def test_padded_positions_do_not_influence_real_outputs(name, kwargs):
  """Changing every padded position (to values up to 1e3) leaves the outputs at real positions unchanged."""
  module = _module(name, **kwargs)
  x = normal(2, (B, N, D))
  pad = padding_mask(2, B, N)
  params = random_params(module, x, mask=pad)
  noisy = np.where(pad[..., None], x, normal(3, (B, N, D), scale=1e3))
  out, out_noisy = (np.asarray(module.apply({"params": params}, inp, mask=pad)) for inp in (x, noisy))
  ref.assert_rel_close(out_noisy[pad], out[pad], 1e-6, name)


@pytest.mark.parametrize("name", ["linear", "performer"])
def test_trailing_padding_equals_the_shorter_sequence(name):
  """With padded keys' features zeroed (and, for FAVOR+, left out of the key stabiliser) the real outputs equal
  those of the unpadded prefix. (Not cosFormer: its horizon M is the padded length.)"""
  module = _module(name)
  x = normal(4, (1, N, D))
  keep = N - 3
  pad = np.arange(N)[None] < keep
  params = random_params(module, x)
  out = np.asarray(module.apply({"params": params}, x, mask=pad))[:, :keep]
  ref.assert_rel_close(out, module.apply({"params": params}, x[:, :keep]), 1e-5, name)


@pytest.mark.parametrize("name", BASELINES)
def test_gradients_finite_and_jit(name):
  """jit(value_and_grad) with a padding mask: finite gradients for every parameter and the input; the jitted
  loss equals the float64 reference's."""
  module = _module(name)
  x = normal(5, (B, N, D))
  pad = padding_mask(5, B, N)
  params = random_params(module, x, mask=pad)

  def loss(p, inputs):
    out = module.apply({"params": p}, inputs, mask=pad)
    return jnp.sum(jnp.where(pad[..., None], out, 0.0) ** 2)

  value, (g_params, g_x) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(params, x)
  chex.assert_tree_all_finite((value, g_params, g_x))
  assert all(float(jnp.max(jnp.abs(g))) > 0 for g in jax.tree.leaves(g_params)), "a parameter gets no gradient"
  expected = reference(name, params, x, pad, module)
  np.testing.assert_allclose(value, np.sum(expected[pad] ** 2), rtol=1e-5)


@pytest.mark.parametrize("name", BASELINES)
def test_bfloat16(name):
  """bf16 parameters and inputs: [B, N, D] bf16 output, finite (features and sums run in float32)."""
  module = _module(name, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
  x = jnp.asarray(normal(6, (B, N, D)), jnp.bfloat16)
  pad = padding_mask(6, B, N)
  out = module.apply({"params": random_params(module, x, mask=pad)}, x, mask=pad)
  chex.assert_shape(out, (B, N, D))
  chex.assert_type(out, jnp.bfloat16)
  chex.assert_tree_all_finite(out)


# ============================================================================ mechanism-specific checks


def test_performer_features_are_orthogonal_and_fixed():
  """Rows within each block of p are orthogonal; the matrix is a function of the seed only."""
  w = np.asarray(orthogonal_random_features(jax.random.key(3), 2 * P + 3, P), F64)
  assert w.shape == (2 * P + 3, P)
  for start in (0, P, 2 * P):
    block = w[start : start + P]
    gram = block @ block.T
    np.testing.assert_allclose(gram - np.diag(np.diag(gram)), 0.0, atol=1e-4)
  np.testing.assert_array_equal(w, orthogonal_random_features(jax.random.key(3), 2 * P + 3, P))
  module = PerformerAttention(num_heads=H, num_features=7, feature_seed=3)
  # The module's are those directions computed once (jitted: within float32 round-off of the eager call above) ...
  np.testing.assert_allclose(module.projection(P), orthogonal_random_features(jax.random.key(3), 7, P), rtol=1e-6)
  np.testing.assert_array_equal(module.projection(P), PerformerAttention(num_heads=H, num_features=7,
                                                                          feature_seed=3).projection(P))  # fmt: skip
  # ... and a constant of a traced step: no QR (LAPACK geqrf) left in it.
  lowered = jax.jit(lambda: module.projection(P)).lower().as_text()
  assert (
    "geqrf" not in lowered
    and "geqrf" in jax.jit(orthogonal_random_features, static_argnums=(1, 2)).lower(jax.random.key(3), 7, P).as_text()
  )


def test_performer_approaches_softmax_with_many_features():
  """FAVOR+ is unbiased for exp(q k / sqrt(p)), so more features bring it to softmax attention.

  Tolerance 5% at m = 16384 (seed 0 gives 2.1%; seeds 0-7 give 1.5-5.4%: the exp features are heavy
  tailed, so the error falls slowly, ~m^-1/2). For scale: uniform attention is 27% away, m = 16 is 22%.
  """
  rng = np.random.default_rng(7)
  q, k, v = (0.5 * rng.standard_normal((1, H, N, P)) for _ in range(3))
  exact = np.stack([[_softmax_rows(q[0, h] @ k[0, h].T / np.sqrt(P)) @ v[0, h] for h in range(H)]])
  errors = {}
  for m in (16, 16384):
    projection = orthogonal_random_features(jax.random.key(0), m, P)
    approx = performer_attention(*(jnp.asarray(a, jnp.float32) for a in (q, k, v)), projection)
    errors[m] = ref.rel_err(approx, exact)
  assert errors[16384] < 0.05, errors
  assert errors[16] > 4 * errors[16384], errors


def test_nystromformer_with_all_landmarks_is_softmax_attention():
  """num_landmarks == N with the exact pseudo-inverse: S S^+ B = B, i.e. softmax attention (no conv).

  Unpadded: with padding the landmark kernel S has equal columns at the zeroed padded keys, so it is
  singular and S S^+ != I. The iterative path short-cuts m == N to masked softmax (as the release).
  Tolerance 1e-4: jnp.linalg.pinv of a float32 9 x 9 softmax matrix.
  """
  x = normal(8, (B, N, D))
  soft = SoftmaxAttention(num_heads=H)
  params = random_params(soft, x)
  exact = NystromAttention(num_heads=H, num_landmarks=N, conv_kernel_size=0, pinv="exact")
  expected = soft.apply({"params": params}, x)
  ref.assert_rel_close(exact.apply({"params": params}, x), expected, 1e-4, "exact pinv")
  ref.assert_rel_close(
    exact.apply({"params": params}, x), ref.softmax_attention(to_numpy(params), x, x, num_heads=H), 1e-4, "vs numpy"
  )
  pad = padding_mask(8, B, N)
  shortcut = NystromAttention(num_heads=H, num_landmarks=N, conv_kernel_size=0)
  allowed = np.broadcast_to(pad[:, None, None, :], (B, 1, N, N))
  ref.assert_rel_close(
    np.asarray(shortcut.apply({"params": params}, x, mask=pad))[pad],  # padded queries: zeroed q, see below
    ref.softmax_attention(to_numpy(params), x, x, num_heads=H, allowed=allowed)[pad],
    1e-5,
    "iterative m == N",
  )


def test_iterative_pinv_converges_to_pinv():
  """The iteration reaches np.linalg.pinv: of a random softmax matrix (condition ~1e2) in 20 steps; of a
  well-conditioned one (dominant diagonal) already in the paper's 6; also with the release's batch-wide scale."""
  rng = np.random.default_rng(9)
  rough = _softmax_rows(rng.standard_normal((2, 6, 6)))
  ref.assert_rel_close(iterative_pinv(jnp.asarray(rough, jnp.float32), 20), np.linalg.pinv(rough), 1e-4, "20 steps")
  batch = iterative_pinv(jnp.asarray(rough, jnp.float32), 20, scale="batch")
  ref.assert_rel_close(batch, np.linalg.pinv(rough), 1e-4, "batch scale")
  smooth = _softmax_rows(3 * np.eye(6) + 0.3 * rng.standard_normal((2, 6, 6)))
  ref.assert_rel_close(iterative_pinv(jnp.asarray(smooth, jnp.float32), 6), np.linalg.pinv(smooth), 1e-4, "6 steps")


def test_depthwise_sequence_conv_is_torchs_grouped_conv():
  """Conv2d(H, H, (K, 1), padding=(K // 2, 0), groups=H) on [B, H, L, p], against a float64 NumPy correlation;
  value and gradients also against XLA's NCHW grouped conv, the form it replaced (same sums)."""
  from primal_jax.attention.baselines.nystromformer import depthwise_sequence_conv

  v, kernel = normal(90, (2, 3, 11, 4)), normal(91, (5, 3))
  padded = np.pad(v.astype(np.float64), ((0, 0), (0, 0), (2, 2), (0, 0)))
  expected = sum(padded[:, :, i : i + 11] * kernel[i].astype(np.float64)[None, :, None, None] for i in range(5))
  ref.assert_rel_close(depthwise_sequence_conv(v, kernel), expected, 1e-6, "value")

  def nchw(v, kernel):
    rhs = jnp.transpose(kernel)[:, None, :, None]
    return jax.lax.conv_general_dilated(v, rhs, (1, 1), ((2, 2), (0, 0)), None, None, ("NCHW", "OIHW", "NCHW"), 3)

  grad = jax.grad(lambda f, v, k: jnp.sum(jnp.sin(f(v, k))), argnums=(1, 2))
  for got, want in zip(grad(depthwise_sequence_conv, v, kernel), grad(nchw, v, kernel), strict=True):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_nystromformer_segments_when_length_not_divisible():
  """N = 9 with 4 landmarks: segments floor(i m / N) of sizes 3, 2, 2, 2 (the reference's own rule)."""
  module = _module("nystromformer", num_landmarks=4)
  x = normal(10, (B, N, D))
  pad = padding_mask(10, B, N)
  params = random_params(module, x, mask=pad)
  out = module.apply({"params": params}, x, mask=pad)
  ref.assert_rel_close(out, reference("nystromformer", params, x, pad, module), 1e-5)


def test_linformer_cross_attention_and_shorter_sequences():
  """Keys of another length M <= max_len use the first M columns of E, F; queries of any length."""
  module = _module("linformer")
  x, y = normal(11, (B, 4, D)), normal(12, (B, 7, D))
  variables = jax.eval_shape(functools.partial(module.init, inputs_kv=y), jax.random.key(0), x)
  params = jax.tree.map(lambda a: jnp.asarray(normal(13, a.shape)), nn.meta.unbox(variables["params"]))
  out = module.apply({"params": params}, x, inputs_kv=y)
  chex.assert_shape(out, (B, 4, D))
  p64 = to_numpy(params)
  q, k, v = _heads(p64, x, y)
  ref.assert_rel_close(out, _merge(p64, linformer_ref(q, k, v, p64["E"], p64["F"])), 1e-5)
  assert params["E"].shape == (H, 5, 12)


def test_causal_outputs_ignore_the_future():
  """Causal linear and cosFormer: changing positions > t leaves outputs <= t unchanged."""
  for name in ("linear", "cosformer"):
    module = _module(name, causal=True)
    x = normal(14, (B, N, D))
    params = random_params(module, x)
    later = x.copy()
    later[:, 5:] = normal(15, (B, N - 5, D))
    a, b = (np.asarray(module.apply({"params": params}, inp))[:, :5] for inp in (x, later))
    ref.assert_rel_close(b, a, 1e-6, name)


# ============================================================================ models and configuration


TINY = dict(
  vocab_size=11,
  max_len=16,
  dim=16,
  hidden_dim=32,
  num_heads=2,
  num_classes=3,
  dropout_rate=0.0,
  attention_dropout_rate=0.0,
  attention={
    "performer": dict(num_features=16),
    "linformer": dict(linformer_k=6),
    "nystromformer": dict(num_landmarks=4, conv_kernel_size=3),
  },
)


def test_sequence_classifier_with_baseline_layers():
  """TransformerConfig(layers=(every baseline..., "softmax")) builds a SequenceClassifier: each block gets the
  attention it names (parameters and all), and the jitted forward gives finite logits."""
  config = TransformerConfig(layers=(*BASELINES, "softmax"), **TINY)
  model = SequenceClassifier(config)
  tokens = jnp.asarray(np.random.default_rng(0).integers(1, 11, (2, 12)), jnp.int32)
  mask = jnp.asarray(np.arange(12)[None] < np.array([[12], [8]]))
  shapes = jax.eval_shape(lambda: nn.unbox(model.init(jax.random.key(0), tokens, mask)))  # no init compile
  rng = np.random.default_rng(0)
  variables = jax.tree.map(lambda a: jnp.asarray(0.3 * rng.standard_normal(a.shape), a.dtype), shapes)
  logits = jax.jit(model.apply)(variables, tokens, mask)
  chex.assert_shape(logits, (2, 3))
  chex.assert_tree_all_finite(logits)
  extra = {"linformer": {"E", "F"}, "nystromformer": {"conv"}}
  for i, name in enumerate(config.layer_names):
    attention = variables["params"]["body"]["encoder"][f"block_{i}"]["attention"]
    assert set(attention) == {"query", "key", "value", "out"} | extra.get(name, set()), name
  assert variables["params"]["body"]["encoder"]["block_2"]["attention"]["E"].shape == (2, 6, 16)  # [H, k, max_len]


def test_config_accepts_every_registered_name_and_passes_its_options():
  """layers is checked against the registry; each layer's attention gets the model's fields it declares and its
  options (per attention name, then the layer's own), and bad option names or values fail at config time."""
  attention = {**TINY["attention"], "linformer": dict(linformer_k=6, share_kv=True)}
  layers = (*ATTENTIONS, ("performer", {"num_features": 8}))
  config = TransformerConfig(layers=layers, **{**TINY, "attention": attention, "attention_dropout_rate": 0.2})
  modules = {}
  for i, name in enumerate(config.layer_names):
    module = config.layer_attention(i)
    assert type(module) is get_attention(name) and module.num_heads == 2 and module.dropout_rate == 0.2
    modules.setdefault(name, module)
  assert modules["performer"].num_features == 16 and config.layer_attention(len(ATTENTIONS)).num_features == 8
  assert modules["linformer"].max_len == 16 and modules["linformer"].share_kv  # max_len: the model's
  assert (modules["nystromformer"].num_landmarks, modules["nystromformer"].pinv_iterations) == (4, 6)
  options = TransformerConfig(layers=("cosformer",), attention={"cosformer": {"dropout_rate": 0.0}})
  assert options.layer_attention(0).dropout_rate == 0.0  # an option overrides the model's attention dropout
  with pytest.raises(ValueError, match="layers"):
    TransformerConfig(layers=("linear", "nope"))
  with pytest.raises(ValueError, match="conv_kernel_size"):
    TransformerConfig(layers=("nystromformer",), attention={"nystromformer": {"conv_kernel_size": 4}})
  with pytest.raises(ValueError, match="linformer_k"):
    TransformerConfig(layers=("linformer",), attention={"linformer": {"linformer_k": 0}})
  with pytest.raises(ValueError, match="'num_landmark' is not an option of attention 'nystromformer'"):
    TransformerConfig(layers=("nystromformer",), attention={"nystromformer": {"num_landmark": 4}})
  with pytest.raises(ValueError, match="'num_heads' is set by the model config"):
    TransformerConfig(layers=(("linear", {"num_heads": 4}),))


X = np.zeros((B, N, D), np.float32)


@pytest.mark.parametrize(
  "name,kwargs,call_kwargs,match",
  [
    ("linformer", dict(max_len=N - 1), {}, "max_len"),
    ("linformer", dict(max_len=None), {}, "max_len"),
    ("nystromformer", dict(num_landmarks=N + 1), {}, "num_landmarks"),
    ("nystromformer", dict(conv_kernel_size=4), {}, "conv_kernel_size"),
    ("nystromformer", dict(pinv="svd"), {}, "pinv"),
    ("nystromformer", {}, dict(inputs_kv=np.zeros((B, 5, D), np.float32)), "conv_kernel_size"),
    ("performer", dict(num_features=0), {}, "num_features"),
    ("performer", dict(causal=True, form="release"), {}, "causal"),
    ("linear", dict(form="textbook"), {}, "form"),
    ("linear", dict(causal=True, form="release"), {}, "causal"),
    ("nystromformer", dict(form="release", pinv="exact"), {}, "pinv"),
    ("nystromformer", dict(form="release", num_landmarks=4), {}, "divisible by num_landmarks"),
    ("linformer", dict(form="release"), {}, "max_len"),
    ("cosformer", dict(causal=True, decode=True), {}, "horizon"),
    ("linformer", dict(causal=True), {}, "causal"),
    ("nystromformer", dict(causal=True), {}, "causal"),
    ("nystromformer", dict(decode=True, causal=True), {}, "causal"),
    ("linear", dict(num_heads=3), {}, "qkv_features"),
    ("cosformer", {}, dict(mask=np.ones((B, N + 1), bool)), "mask"),
    ("linear", {}, dict(inputs_k=np.zeros((B, 5, D), np.float32), inputs_kv=X), "inputs_kv"),
    ("cosformer", dict(causal=True), dict(inputs_kv=np.zeros((B, 5, D), np.float32)), "causal"),
  ],
)
def test_clear_errors(name, kwargs, call_kwargs, match):
  """Invalid configurations and inputs raise ValueError naming the argument."""
  with pytest.raises(ValueError, match=match):
    module = get_attention(name)(**{"num_heads": H, **MODULE_KWARGS[name], **kwargs})
    jax.eval_shape(functools.partial(module.init, **call_kwargs), jax.random.key(0), X)


def test_dropout_on_head_outputs():
  """dropout_rate needs `deterministic`; True equals no dropout, False changes the output."""
  x = normal(16, (B, N, D))
  base = _module("linear")
  params = random_params(base, x)
  drop = _module("linear", dropout_rate=0.5)
  np.testing.assert_array_equal(
    drop.apply({"params": params}, x, deterministic=True), base.apply({"params": params}, x)
  )
  noisy = drop.apply({"params": params}, x, deterministic=False, rngs={"dropout": jax.random.key(1)})
  assert ref.rel_err(noisy, base.apply({"params": params}, x)) > 1e-3
  assert math.isfinite(float(jnp.sum(noisy)))


@pytest.mark.parametrize("name", BASELINES)
def test_masks_beyond_padding_are_refused(name):
  """A causal (or causal + padding) Flax mask given to a non-causal baseline, and an additive float mask, are
  refused (ValueError eagerly, NaN rows under jit) instead of being reduced to padding; a padding mask built as
  a Flax attention mask still works. Before: the causal mask was silently dropped."""
  module = _module(name)
  x = normal(11, (B, N, D))
  pad = padding_mask(0, B, N)
  params = random_params(module, x, mask=pad)
  causal = nn.combine_masks(nn.make_attention_mask(pad, pad), nn.make_causal_mask(pad))
  with pytest.raises(ValueError, match="cannot honour this mask"):
    module.apply({"params": params}, x, mask=causal)
  additive = jnp.where(nn.make_attention_mask(pad, pad), 0.0, -1e9)
  with pytest.raises(ValueError, match="additive mask"):
    module.apply({"params": params}, x, mask=additive)
  jitted = jax.jit(lambda m: module.apply({"params": params}, x, mask=m))
  assert np.isnan(np.asarray(jitted(causal))).all(axis=(1, 2)).all()
  np.testing.assert_allclose(
    np.asarray(module.apply({"params": params}, x, mask=nn.make_attention_mask(pad, pad))),
    np.asarray(module.apply({"params": params}, x, mask=pad)),
    rtol=1e-6,
    atol=1e-6,
  )


@pytest.mark.parametrize("name", ["linear", "cosformer"])
def test_causal_baseline_honours_a_causal_mask(name):
  """A causal baseline mixes only j <= i, so a causal (+ padding) mask is honoured and equals the padding mask."""
  module = _module(name, causal=True)
  x = normal(12, (B, N, D))
  pad = np.ones((B, N), bool)
  params = random_params(module, x, mask=pad)
  causal = nn.combine_masks(nn.make_attention_mask(pad, pad), nn.make_causal_mask(pad))
  np.testing.assert_allclose(
    np.asarray(module.apply({"params": params}, x, mask=causal)),
    np.asarray(module.apply({"params": params}, x, mask=pad)),
    rtol=1e-6,
    atol=1e-6,
  )
