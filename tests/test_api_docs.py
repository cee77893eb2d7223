"""The worked example of docs/api.md's KEP-SVGP section runs as written: a Flax model switched to KEP-SVGP in one
line, trained on CE + KSVD + KL, evaluated with the uncertainty metrics (issue 56 item 6)."""

import math
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _section_block(heading: str) -> str:
  text = (ROOT / "docs" / "api.md").read_text()
  section = text[text.index(heading) :]
  section = section[: section.find("\n## ", 1) if "\n## " in section[1:] else None]
  blocks = re.findall(r"```python\n(.*?)```", section, re.S)
  assert len(blocks) == 1, f"expected one python block under {heading!r}, got {len(blocks)}"
  return blocks[0]


def test_kep_svgp_example_trains_and_reports_metrics(capsys):
  exec(compile(_section_block("## KEP-SVGP"), "docs/api.md", "exec"), {"__name__": "api_example"})
  line = capsys.readouterr().out.strip().splitlines()[-1]
  ce, kl, accuracy, ece, nll = map(
    float, re.fullmatch(r"CE ([\d.]+), KL ([\d.]+); acc ([\d.]+), ece ([\d.]+), nll ([\d.]+)", line).groups()
  )
  assert ce < 0.5 * math.log(3) and math.isfinite(kl) and kl > 0  # log 3: the uniform prediction's cross-entropy
  assert accuracy > 0.8 and 0.0 <= ece < 0.2 and 0.0 < nll < 0.5 * math.log(3)  # chance: about 0.5 (the middle class)
