"""`python -m primal_jax.convert verify CASE.npz [CASE.npz ...]` and `... timm CHECKPOINT OUT_DIR --model=NAME`.

verify: rebuilds each reference case from its JSON, runs it, prints the max
relative error of every output it can compute, and exits 1 if any exceeds the
tolerance. timm: converts a timm ViT / DeiT checkpoint into an orbax checkpoint
of `VisionTransformer` params that `config.init_from` accepts
(`primal_jax.convert.timm`).

Exit status: 0 when everything passed; 1 when an output is beyond the
tolerance (the conversion is wrong); 2 when an input cannot be used (not an
.npz archive, a damaged one, a missing file or key, a case JSON that is not an
object or has a field of the wrong type, a weight of the wrong shape), each
said in one line `FILE: error: ...` naming the file and, where it is one, the
parameter or field. The kinds of case verify runs, and the JSON fields each
reads: `primal_jax.convert.kinds`.
"""

from __future__ import annotations

import argparse
import json
import sys

from primal_jax.convert.cases import FRONTENDS, load_case, relative_errors, run_case
from primal_jax.convert.kinds import module_class

DEFAULT_TOLERANCE = 1e-4
PRECISIONS = ("highest", "high", "default")
EXIT_FAILED, EXIT_BAD_INPUT = 1, 2
# What a file the user passed can do wrong; anything else is a bug and keeps its traceback.
INPUT_ERRORS = (OSError, ValueError, KeyError)


def verify(path: str, tolerance: float, out=None, frontend: str = "linen", precision: str = "highest") -> bool:
  """Runs one case and prints its errors; `precision` is JAX's matmul precision for the run.

  "highest" by default: the golden numbers are float32 PyTorch on a CPU, and an accelerator's default (TF32 on
  NVIDIA GPUs, bf16 passes on TPUs) misses them by ~1e-3, which would read as a wrong conversion.
  """
  import jax

  out = sys.stdout if out is None else out
  case = load_case(path)
  with jax.default_matmul_precision(precision):
    errors = relative_errors(case, run_case(case, frontend))
  if not errors:
    print(f"{case.name}: no output could be computed", file=out)
    return False
  missing = sorted(set(case.outputs) - set(errors))
  width = max(len(k) for k in errors)
  through = "" if frontend == "linen" else f", through the {frontend} layers"
  print(f"{case.name} ({case.meta['torch_module'].get('class', module_class(case.meta))}{through})", file=out)
  for key, err in errors.items():
    print(f"  {key:<{width}}  max rel err {err:.3e}  {'ok' if err <= tolerance else 'FAIL'}", file=out)
  for key in missing:
    print(f"  {key:<{width}}  (not computed)", file=out)
  return all(err <= tolerance for err in errors.values())


def _report(path: str, err: BaseException) -> None:
  """`FILE: error: <the error in one line>` on stderr (the file said once, where the message starts with it too)."""
  text = str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)  # KeyError quotes its text
  text = " ".join(text.split()).removeprefix(f"{path}: ")
  print(f"{path}: error: {text}", file=sys.stderr)


def _timm(args) -> int:
  from primal_jax.convert.timm import convert_timm_checkpoint

  try:
    described = convert_timm_checkpoint(args.checkpoint, args.out_dir, args.model)
  except INPUT_ERRORS as err:
    _report(args.checkpoint, err)
    return EXIT_BAD_INPUT
  print(f"wrote {args.out_dir}: {args.model} ({described['num_layers']} blocks, {described['num_classes']} classes)")
  print(json.dumps(described))
  return 0


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m primal_jax.convert", description=__doc__)
  sub = parser.add_subparsers(dest="command", required=True)
  v = sub.add_parser("verify", help="check reference cases against the PyTorch release's golden outputs")
  v.add_argument("cases", nargs="+", help="<case>.npz files (with <case>.json beside them)")
  v.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE, help="max relative error per output")
  v.add_argument(
    "--frontend", choices=FRONTENDS, default="linen", help="run the attention layers as Linen or NNX (primal_jax.nnx)"
  )
  v.add_argument(
    "--precision", default="highest", choices=PRECISIONS,
    help="matmul precision of the run (the platform's 'default' is TF32 on NVIDIA GPUs, bf16 passes on TPUs)",
  )  # fmt: skip
  t = sub.add_parser("timm", help="convert a timm ViT/DeiT checkpoint into an orbax params checkpoint")
  t.add_argument("checkpoint", help="a .pth/.pt/.bin (needs torch), .safetensors or .npz state_dict")
  t.add_argument("out_dir", help="new directory for the orbax checkpoint (step 0) and vit_model.json")
  t.add_argument("--model", required=True, help="timm model name, e.g. deit_small_patch16_224")
  args = parser.parse_args(argv)
  if args.command == "timm":
    return _timm(args)
  if not args.tolerance > 0:  # also rejects NaN
    parser.error(f"--tolerance must be > 0, got {args.tolerance}")
  ok, bad_input = True, False
  for path in args.cases:
    try:
      ok &= verify(path, args.tolerance, frontend=args.frontend, precision=args.precision)
    except INPUT_ERRORS as err:
      _report(path, err)
      bad_input = True
  if not ok or not bad_input:  # a bad input has said its one line already
    print("all outputs within tolerance" if ok else "FAILED", file=sys.stderr)
  return EXIT_BAD_INPUT if bad_input else (0 if ok else EXIT_FAILED)
