"""Every report in ``reports/`` names the commit it was made at (issue 44): a ``commit `abc1234``` stamp, as
``provenance.markdown_header`` writes it or as a hand-written note gives it. A report whose run recorded none is
listed in :data:`OWED` with the run that would stamp it; the test fails for any other, and for an entry of
:data:`OWED` that has since been stamped (so the list cannot go stale)."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAMP = re.compile(r"commit\W{0,3}`?[0-9a-f]{7,40}", re.IGNORECASE)
#: Reports made before their generator recorded a commit, with what would rerun them.
OWED: dict = {}  # gpu_nonfinite_upstream.md, the last entry, was rerun at a93de5d on an H100 (2026-12-07)


def _reports():
    listed = subprocess.run(["git", "ls-files", "reports"], cwd=ROOT, capture_output=True, text=True)
    if listed.returncode == 0 and listed.stdout.strip():
        return sorted(p for p in listed.stdout.split() if p.endswith(".md"))
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "reports").rglob("*.md"))


def test_every_report_names_its_commit():
    unstamped = {p for p in _reports() if not STAMP.search((ROOT / p).read_text(encoding="utf-8"))}
    assert unstamped <= set(OWED), sorted(unstamped - set(OWED))
    stale = set(OWED) - unstamped
    assert not stale, f"stamped now, remove from OWED: {sorted(stale)}"
