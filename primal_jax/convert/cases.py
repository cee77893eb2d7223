"""Rebuild a reference case (shared/reference format) in primal_jax and run it.

A case is `<case>.npz` (torch state_dict + inputs + outputs) with `<case>.json`
beside it (module class, constructor config). Every shape and hyper-parameter
is read from these files, so any seed or size of a supported kind works.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import zipfile
import zlib

import jax
import jax.numpy as jnp
import numpy as np
from flax.errors import ScopeParamShapeError

from primal_jax.attention import PrimalAttention
from primal_jax.convert import torch_layout
from primal_jax.convert.baseline_cases import release_attention, run_lra_baseline
from primal_jax.convert.kinds import CASE_KINDS, check_case_json, module_class
from primal_jax.errors import ConfigError, MissingFileError
from primal_jax.ksvd import RELEASE_SEQUENCE, KSVDSpec, collect_terms, ksvd_loss, ksvd_loss_per_sample
from primal_jax.models import SequenceClassifier, TransformerConfig
from primal_jax.sampling import release_sample_indices
from primal_jax.validation import check_choice


@dataclasses.dataclass
class ReferenceCase:
  name: str
  meta: dict
  params: dict[str, np.ndarray]
  inputs: dict[str, np.ndarray]
  outputs: dict[str, np.ndarray]


def load_npz(path: str | os.PathLike) -> dict[str, np.ndarray]:
  """Every array of an `.npz` archive, read now, so that a damaged one (a CRC error, a truncated member, an array
  numpy cannot read without pickles) is a `ConfigError` naming the file and the array, not a traceback later; one
  that is not an archive at all (numpy's own message, about pickled data, points the wrong way) names the file."""
  path = os.fspath(path)
  try:
    archive = np.load(path)
  except (OSError, ValueError, zipfile.BadZipFile) as err:
    if isinstance(err, FileNotFoundError):
      raise MissingFileError(f"{path} does not exist") from err
    raise ConfigError(f"{path} is not an .npz archive (a zip of .npy arrays, as numpy.savez writes)") from err
  if not isinstance(archive, np.lib.npyio.NpzFile):
    raise ConfigError(f"{path} holds one array (.npy), not an .npz archive of named arrays")
  arrays = {}
  with archive:
    for name in archive.files:
      try:
        arrays[name] = archive[name]
      except (zipfile.BadZipFile, zlib.error, OSError, ValueError, EOFError) as err:
        cause = " ".join(str(err).split()) or type(err).__name__
        raise ConfigError(f"{path}: array {name!r} cannot be read ({cause}): the archive is damaged") from err
  return arrays


def read_case_json(json_path: str) -> dict:
  """A case's JSON, checked (`kinds.check_case_json`): one ConfigError line naming the file and the field."""
  try:
    with open(json_path, encoding="utf-8") as f:
      meta = json.load(f)
  except ValueError as err:  # JSONDecodeError and UnicodeDecodeError
    raise ConfigError(f"{json_path} is not valid JSON ({' '.join(str(err).split())})") from err
  check_case_json(meta, json_path)
  return meta


def load_case(npz_path: str) -> ReferenceCase:
  """Reads `<case>.npz`, its `<case>.json` and the per-layer `<case>_layer<i>.npz` files."""
  if not npz_path.endswith(".npz") or not os.path.isfile(npz_path):
    raise FileNotFoundError(f"reference case must be an existing .npz file, got {npz_path!r}")
  json_path = npz_path[: -len(".npz")] + ".json"
  if not os.path.isfile(json_path):
    raise FileNotFoundError(f"missing {json_path!r} beside {npz_path!r}")
  meta = read_case_json(json_path)
  z = load_npz(npz_path)
  for required in ("param_keys", "input_keys", "output_keys"):
    if required not in z:
      raise ValueError(f"{npz_path} has no {required!r} array: not a reference case")

  def named(list_key: str) -> dict[str, np.ndarray]:
    missing = [str(k) for k in z[list_key] if str(k) not in z]
    if missing:
      raise ConfigError(f"{npz_path}: {list_key} names {missing[0]!r}, which the archive does not hold")
    return {str(k): z[str(k)] for k in z[list_key]}

  params, inputs, outputs = named("param_keys"), named("input_keys"), named("output_keys")
  folder, name = os.path.dirname(npz_path), meta.get("case", os.path.basename(npz_path)[:-4])
  for key, info in meta.get("outputs", {}).items():
    file = info.get("file")
    if file and file != os.path.basename(npz_path) and key not in outputs:
      side = os.path.join(folder, file)
      if not os.path.isfile(side):
        raise MissingFileError(f"output {key!r} is in {file}, which is missing beside {npz_path} (its JSON names it)")
      extra = load_npz(side)
      in_file = info.get("key_in_file", key.split("/")[-1])
      if in_file not in extra:
        raise ConfigError(f"output {key!r}: {side} has no array {in_file!r}")
      outputs[key] = extra[in_file]
  return ReferenceCase(name, meta, params, inputs, outputs)


def _cross_entropy(logits, labels):
  return jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, labels[:, None], -1)[:, 0]


def _primal_layer_outputs(module, params, x):
  out, state = module.apply({"params": params}, x, mutable=["ksvd", "intermediates"])
  inter = state["intermediates"]
  return out, inter["escore"][0], inter["rscore"][0], collect_terms(state["ksvd"])[0]


def run_lra_classifier(case: ReferenceCase) -> dict[str, np.ndarray]:
  """The release's LRA `ModelForSC` (PrimalFormer, Primal.+Trans., softmax or a baseline attention)."""
  cfg = case.meta["config"]
  baseline = release_attention(cfg, case.meta.get("random_state"))
  if baseline is not None:
    return run_lra_baseline(case, *baseline)
  params, layers = torch_layout.lra_classifier_params(case.params, cfg["num_head"])
  primal_idx = [i for i, name in enumerate(layers) if name == "primal"]
  we_shape = params["body"]["encoder"][f"block_{primal_idx[0]}"]["attention"]["We"].shape if primal_idx else None
  config = TransformerConfig(
    layers=layers,
    vocab_size=cfg["vocab_size"],
    max_len=params["body"]["embed"]["positions"]["embedding"].shape[0],
    dim=cfg["transformer_dim"],
    hidden_dim=cfg["transformer_hidden_dim"],
    num_heads=cfg["num_head"],
    attention={"primal": dict(low_rank=we_shape[2], num_samples=we_shape[1])} if we_shape else {},
    pooling={"MEAN": "mean", "CLS": "cls"}[cfg["pooling_mode"]],
    num_classes=cfg["num_classes"],
  )
  tokens = jnp.asarray(case.inputs["input_ids"], jnp.int32)
  mask = jnp.asarray(case.inputs["mask"], jnp.float32)
  if cfg["pooling_mode"] == "CLS":  # the release's append_cls: id vocab_size-1 first, last token dropped
    tokens = jnp.concatenate([jnp.full_like(tokens[:, :1], cfg["vocab_size"] - 1), tokens[:, :-1]], axis=1)
    mask = jnp.concatenate([jnp.ones_like(mask[:, :1]), mask[:, :-1]], axis=1)
  labels = jnp.asarray(case.inputs["label"], jnp.int32)
  logits, state = SequenceClassifier(config).apply({"params": params}, tokens, mask, mutable=["ksvd", "intermediates"])
  out = {"logits": logits, "encoder_out": state["intermediates"]["encoder_out"][0]}
  ce = _cross_entropy(logits, labels)
  if not primal_idx:
    out["loss"] = ce
    return out
  spec = KSVDSpec("release", "params" if cfg.get("trace_no_x", True) else "data", "batch", "mean")
  loss_ksvd = ksvd_loss(state["ksvd"], spec)
  out.update(loss_ce=ce, loss_ksvd=loss_ksvd, loss=ce + cfg["eta"] * loss_ksvd)
  out["sampled_indices"] = release_sample_indices(tokens.shape[1], we_shape[1])
  blocks = state["intermediates"]["body"]["encoder"]
  for i in primal_idx:
    attn = blocks[f"block_{i}"]["attention"]
    out[f"layer{i}/escore"], out[f"layer{i}/rscore"] = attn["escore"][0], attn["rscore"][0]
  return out


def _stacked_prefixes(state_dict, layout: str) -> list[str]:
  we_key = torch_layout.ATTENTION_KEYS[layout]["We"]
  prefixes = sorted(k[: -len(we_key)] for k in state_dict if k.endswith(we_key))
  return sorted(prefixes, key=len)  # "" (layer 0) first, then "layer1.", ...


def run_timeseries_layers(case: ReferenceCase) -> dict[str, np.ndarray]:
  """The release's time-series `AttentionLayer`s stacked directly, plus `NoFussCE_KSVD`."""
  cfg = case.meta["config"]
  x = jnp.asarray(case.inputs["x"])
  out, terms = {}, []
  for i, prefix in enumerate(_stacked_prefixes(case.params, "timeseries")):
    params = torch_layout.attention_params(case.params, prefix, "timeseries")
    heads, n, s = params["We"].shape
    module = PrimalAttention(num_heads=heads, low_rank=s, num_samples=n)
    x, e, r, t = _primal_layer_outputs(module, params, x)
    out["out" if i == 0 else f"layer{i}_out"] = x
    out[f"layer{i}/escore"], out[f"layer{i}/rscore"] = e, r
    terms.append(t)
    out["sampled_indices"] = release_sample_indices(x.shape[1], n)
  if "logits" in case.inputs:
    ce = _cross_entropy(jnp.asarray(case.inputs["logits"]), jnp.asarray(case.inputs["targets"]).reshape(-1))
    loss_ksvd = ksvd_loss_per_sample(terms, RELEASE_SEQUENCE)
    out.update(loss_ce=ce, loss_ksvd=loss_ksvd, loss_total=ce + cfg["eta"] * loss_ksvd)
  return out


def _causal_layer(case: ReferenceCase, layout: str, x):
  params = torch_layout.attention_params(case.params, "", layout)
  heads = params["We"].shape[0]
  module = PrimalAttention(num_heads=heads, low_rank=params["We"].shape[2], data_dependent=False, causal=True)
  return _primal_layer_outputs(module, params, x)


def run_rl_layer(case: ReferenceCase) -> dict[str, np.ndarray]:
  """The release's Decision-Transformer `Primal_attention` and its trainer's KSVD term."""
  y, e, r, terms = _causal_layer(case, "rl", jnp.asarray(case.inputs["x"]))
  per_sample = ksvd_loss_per_sample([terms], RELEASE_SEQUENCE)
  eta = case.meta["config"].get("eta", 0.05)
  return dict(
    out=y,
    escore=e,
    rscore=r,
    ksvd_per_sample=per_sample,
    loss_ksvd=jnp.mean(per_sample),
    trainer_eta_loss_ksvd=eta * jnp.mean(per_sample),
  )


def run_fairseq_layer(case: ReferenceCase) -> dict[str, np.ndarray]:
  """The release's fairseq `PrimalMultiheadAttention` (time-major) and its criterion's KSVD term."""
  x = jnp.swapaxes(jnp.asarray(case.inputs["x"]), 0, 1)  # [T, B, C] -> [B, T, C]
  y, e, r, terms = _causal_layer(case, "fairseq", x)
  # 0.1: the eta of the release's fairseq CrossEntropyCriterion, unless the case says otherwise.
  eta = case.meta["config"].get("eta", 0.1)
  return dict(
    out=jnp.swapaxes(y, 0, 1), escore=e, rscore=r, criterion_ksvd_term=eta * ksvd_loss([terms], RELEASE_SEQUENCE)
  )


RUNNERS = CASE_KINDS  # the kinds of case `run_case` runs (`primal_jax.convert.kinds`), by torch_module.class


FRONTENDS = ("linen", "nnx")


def run_case(case: ReferenceCase, frontend: str = "linen") -> dict[str, np.ndarray]:
  """Our outputs for every golden output we can compute, as numpy arrays.

  frontend "nnx" runs every attention layer of the case as its `primal_jax.nnx` layer
  (`primal_jax.nnx.through_nnx`); a case without one is a ValueError.
  """
  check_choice(frontend, FRONTENDS, "frontend")
  check_case_json(case.meta, f"case {case.name!r}")  # also a case built in code, not read by `load_case`
  kind = module_class(case.meta)
  if kind not in CASE_KINDS:
    raise ValueError(f"case {case.name!r}: unsupported module class {kind!r}; known: {tuple(CASE_KINDS)}")
  run = CASE_KINDS[kind].runner(kind)
  try:
    if frontend == "nnx":
      from primal_jax.nnx.convert import through_nnx  # imported only when asked for

      with through_nnx() as substituted:
        outputs = run(case)
      if not substituted.calls:
        raise ValueError(f"case {case.name!r}: no attention layer ran through the NNX layers")
    else:
      outputs = run(case)
  except ScopeParamShapeError as err:
    raise _wrong_shape(case, str(err)) from err
  return {k: np.asarray(v) for k, v in outputs.items()}


_SHAPE_ERROR = re.compile(r'parameter "(\w+)" in "([^"]*)".*generate shape (\([\d, ]*\)).*has shape (\([\d, ]*\))')


def _wrong_shape(case: ReferenceCase, message: str) -> ConfigError:
  """Flax's shape error names our parameter; the state_dict key with that shape (as is or transposed, when
  only one has it) is what the user can fix in the case file."""
  found = _SHAPE_ERROR.search(message)
  if not found:
    return ConfigError(f"case {case.name!r}: a weight has the wrong shape: {message}")
  name, scope, expected, given = found.groups()
  shape = tuple(int(d) for d in given.strip("()").split(",") if d.strip())
  keys = [k for k, v in case.params.items() if v.shape in (shape, shape[::-1])]
  source = f" (state_dict key {keys[0]})" if len(keys) == 1 else ""
  return ConfigError(
    f"case {case.name!r}: parameter {scope}/{name}{source} has shape {given}, but the module its JSON describes "
    f"expects {expected}"
  )


def relative_errors(case: ReferenceCase, ours: dict[str, np.ndarray]) -> dict[str, float]:
  """max|ours - golden| / max|golden| per output (integer outputs: fraction of mismatches)."""
  errors = {}
  for key, golden in case.outputs.items():
    if key not in ours:
      continue
    mine = ours[key]
    if mine.shape != golden.shape:
      raise ValueError(f"{case.name}/{key}: shape {mine.shape} but golden {golden.shape}")
    if np.issubdtype(golden.dtype, np.integer):
      errors[key] = float(np.mean(mine != golden))
    else:
      scale = max(float(np.max(np.abs(golden))), np.finfo(np.float32).tiny)
      errors[key] = float(np.max(np.abs(mine.astype(np.float64) - golden))) / scale
  return errors
