"""Every ``reports/bench/...`` path that the README, the docs, the scripts and the kernels cite exists."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CITING = sorted({ROOT / "README.md", ROOT / "reports" / "bench" / "README.md", *ROOT.glob("docs/*.md"),
                 *ROOT.glob("reports/*.md"), *ROOT.glob("scripts/*.py"), *ROOT.glob("scripts/*.sh"),
                 *ROOT.glob("kernels/*.py")})
# a path, possibly ending in a glob (*) or an ellipsis (…) standing for the rest of a file name
_PATH = re.compile(r"reports/bench/[A-Za-z0-9_./*…-]*")


def _cited(path: Path):
    for match in _PATH.finditer(path.read_text(encoding="utf-8")):
        yield match.group(0).rstrip(".").replace("…", "*")


@pytest.mark.parametrize("doc", CITING, ids=lambda p: str(p.relative_to(ROOT)))
def test_cited_bench_paths_exist(doc):
    missing = [cited for cited in _cited(doc)
               if not any(ROOT.glob(cited if "*" in cited else cited + "*"))]
    assert not missing, f"{doc.relative_to(ROOT)} cites {missing}, which reports/bench does not have"


def test_bench_top_level_holds_only_the_current_tables():
    top = sorted(p.name for p in (ROOT / "reports" / "bench").iterdir() if p.is_file())
    kernels = [n for n in top if n.endswith("_kernels.md")]
    assert len(kernels) == 1, f"more than one current kernels table at the top of reports/bench: {kernels}"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"reports/bench/{kernels[0]}" in readme, "README.md does not cite the current kernels table"
