"""benchmarks/nnx_vs_linen.py runs, and the NNX layers compile to the Linen layers' optimised HLO."""

from __future__ import annotations

from benchmarks import nnx_vs_linen


def test_nnx_compiles_to_the_linen_program(capsys):
  assert nnx_vs_linen.main(["--names=primal,softmax", "--lengths=16", "--batch=2", "--repeats=1", "--calls=1"]) == 0
  rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("| primal", "| softmax"))]
  assert len(rows) == 2
  assert all(row.rstrip().endswith("| yes |") for row in rows), rows


def test_normalised_hlo_keeps_instructions_and_drops_source_tables():
  text = "\n".join(
    ["HloModule jit_a", "ENTRY e {", '  x = f32[] add(a, b), metadata={op_name="x"}, stack_frame_id=3', "}"]
    + ["FileNames", '1 "f.py"']
  )
  other = text.replace("jit_a", "jit_b").replace('"f.py"', '"g.py"').replace('op_name="x"', 'op_name="y"')
  assert nnx_vs_linen.normalised_hlo(text) == nnx_vs_linen.normalised_hlo(other)
  assert "x = f32[] add(a, b)" in nnx_vs_linen.normalised_hlo(text)
  assert nnx_vs_linen.normalised_hlo(text) != nnx_vs_linen.normalised_hlo(text.replace("add", "multiply"))
