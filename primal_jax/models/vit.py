"""Vision Transformer in the DeiT layout (Touvron et al., 2021), each layer's attention from the registry.

Images [B, H, W, C] -> patches (a P x P convolution with stride P) -> [B, (H/P)(W/P), D], plus a learned
class token at position 0 and a learned position embedding over all N = (H/P)(W/P) + 1 tokens; then
pre-norm blocks (`TransformerStack`: LayerNorm eps 1e-6, exact GELU MLPs, DeiT's drop path) and the
final LayerNorm; the logits are a Linear of the class token's output. This is timm's
`VisionTransformer` as DeiT trains it (no distillation token, no pre-logits layer).

DeiT (softmax everywhere), Primal.+DeiT (the last `num_primal_layers` blocks Primal, as the release's
`ComboVisionTransformer`), PrimalFormer-ViT (every block Primal) and the baselines are configs
(`vit_config`), not classes. The release's CV Primal block is `PrimalAttention` with data-dependent
weights built from the norm1 output with n = min(N, s * rank_multi) rows: all N tokens in order when
they fit (trunc(linspace(0, N-1, N)) is 0..N-1), else the release's linspace sample. The module sets
this n on every data-dependent Primal layer whose options leave `num_samples` unset, since N is known
only from the image size. Its KSVD loss is `ksvd.RELEASE_LRA` (one J per layer from batch means, the
trace on the raw We, Wr). The release's fused `qk` Linear is our query and key projections side by
side (`primal_jax.convert.vit`).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from primal_jax.attention import PrimalAttention, get_attention
from primal_jax.attention.registry import LayerSpec
from primal_jax.dropout import Dropout
from primal_jax.initializers import linear_inits
from primal_jax.models.blocks import TransformerStack, dense
from primal_jax.models.config import TransformerConfig, model_layers
from primal_jax.models.registry import BuiltModel, body_config, model_sections
from primal_jax.validation import check_choice, check_positive

# Width and heads of the named sizes (depth 12, MLP ratio 4), as timm's deit_{tiny,small,base}.
VARIANTS = {"Ti": (192, 3), "S": (384, 6), "B": (768, 12)}
DEPTH = 12
# timm's VisionTransformer as DeiT builds it: LayerNorm eps 1e-6, exact GELU, pre-norm; N(0, 0.02) Linears with
# zero biases (timm's trunc_normal_(std=.02) truncates at +-2 absolute, 100 std: a plain normal), no dropout.
DEIT_BODY = dict(
  layer_norm_eps=1e-6,
  activation="gelu",
  exact_gelu=True,
  norm_position="pre",
  init_style="gpt2",
  dropout_rate=0.0,
  attention_dropout_rate=0.0,
  pooling="cls",
  mask_final=False,
)
MODELS = ("deit", "primal_plus", "primalformer")  # besides any registered attention name (the baselines)


def decode_variant(variant: str) -> dict:
  """ "S/16" -> {"dim": 384, "num_heads": 6, "patch_size": 16} (big_vision's naming; sizes Ti, S, B)."""
  match = re.fullmatch(r"(Ti|S|B)/(\d+)", str(variant))
  if not match:
    raise ValueError(
      f"variant must be '<size>/<patch>' with size one of {tuple(VARIANTS)}, e.g. 'S/16'; got {variant!r}"
    )
  dim, heads = VARIANTS[match.group(1)]
  patch = int(match.group(2))
  check_positive(patch, "variant patch size")
  return {"dim": dim, "num_heads": heads, "patch_size": patch}


def vit_layers(
  model: str = "deit", num_layers: int = DEPTH, *, num_primal_layers: int = 1, low_rank: int = 20, rank_multi: int = 10
) -> tuple:
  """Per-layer attention entries: "deit" (softmax everywhere), "primal_plus" (the last `num_primal_layers`
  Primal: the paper's Primal.+DeiT), "primalformer" (every layer Primal) or a registered attention name.

  Primal layers are the release's CV form: data-dependent, `low_rank` s and `rank_multi` (n is set by
  `VisionTransformer` from the token count), PyTorch-initialised projections. (The release's Primal block
  also keeps PyTorch's init in its MLP; ours is timm's N(0, 0.02) like every other block.)
  """
  if model == "deit":
    model = "softmax"
  names = model_layers(model, num_layers, num_primal_layers)
  # PyTorch's default Linear init for the Primal layer's own projections (query, key, combine, out), as the
  # release's `models_primal.Block`, built after timm's init and swapped in, keeps them.
  options = {"low_rank": low_rank, "rank_multi": rank_multi, "data_dependent": True, "init_style": "torch"}
  primal = ("primal", options)
  return tuple(primal if name == "primal" else name for name in names)


def vit_config(
  variant: str = "S/16",
  model: str = "deit",
  *,
  num_layers: int = DEPTH,
  num_primal_layers: int = 1,
  low_rank: int = 20,
  rank_multi: int = 10,
  num_classes: int = 1000,
  drop_path_rate: float = 0.1,
  mlp_ratio: int = 4,
  **overrides,
) -> TransformerConfig:
  """The `TransformerConfig` of a named ViT (`decode_variant`; the patch size is the module's, see
  `vit_patch_size`). `overrides` replace any field (e.g. dim=64, num_heads=4 for a small model)."""
  sizes = decode_variant(variant)
  dim = overrides.pop("dim", sizes["dim"])
  fields = dict(
    layers=vit_layers(model, num_layers, num_primal_layers=num_primal_layers, low_rank=low_rank, rank_multi=rank_multi),
    dim=dim,
    num_heads=sizes["num_heads"],
    hidden_dim=mlp_ratio * dim,
    num_classes=num_classes,
    drop_path_rate=drop_path_rate,
  )
  return TransformerConfig(**{**DEIT_BODY, **fields, **overrides})


def vit_patch_size(variant: str) -> int:
  return decode_variant(variant)["patch_size"]


def with_token_count(config: TransformerConfig, num_tokens: int) -> TransformerConfig:
  """`config` for sequences of `num_tokens`: every data-dependent Primal layer without `num_samples` gets
  n = min(num_tokens, low_rank * rank_multi) (the release's CV rule), and `max_len` = num_tokens."""
  layers = []
  for spec in config.layers:
    cls = get_attention(spec.attention)
    options = spec.kwargs
    if issubclass(cls, PrimalAttention) and options.get("data_dependent", True) and "num_samples" not in options:
      s = options.get("low_rank", PrimalAttention.low_rank)
      multi = options.get("rank_multi", PrimalAttention.rank_multi)
      spec = LayerSpec.of((spec.attention, {**options, "num_samples": min(num_tokens, s * multi)}))
    layers.append(spec)
  # A copy, not `dataclasses.replace` (see `decision_transformer.with_masking`): the specs are checked above.
  resolved = copy.copy(config)
  object.__setattr__(resolved, "layers", tuple(layers))
  object.__setattr__(resolved, "max_len", num_tokens)
  return resolved


def _pair(value, name: str) -> tuple[int, int]:
  pair = (value, value) if isinstance(value, int) else tuple(value)
  if len(pair) != 2:
    raise ValueError(f"{name} must be an int or a (height, width) pair, got {value!r}")
  for v in pair:
    check_positive(v, name)
  return pair


class VisionTransformer(nn.Module):
  """Images [B, H, W, C] -> logits [B, num_classes] (DeiT layout, module doc).

  Attributes:
    config: the body (`vit_config`); `config.dim` is D, `config.num_classes` the head's outputs.
    image_size: H (= W) or (H, W); the position embedding has (H/P)(W/P) + 1 rows.
    patch_size: P or (P_h, P_w); H and W must be multiples of it.
    primal_qk_on_finetune: "init" (the release) or "pretrained", see `keep_init_on_finetune`.
  """

  config: TransformerConfig
  image_size: int | tuple[int, int] = 224
  patch_size: int | tuple[int, int] = 16
  # Fine-tuning from a softmax checkpoint (`keep_init_on_finetune`): the Primal layers' query and key are
  # drawn afresh as in the release ("init"), or taken from the pretrained layer's q and k ("pretrained").
  primal_qk_on_finetune: str = "init"

  @property
  def grid(self) -> tuple[int, int]:
    (h, w), (ph, pw) = _pair(self.image_size, "image_size"), _pair(self.patch_size, "patch_size")
    if h % ph or w % pw:
      raise ValueError(f"image_size {(h, w)} must be a multiple of patch_size {(ph, pw)}")
    return h // ph, w // pw

  @property
  def num_tokens(self) -> int:
    """N: the patches plus the class token."""
    gh, gw = self.grid
    return gh * gw + 1

  @nn.compact
  def __call__(self, images: jax.Array, deterministic: bool = True) -> jax.Array:
    cfg = with_token_count(self.config, self.num_tokens)
    size, (ph, pw) = _pair(self.image_size, "image_size"), _pair(self.patch_size, "patch_size")
    if images.ndim != 4 or tuple(images.shape[1:3]) != size:
      raise ValueError(f"images must have shape [batch, {size[0]}, {size[1]}, channels], got {tuple(images.shape)}")
    channels = images.shape[-1]
    # The patch embedding keeps PyTorch's Conv2d default init in timm (its ViT init only visits Linears).
    kernel_init, bias_init = linear_inits("torch" if cfg.init_style == "gpt2" else cfg.init_style, ph * pw * channels)
    x = nn.Conv(
      cfg.dim,
      (ph, pw),
      strides=(ph, pw),
      padding="VALID",
      dtype=cfg.dtype,
      param_dtype=cfg.param_dtype,
      kernel_init=nn.with_logical_partitioning(kernel_init, (None, None, None, "embed")),
      bias_init=nn.with_logical_partitioning(bias_init, ("embed",)),
      name="patch_embed",
    )(images.astype(cfg.dtype))  # [B, H/P, W/P, D]
    batch = x.shape[0]
    x = x.reshape(batch, -1, cfg.dim)  # [B, N-1, D], patches row-major as torch's flatten(2)
    init = nn.with_logical_partitioning(nn.initializers.normal(0.02), (None, None, "embed"))
    cls = self.param("cls_token", init, (1, 1, cfg.dim), cfg.param_dtype)
    pos = self.param("pos_embed", init, (1, self.num_tokens, cfg.dim), cfg.param_dtype)
    cls = jnp.broadcast_to(cls.astype(cfg.dtype), (batch, 1, cfg.dim))
    x = jnp.concatenate([cls, x], axis=1) + pos.astype(cfg.dtype)  # [B, N, D], class token first
    x = Dropout(cfg.dropout_rate, impl=cfg.dropout_impl)(x, deterministic=deterministic)
    x = TransformerStack(cfg, name="encoder")(x, None, deterministic)  # blocks + final LayerNorm
    return dense(cfg, cfg.num_classes, cfg.dim, ("embed", "classes"), "head")(x[:, 0])

  def keep_init_on_finetune(self, path: str) -> bool:
    """`restore_matching_params`' keep_init: a Primal layer's query and key stay initialised unless
    `primal_qk_on_finetune == "pretrained"` (the release's fused `qk` matches no key of a DeiT checkpoint,
    so `load_state_dict(strict=False)` leaves it fresh)."""
    check_choice(self.primal_qk_on_finetune, ("init", "pretrained"), "primal_qk_on_finetune")
    match = re.fullmatch(r"encoder/block_(\d+)/attention/(query|key)/(kernel|bias)", path)
    if self.primal_qk_on_finetune == "pretrained" or not match:
      return False
    layer = self.config.layers[int(match.group(1))]
    return issubclass(get_attention(layer.attention), PrimalAttention)

  @staticmethod
  def adapt_pretrained(path: str, saved: np.ndarray, shape: tuple[int, ...]) -> np.ndarray | None:
    """`restore_matching_params`' adapter: a pretrained position embedding resized to this image size
    (DeiT's fine-tuning rule), a patch embedding brought to this patch size and channel count
    (`adapt_patch_kernel`); any other leaf of another shape is left to the caller (None)."""
    if path == "pos_embed" and saved.ndim == 3 and saved.shape[2] == shape[2]:
      return resize_pos_embed(saved, shape[1])
    if path == "patch_embed/kernel" and saved.ndim == 4 and len(shape) == 4:
      return adapt_patch_kernel(saved, shape)
    return None


def adapt_patch_kernel(kernel: np.ndarray, shape: tuple[int, ...]) -> np.ndarray | None:
  """A pretrained patch embedding kernel [P, Q, C, D] for patches [P', Q', C', D] (None if it cannot be).

  RGB to grayscale (C = 3, C' = 1) sums the colour channels, as timm's `adapt_input_conv` does: a gray image
  read as R = G = B then embeds exactly as before. Another patch size resizes the kernel bilinearly and scales
  it by PQ / P'Q', so that a uniform patch keeps its embedding (exactly for a constant kernel, approximately
  otherwise: fine-tuning is expected to correct the rest). Any other change (width, other channel counts) is
  None.
  """
  kernel = np.asarray(kernel)
  (p, q, c, d), (p2, q2, c2, d2) = kernel.shape, tuple(shape)
  if d != d2 or (c, c2) not in ((c2, c2), (3, 1)):
    return None
  out = kernel.sum(axis=2, keepdims=True) if c != c2 else kernel
  if (p, q) != (p2, q2):
    resized = jax.image.resize(jnp.asarray(out, jnp.float32), (p2, q2, c2, d), method="linear")
    out = np.asarray(resized) * (p * q / (p2 * q2))
  return out.astype(kernel.dtype)


def resize_pos_embed(pos_embed: np.ndarray, num_tokens: int) -> np.ndarray:
  """A [1, 1 + g*g, D] position embedding for `num_tokens` = 1 + h*h tokens: the class row kept, the
  patch grid resized bicubically (as DeiT's fine-tuning does; jax.image's cubic kernel is Keys' a = -0.5,
  torch's bicubic a = -0.75, so values differ slightly from DeiT's)."""
  pos_embed = np.asarray(pos_embed)
  old, dim = pos_embed.shape[1] - 1, pos_embed.shape[2]
  g, h = math.isqrt(old), math.isqrt(num_tokens - 1)
  if g * g != old or h * h != num_tokens - 1:
    raise ValueError(f"pos_embed: only square grids resize, got {old} -> {num_tokens - 1} patches")
  grid = pos_embed[0, 1:].reshape(g, g, dim)
  resized = jax.image.resize(jnp.asarray(grid, jnp.float32), (h, h, dim), method="cubic")
  return np.concatenate([pos_embed[:, :1], np.asarray(resized, pos_embed.dtype).reshape(1, h * h, dim)], axis=1)


@dataclasses.dataclass(frozen=True)
class VitOptions:
  """The ViT's own keys of a config's `model` section (the rest are its DeiT body's); see `VisionTransformer`."""

  patch_size: int | tuple[int, int] = 16
  primal_qk_on_finetune: str = "init"


def build(model_config, info) -> BuiltModel:
  """`model.name="vit"`: the Vision Transformer (DeiT layout): images [B, H, W, C] -> logits.

  The body defaults to DeiT's (`DEIT_BODY`: LayerNorm eps 1e-6, exact GELU, timm's init, no dropout);
  `info.image_shape` (an `ImageDatasetInfo`) gives the image size, `model.patch_size` the patch. Primal
  layers are data-dependent with n = min(N, s * rank_multi) rows unless their options say otherwise.
  Fine-tuning from another model's params adapts the position and patch embeddings (`adapt_pretrained`) and
  keeps the Primal layers' query and key initialised (`keep_init_on_finetune`).
  """
  options, kwargs = model_sections(model_config, VitOptions)
  shape = getattr(info, "image_shape", None)
  if not shape:
    raise ValueError(f"model 'vit' needs an image task (data.task='images'); {info.name!r} has no image_shape")
  config = body_config("vit", **{**DEIT_BODY, "num_classes": info.num_classes, **kwargs})
  module = VisionTransformer(
    config,
    image_size=tuple(shape[:2]),
    patch_size=options.patch_size,
    primal_qk_on_finetune=options.primal_qk_on_finetune,
  )
  return BuiltModel(
    module,
    ("inputs",),
    adapt_pretrained=VisionTransformer.adapt_pretrained,
    keep_init_on_finetune=module.keep_init_on_finetune,
  )
