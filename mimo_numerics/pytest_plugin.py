"""pytest plugin: accuracy gates of operator implementations in any project's test suite.

Registered through the ``pytest11`` entry point of the package (or load it with ``-p mimo_numerics.pytest_plugin``).
A test that asks for ``mimo_case`` is parametrized over a grid of cases, with the case id as test id::

    import functools
    from my_project import my_kernel, my_forward_kernel

    def test_my_kernel(mimo_gate, mimo_policy):                  # the default operator (backward stage 1)
        mimo_gate(functools.partial(my_kernel, policy=mimo_policy))

    @pytest.mark.mimo_op("<operator>")                           # parametrized over that operator's grid
    def test_my_forward(mimo_gate, mimo_policy):
        mimo_gate(functools.partial(my_forward_kernel, policy=mimo_policy), op="<operator>")

Fixtures:
    mimo_case: one case spec of the grid (the test is parametrized over the grid of its operator).
    mimo_op: the name of the test's operator (``mimo_op`` marker > ``--mimo-op`` > ini > the registry's default).
    mimo_policy: the ``RoundingPolicy`` to gate against.
    mimo_device: the device string ``fn`` runs on.
    mimo_gate: ``mimo_gate(fn, op=None, **options)`` gates ``fn`` as an implementation of ``op`` (default: the
        ``mimo_op`` fixture) on ``mimo_case`` under ``mimo_policy`` on ``mimo_device``
        (``mimo_numerics.testing.check``; options as for it) and returns the report; it skips the test when the gate
        skips the case (a case dtype other than the policy's ``lp_dtype``) or the policy defines nothing for ``op``.

Selection, first match wins:
    operator: ``mimo_gate(fn, op=...)`` > the test's ``@pytest.mark.mimo_op(NAME)`` > ``--mimo-op NAME`` > ini
        ``mimo_op`` > ``registry.DEFAULT_OPERATOR``. The operator is what ``fn`` *is*, so what the test says wins over
        the command line; the grid ``mimo_case`` runs over is the grid of the marker's (option's, ini's) operator.
    grid: ``--mimo-grid NAME`` > the test's ``@pytest.mark.mimo_grid(NAME | spec | [spec, ...])`` >
        ini ``mimo_grid`` > ``"gate"``. A grid name from the command line or the ini that the test's operator does not
        have skips that test (the reason lists its grids); a marker naming one is a usage error.
    policy: ``--mimo-policy NAME|FILE.json`` > ``@pytest.mark.mimo_policy(NAME | RoundingPolicy | FILE.json)`` >
        ini ``mimo_policy`` > ``"upstream_sm90"``.
    device: ``--mimo-device DEV`` > ini ``mimo_device`` > ``"cpu"``; checked at start-up (a usage error, not a
        failure per test, when it cannot be used here: no CUDA, no ``torch_npu``, an unknown device).
"""

from __future__ import annotations

import math
from typing import List, Optional, Tuple

import pytest

from . import operator as _operator
from . import presets as _presets
from . import testing as _testing
from .ops import registry
from .policy import PolicyUndefined

DEFAULT_GRID = "gate"
DEFAULT_POLICY = "upstream_sm90"
DEFAULT_DEVICE = "cpu"

_REPORTS_KEY = pytest.StashKey[List[Tuple[str, "_testing.GateReport"]]]()


def pytest_addoption(parser):
    group = parser.getgroup("mimo_numerics", "accuracy gates of operator implementations (mimo_numerics)")
    group.addoption("--mimo-op", action="store", default=None, metavar="NAME",
                    help=f"operator gated by tests that do not name one ({', '.join(registry.OPERATORS)}; default: "
                         f"{registry.DEFAULT_OPERATOR}); a test's mimo_op marker or mimo_gate(fn, op=...) wins")
    group.addoption("--mimo-policy", action="store", default=None, metavar="NAME|FILE.json",
                    help=f"rounding policy to gate against: a preset ({', '.join(_presets.names())}) or a policy "
                         f"JSON file; overrides mimo_policy markers (default: {DEFAULT_POLICY})")
    group.addoption("--mimo-grid", action="store", default=None, metavar="NAME",
                    help=f"grid of cases for tests using mimo_case, one of the test's operator's grids (smoke, "
                         f"gate, sweep, ...); overrides mimo_grid markers (default: {DEFAULT_GRID})")
    group.addoption("--mimo-device", action="store", default=None, metavar="DEVICE",
                    help=f"device the gated function runs on, e.g. cpu, cuda, npu (default: {DEFAULT_DEVICE})")
    group.addoption("--mamba-ssm-compat", action="store_true", default=False,
                    help="make `import mamba_ssm...` resolve to mimo_numerics.compat (upstream's API for the "
                         "Mamba-3 MIMO op on the package) for this session, to run a test file written against "
                         "upstream")
    group.addoption("--mamba-ssm-compat-policy", action="store", default=None, metavar="NAME|FILE.json",
                    help="the policy of the compat functions under --mamba-ssm-compat (default: "
                         "mimo_numerics.compat.DEFAULT_POLICY)")
    parser.addini("mimo_op", "default operator of the mimo_numerics gates", default=None)
    parser.addini("mimo_policy", "default rounding policy of the mimo_numerics gates", default=None)
    parser.addini("mimo_grid", "default grid of the mimo_numerics gates", default=None)
    parser.addini("mimo_device", "default device of the mimo_numerics gates", default=None)


def _all_grid_names() -> Tuple[str, ...]:
    """Every grid name of every registered operator, in registry order."""
    names: List[str] = []
    for name in registry.OPERATORS:
        for grid in _operator.get(name).load("grids")():
            if grid not in names:
                names.append(grid)
    return tuple(names)


def pytest_configure(config):
    config.addinivalue_line("markers", "mimo_op(name): the operator the test's function implements; mimo_case is "
                                       "parametrized over its grid and mimo_gate gates it (wins over --mimo-op)")
    config.addinivalue_line("markers", "mimo_grid(cases): grid name, case spec or list of case specs that mimo_case "
                                       "is parametrized over (--mimo-grid overrides it)")
    config.addinivalue_line("markers", "mimo_policy(policy): rounding policy (preset name, RoundingPolicy or JSON "
                                       "path) of the mimo_policy fixture (--mimo-policy overrides it)")
    config.stash[_REPORTS_KEY] = []
    # fail at start-up, not per test, on a bad --mimo-op / --mimo-grid / --mimo-policy / --mimo-device
    for where, value in (("--mimo-op", config.getoption("--mimo-op")), ("ini mimo_op", _ini(config, "mimo_op"))):
        if value is not None and value not in registry.OPERATORS:
            raise pytest.UsageError(f"{where} {value!r}: unknown operator; operators are {list(registry.OPERATORS)}")
    name = config.getoption("--mimo-grid")
    if name is not None and name not in _all_grid_names():
        raise pytest.UsageError(f"--mimo-grid {name!r}: unknown grid; valid grids are {list(_all_grid_names())}")
    policy = config.getoption("--mimo-policy")
    if policy is not None:
        try:
            _presets.resolve(policy)
        except (ValueError, TypeError, OSError, NotImplementedError) as exc:
            raise pytest.UsageError(f"--mimo-policy {policy!r}: {exc}") from None
    _check_device_option(config)
    _install_compat(config)


def _install_compat(config) -> None:
    """``--mamba-ssm-compat``: register ``mimo_numerics.compat`` under the ``mamba_ssm`` names (and its policy)."""
    compat_policy = config.getoption("--mamba-ssm-compat-policy")
    if not config.getoption("--mamba-ssm-compat"):
        if compat_policy is not None:
            raise pytest.UsageError("--mamba-ssm-compat-policy needs --mamba-ssm-compat")
        return
    from . import compat

    if compat_policy is not None:
        try:
            compat.set_default_policy(compat_policy)
        except (ValueError, TypeError, OSError, NotImplementedError) as exc:
            raise pytest.UsageError(f"--mamba-ssm-compat-policy {compat_policy!r}: {exc}") from None
    try:
        compat.install()
    except ImportError as exc:
        raise pytest.UsageError(f"--mamba-ssm-compat: {exc}") from None
    config.add_cleanup(compat.uninstall)
    config.add_cleanup(lambda: compat.set_default_policy(None))


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


def _marker(node_or_metafunc, name: str, what: str):
    """The single argument of the closest ``name`` marker, or None; a usage error for another number."""
    node = getattr(node_or_metafunc, "definition", node_or_metafunc)
    marker = node.get_closest_marker(name)
    if marker is None:
        return None
    if len(marker.args) != 1 or marker.kwargs:
        raise pytest.UsageError(f"{name} marker takes one argument: {what}")
    return marker.args[0]


def _op_for(config, node_or_metafunc) -> str:
    """The test's operator: marker > --mimo-op > ini > the registry's default."""
    marked = _marker(node_or_metafunc, "mimo_op", "an operator name")
    if marked is not None:
        try:
            return _operator.get(marked).name
        except ValueError as exc:
            raise pytest.UsageError(f"mimo_op marker: {exc}") from None
    return config.getoption("--mimo-op") or _ini(config, "mimo_op") or registry.DEFAULT_OPERATOR


def _grid_for(config, metafunc, op: str) -> Tuple[tuple, Optional[str]]:
    """``(cases, skip reason)`` of the test's grid for operator ``op``: a grid name of the command line or the ini
    that ``op`` does not have gives no cases and the reason."""
    option = config.getoption("--mimo-grid")
    marked = _marker(metafunc, "mimo_grid", "a grid name, a case spec or a list of them")
    if option is None and marked is not None:
        try:
            return _testing.resolve_cases(marked, op), None
        except (TypeError, ValueError) as exc:
            raise pytest.UsageError(f"mimo_grid marker of {metafunc.definition.nodeid}: {exc}") from None
    where = "--mimo-grid" if option is not None else "ini mimo_grid"
    name = option or _ini(config, "mimo_grid") or DEFAULT_GRID
    grids = tuple(_operator.get(op).load("grids")())
    if name not in grids:
        return (), f"{where} {name!r} is not a grid of {op} (its grids: {', '.join(grids)})"
    return _testing.resolve_cases(name, op), None


def _policy_for(request):
    option = request.config.getoption("--mimo-policy")
    if option is not None:
        return _presets.resolve(option)
    marked = _marker(request.node, "mimo_policy", "a preset name, a RoundingPolicy or a policy JSON path")
    if marked is not None:
        return _presets.resolve(marked)
    return _presets.resolve(_ini(request.config, "mimo_policy") or DEFAULT_POLICY)


def pytest_generate_tests(metafunc):
    if "mimo_case" in metafunc.fixturenames:
        cases, skip = _grid_for(metafunc.config, metafunc, _op_for(metafunc.config, metafunc))
        if skip is not None:
            metafunc.parametrize("mimo_case", [pytest.param(None, marks=pytest.mark.skip(reason=skip))],
                                 ids=["no-case"], indirect=True)
            return
        metafunc.parametrize("mimo_case", cases, ids=[c.case_id for c in cases], indirect=True)


def pytest_report_header(config):
    op = config.getoption("--mimo-op") or _ini(config, "mimo_op")
    policy = config.getoption("--mimo-policy") or _ini(config, "mimo_policy")
    grid = config.getoption("--mimo-grid") or _ini(config, "mimo_grid")
    device = config.getoption("--mimo-device") or _ini(config, "mimo_device") or DEFAULT_DEVICE
    return (f"mimo_numerics gates: op={op or f'{registry.DEFAULT_OPERATOR} (or marker)'}, "
            f"policy={policy or f'{DEFAULT_POLICY} (or marker)'}, grid={grid or f'{DEFAULT_GRID} (or marker)'}, "
            f"device={device}")


@pytest.fixture
def mimo_case(request):
    """One case spec of the selected grid (tests using it are parametrized over the grid; ids are case ids)."""
    return request.param


@pytest.fixture
def mimo_op(request):
    """The name of the test's operator (``mimo_op`` marker > ``--mimo-op`` > ini ``mimo_op`` > the default)."""
    return _op_for(request.config, request.node)


@pytest.fixture
def mimo_policy(request):
    """The ``RoundingPolicy`` to gate against (``--mimo-policy`` > ``mimo_policy`` marker > ini > upstream_sm90)."""
    return _policy_for(request)


@pytest.fixture
def mimo_device(request):
    """The device the gated function runs on (``--mimo-device`` > ini ``mimo_device`` > ``"cpu"``)."""
    return request.config.getoption("--mimo-device") or _ini(request.config, "mimo_device") or DEFAULT_DEVICE


@pytest.fixture
def mimo_gate(request, mimo_case, mimo_op, mimo_policy, mimo_device):
    """``mimo_gate(fn, op=None, **options)``: gate ``fn`` as an implementation of ``op`` (default: ``mimo_op``) on
    this test's case under ``mimo_policy``; returns the report.

    Fails the test with the report's table (``report.failure_message()``, no traceback) when a gate fails; skips
    the test when the gate skips the case or the policy defines no semantics for ``op``. ``options`` go to
    ``mimo_numerics.testing.check`` (``alpha``, ``floor``, ``tol_same``, ``noise_factor``, ``pass_policy``,
    ``dtype_mismatch``; ``policy``/``device`` override the fixtures).
    """

    def gate(fn, op=None, **options):
        try:
            operator = _operator.get(mimo_op if op is None else op)
        except ValueError as exc:
            pytest.fail(f"mimo_gate(op={op!r}): {exc}", pytrace=False)
        options.setdefault("policy", mimo_policy)
        options.setdefault("device", mimo_device)
        try:
            cases = _testing.resolve_cases([mimo_case], operator)
        except TypeError as exc:
            pytest.fail(f"mimo_case {mimo_case.case_id} is not a case of {operator.name} ({exc}); mark the test "
                        f"@pytest.mark.mimo_op({operator.name!r}) so that it runs over that operator's grid",
                        pytrace=False)
        try:
            report = _testing.check(fn, op=operator, cases=cases, **options)
        except PolicyUndefined as exc:
            pytest.skip(str(exc))
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
    operators = sorted({r.operator for _, r in reports})
    tr.write_line(f"{len(run)} case gate(s) run, {len(failed)} failed, {len(reports) - len(run)} skipped "
                  f"(operator{'s' if len(operators) > 1 else ''} {', '.join(operators)})")
    worst = {}
    for report in run:
        for key, (value, case_id, output) in report.worst().items():
            if case_id and (key not in worst or value > worst[key][0]):
                worst[key] = (value, case_id, output, report)
    if "same_use" in worst:
        value, case_id, output, report = worst["same_use"]
        shown = "inf" if math.isinf(value) else f"{100 * value:.0f}%"
        tr.write_line(f"largest same-policy use: {shown} of its tolerance ({report.operator}, {case_id}, {output}, "
                      f"policy {_testing.policy_label(report.policy, report.operator)})")
    if "oracle_ratio" in worst:
        value, case_id, output, report = worst["oracle_ratio"]
        tr.write_line(f"largest error vs fp64 relative to the policy's own: {value:.4f} (limit about "
                      f"{report.settings.alpha:g}; {report.operator}, {case_id}, {output})")
