"""pytest plugin: accuracy gates of ``mamba_mimo_bwd_fwd`` implementations in any project's test suite.

Registered through the ``pytest11`` entry point of the package (or load it with ``-p mimo_numerics.pytest_plugin``).
A test that asks for ``mimo_case`` is parametrized over a grid of cases, with the case id as test id::

    import functools
    from my_project import my_kernel

    def test_my_kernel(mimo_gate, mimo_policy):
        mimo_gate(functools.partial(my_kernel, policy=mimo_policy))

Fixtures:
    mimo_case: one ``CaseSpec`` of the grid (the test is parametrized over the grid).
    mimo_policy: the ``RoundingPolicy`` to gate against.
    mimo_device: the device string ``fn`` runs on.
    mimo_gate: ``mimo_gate(fn, **options)`` gates ``fn`` on ``mimo_case`` under ``mimo_policy`` on ``mimo_device``
        (``mimo_numerics.testing.assert_mamba_mimo_bwd_fwd``; options as for it) and returns the report; it skips
        the test when the gate skips the case (a case dtype other than the policy's ``lp_dtype``).

Selection, first match wins:
    grid: ``--mimo-grid NAME`` > the test's ``@pytest.mark.mimo_grid(NAME | CaseSpec | [CaseSpec, ...])`` >
        ini ``mimo_grid`` > ``"gate"``.
    policy: ``--mimo-policy NAME|FILE.json`` > ``@pytest.mark.mimo_policy(NAME | RoundingPolicy | FILE.json)`` >
        ini ``mimo_policy`` > ``"upstream_sm90"``.
    device: ``--mimo-device DEV`` > ini ``mimo_device`` > ``"cpu"``; checked at start-up (a usage error, not a
        failure per test, when it cannot be used here: no CUDA, no ``torch_npu``, an unknown device).
"""

from __future__ import annotations

import math
from typing import List, Tuple

import pytest

from . import presets as _presets
from . import testing as _testing
from .cases import grid_names

DEFAULT_GRID = "gate"
DEFAULT_POLICY = "upstream_sm90"
DEFAULT_DEVICE = "cpu"

_REPORTS_KEY = pytest.StashKey[List[Tuple[str, "_testing.GateReport"]]]()


def pytest_addoption(parser):
    group = parser.getgroup("mimo_numerics", "mamba_mimo_bwd_fwd accuracy gates (mimo_numerics)")
    group.addoption("--mimo-policy", action="store", default=None, metavar="NAME|FILE.json",
                    help=f"rounding policy to gate against: a preset ({', '.join(_presets.names())}) or a policy "
                         f"JSON file; overrides mimo_policy markers (default: {DEFAULT_POLICY})")
    group.addoption("--mimo-grid", action="store", default=None, metavar="NAME",
                    help=f"grid of cases for tests using mimo_case: {', '.join(grid_names())}; overrides mimo_grid "
                         f"markers (default: {DEFAULT_GRID})")
    group.addoption("--mimo-device", action="store", default=None, metavar="DEVICE",
                    help=f"device the gated function runs on, e.g. cpu, cuda, npu (default: {DEFAULT_DEVICE})")
    parser.addini("mimo_policy", "default rounding policy of the mimo_numerics gates", default=None)
    parser.addini("mimo_grid", "default grid of the mimo_numerics gates", default=None)
    parser.addini("mimo_device", "default device of the mimo_numerics gates", default=None)


def pytest_configure(config):
    config.addinivalue_line("markers", "mimo_grid(cases): grid name, CaseSpec or list of CaseSpec that mimo_case "
                                       "is parametrized over (--mimo-grid overrides it)")
    config.addinivalue_line("markers", "mimo_policy(policy): rounding policy (preset name, RoundingPolicy or JSON "
                                       "path) of the mimo_policy fixture (--mimo-policy overrides it)")
    config.stash[_REPORTS_KEY] = []
    # fail at start-up, not per test, on a bad --mimo-grid / --mimo-policy
    name = config.getoption("--mimo-grid")
    if name is not None and name not in grid_names():
        raise pytest.UsageError(f"--mimo-grid {name!r}: unknown grid; valid grids are {list(grid_names())}")
    policy = config.getoption("--mimo-policy")
    if policy is not None:
        try:
            _presets.resolve(policy)
        except (ValueError, TypeError, OSError, NotImplementedError) as exc:
            raise pytest.UsageError(f"--mimo-policy {policy!r}: {exc}") from None
    _check_device_option(config)


def _check_device_option(config) -> None:
    """A usage error at start-up when the gate device cannot be used here (no CUDA, no torch_npu, a typo)."""
    option = config.getoption("--mimo-device")
    where = "--mimo-device" if option is not None else "ini mimo_device"
    device = option if option is not None else _ini(config, "mimo_device")
    if device is None:
        return
    try:
        _testing.check_device(device)
    except _testing.DeviceUnavailableError as exc:
        hint = exc.hint.replace("run on cpu", "run with --mimo-device cpu", 1)
        raise pytest.UsageError(f"{where} {device}: {exc.reason} (hint: {hint})") from None


def _ini(config, name):
    value = config.getini(name)
    return value or None


def _grid_for(config, node_or_metafunc) -> tuple:
    option = config.getoption("--mimo-grid")
    if option is not None:
        return _testing.resolve_cases(option)
    marker = node_or_metafunc.definition.get_closest_marker("mimo_grid") \
        if hasattr(node_or_metafunc, "definition") else node_or_metafunc.get_closest_marker("mimo_grid")
    if marker is not None:
        if len(marker.args) != 1 or marker.kwargs:
            raise pytest.UsageError("mimo_grid marker takes one argument: a grid name, a CaseSpec or a list of them")
        return _testing.resolve_cases(marker.args[0])
    return _testing.resolve_cases(_ini(config, "mimo_grid") or DEFAULT_GRID)


def _policy_for(request):
    option = request.config.getoption("--mimo-policy")
    if option is not None:
        return _presets.resolve(option)
    marker = request.node.get_closest_marker("mimo_policy")
    if marker is not None:
        if len(marker.args) != 1 or marker.kwargs:
            raise pytest.UsageError("mimo_policy marker takes one argument: a preset name, a RoundingPolicy or a "
                                    "policy JSON path")
        return _presets.resolve(marker.args[0])
    return _presets.resolve(_ini(request.config, "mimo_policy") or DEFAULT_POLICY)


def pytest_generate_tests(metafunc):
    if "mimo_case" in metafunc.fixturenames:
        cases = _grid_for(metafunc.config, metafunc)
        metafunc.parametrize("mimo_case", cases, ids=[c.case_id for c in cases], indirect=True)


def pytest_report_header(config):
    policy = config.getoption("--mimo-policy") or _ini(config, "mimo_policy")
    grid = config.getoption("--mimo-grid") or _ini(config, "mimo_grid")
    device = config.getoption("--mimo-device") or _ini(config, "mimo_device") or DEFAULT_DEVICE
    return (f"mimo_numerics gates: policy={policy or f'{DEFAULT_POLICY} (or marker)'}, "
            f"grid={grid or f'{DEFAULT_GRID} (or marker)'}, device={device}")


@pytest.fixture
def mimo_case(request):
    """One ``CaseSpec`` of the selected grid (tests using it are parametrized over the grid; ids are case ids)."""
    return request.param


@pytest.fixture
def mimo_policy(request):
    """The ``RoundingPolicy`` to gate against (``--mimo-policy`` > ``mimo_policy`` marker > ini > upstream_sm90)."""
    return _policy_for(request)


@pytest.fixture
def mimo_device(request):
    """The device the gated function runs on (``--mimo-device`` > ini ``mimo_device`` > ``"cpu"``)."""
    return request.config.getoption("--mimo-device") or _ini(request.config, "mimo_device") or DEFAULT_DEVICE


@pytest.fixture
def mimo_gate(request, mimo_case, mimo_policy, mimo_device):
    """``mimo_gate(fn, **options)``: gate ``fn`` on this test's case under ``mimo_policy``; returns the report.

    Fails the test with the report's table (``report.failure_message()``, no traceback) when a gate fails; skips
    the test when the gate skips the case. ``options`` go to ``mimo_numerics.testing.check_mamba_mimo_bwd_fwd``
    (``alpha``, ``floor``, ``tol_same``, ``noise_factor``, ``pass_policy``, ``dtype_mismatch``; ``policy``/``device``
    override the fixtures).
    """

    def gate(fn, **options):
        options.setdefault("policy", mimo_policy)
        options.setdefault("device", mimo_device)
        report = _testing.check_mamba_mimo_bwd_fwd(fn, cases=[mimo_case], **options)
        request.config.stash[_REPORTS_KEY].append((request.node.nodeid, report))
        if not report.checked and not report.failed_cases:
            pytest.skip(report.cases[0].skipped or "the gate ran no case")
        if not report.passed:  # the table alone: no frames of the plugin, no reprs of the fixtures
            pytest.fail(report.failure_message(), pytrace=False)
        return report

    return gate


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    reports = config.stash.get(_REPORTS_KEY, [])
    if not reports:
        return
    run = [r for _, r in reports if r.checked]
    failed = [r for r in run if not r.passed]
    tr = terminalreporter
    tr.section("mimo_numerics gates")
    tr.write_line(f"{len(run)} case gate(s) run, {len(failed)} failed, {len(reports) - len(run)} skipped")
    worst = {}
    for report in run:
        for key, (value, case_id, output) in report.worst().items():
            if case_id and (key not in worst or value > worst[key][0]):
                worst[key] = (value, case_id, output, report)
    if "same_use" in worst:
        value, case_id, output, report = worst["same_use"]
        shown = "inf" if math.isinf(value) else f"{100 * value:.0f}%"
        tr.write_line(f"largest same-policy use: {shown} of its tolerance ({case_id}, {output}, policy "
                      f"{_testing.policy_label(report.policy)})")
    if "oracle_ratio" in worst:
        value, case_id, output, report = worst["oracle_ratio"]
        tr.write_line(f"largest error vs fp64 relative to the policy's own: {value:.4f} (limit about "
                      f"{report.settings.alpha:g}; {case_id}, {output})")
