"""The NNX class of every registered attention: `get_attention(name)`, made from the Linen registry.

No mechanism has NNX code of its own: the NNX class of a name is `Attention` with that name's Linen
class (`primal_jax.attention.get_attention(name)`), made once per Linen class, so a mechanism registered
later with `register_attention` has one too.
"""

from __future__ import annotations

from primal_jax.attention import registry as linen_registry
from primal_jax.attention.primal import PrimalAttention as LinenPrimal
from primal_jax.attention.shell import AttentionShell
from primal_jax.attention.softmax import SoftmaxAttention as LinenSoftmax
from primal_jax.nnx.shell import Attention


class PrimalAttention(Attention):
  """Primal-Attention (`primal_jax.attention.PrimalAttention`'s options: low_rank, data_dependent, ...) in NNX.

  Each full-sequence call stores the layer's KSVD terms in `self.ksvd` (a `KSVDVariable`).
  """

  linen_class = LinenPrimal


class SoftmaxAttention(Attention):
  """Softmax attention (`primal_jax.attention.SoftmaxAttention`, the release's -1e6 masking) in NNX."""

  linen_class = LinenSoftmax


_CLASSES: dict[type[AttentionShell], type[Attention]] = {LinenPrimal: PrimalAttention, LinenSoftmax: SoftmaxAttention}


def nnx_class(linen_class: type[AttentionShell]) -> type[Attention]:
  """The NNX layer class of a Linen attention class (made on first use, then the same class)."""
  if not (isinstance(linen_class, type) and issubclass(linen_class, AttentionShell)):
    raise ValueError(f"an attention must subclass primal_jax.attention.AttentionShell, got {linen_class!r}")
  if linen_class not in _CLASSES:
    doc = f"`{linen_class.__module__}.{linen_class.__name__}` in NNX (see `primal_jax.nnx.Attention`)."
    _CLASSES[linen_class] = type(linen_class.__name__, (Attention,), {"linen_class": linen_class, "__doc__": doc})
  return _CLASSES[linen_class]


def get_attention(name: str) -> type[Attention]:
  """The NNX class of the attention registered as `name` (ConfigError naming the registered ones otherwise)."""
  return nnx_class(linen_registry.get_attention(name))
