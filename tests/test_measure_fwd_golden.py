"""``scripts/measure_fwd_golden.py``'s "upstream states" column runs on the forward reference as it is now (it
substitutes upstream's stage-1 STATES for the reference's state recurrence; the recurrence gained ``final=`` with
``return_state`` and the substitute had to follow), and restores the recurrence afterwards."""

import importlib.util
import sys
from pathlib import Path

from mimo_numerics import tolerances
from mimo_numerics.metrics import rel_rms
from mimo_numerics.ops.mamba_mimo_fwd import reference as fwd_reference

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "measure_fwd_golden.py"


def _script():
    spec = importlib.util.spec_from_file_location("measure_fwd_golden", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def test_upstream_states_column_runs_and_restores_the_recurrence():
    script = _script()
    original = fwd_reference.state_recurrence
    golden = script.load_golden()
    name = sorted(golden)[0]
    o = script._with_upstream_states(golden[name])
    assert fwd_reference.state_recurrence is original
    # upstream's own states: the output is at least as near upstream's as the stand-in's own (its golden gate)
    assert rel_rms(o, golden[name]["fwd"]["o"]) <= tolerances.get("fwd_golden_upstream_sm90_rel_rms")
