"""Packaging: the top-level kernels/ folder imports as mimo_numerics.kernels; the reference never imports triton."""

import subprocess
import sys
from pathlib import Path

import mimo_numerics

ROOT = Path(__file__).resolve().parents[1]


def test_layout_kernels_folder_is_installed_as_mimo_numerics_kernels():
    import mimo_numerics.kernels as kernels

    assert Path(kernels.__file__).resolve().parent == (ROOT / "kernels").resolve()
    assert Path(mimo_numerics.__file__).resolve().parent == (ROOT / "mimo_numerics").resolve()


def test_layout_no_top_level_kernels_package_is_installed():
    code = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('kernels') is None else 1)"
    assert subprocess.run([sys.executable, "-c", code], cwd="/").returncode == 0


def test_layout_reference_oracle_and_policy_do_not_import_triton():
    code = ("import sys; import mimo_numerics as mn; import mimo_numerics.reference, mimo_numerics.oracle, "
            "mimo_numerics.cases, mimo_numerics.metrics; sys.exit(1 if 'triton' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code], cwd="/").returncode == 0


# ---------------------------------------------------------------------------------------------------------------
# Operator architecture (issue 16, acceptance 3 and 4): generic modules name no operator; operators are folders.

import ast  # noqa: E402
import importlib  # noqa: E402
import tomllib  # noqa: E402

import pytest  # noqa: E402

from mimo_numerics.ops import registry  # noqa: E402

PACKAGE = ROOT / "mimo_numerics"
OPS = PACKAGE / "ops"

#: The generic modules: each takes the operator as a parameter and names none.
GENERIC_MODULES = (
    "bundle_manifest", "bundles", "drift", "envinfo", "exact_random", "inference", "metrics", "nonfinite",
    "operator", "plots", "policy", "presets", "pytest_plugin", "report", "rounding", "sensitivity", "sweep",
    "testing", "tolerances", "cases", "golden_data", "provenance", "benchmark_cases",
)
#: Top-level modules allowed to name operators, with the reason.
NAMING_ALLOWED = {
    "__init__": "the package's public re-exports (mn.mamba_mimo_fwd, ...)",
    "__main__": "python -m mimo_numerics",
    "cli": "CLI defaults and the whole op's commands",
    "validation": "stage 1's validate_inputs at its public path, and the Dims / argument checks every operator uses",
}
#: The one table whose entries are keyed by operator name (``tolerances.TOLERANCES``): its keys and measurement
#: texts may name operators, the module's code may not.
TABLE_NAMES = {"tolerances": "TOLERANCES"}


def _operator_words():
    words = {p.name for p in OPS.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    words |= set(registry.OPERATORS)
    # the short names the op folders use for the two backward kernels
    words |= {"bwd_fwd", "bwd_bwd"}
    return sorted(words)


def _is_alias_shim(tree: ast.Module) -> bool:
    """A module whose body is only ``sys.modules[__name__] = <a module of an operator folder>``."""
    body = [n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    imports = [n for n in body if isinstance(n, (ast.Import, ast.ImportFrom))]
    rest = [n for n in body if n not in imports]
    from_ops = [n for n in imports if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("ops.")]
    return (len(from_ops) == 1 and len(rest) == 1 and isinstance(rest[0], ast.Assign)
            and "sys.modules" in ast.unparse(rest[0].targets[0]))


def _docstring_nodes(tree: ast.AST) -> set:
    """ids of docstring constants: module/class/function docstrings and the strings after an assignment."""
    ids = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        for index, statement in enumerate(body):
            if not (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)
                    and isinstance(statement.value.value, str)):
                continue
            first = index == 0 and isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            after_assignment = index > 0 and isinstance(body[index - 1], (ast.Assign, ast.AnnAssign))
            if first or after_assignment:
                ids.add(id(statement.value))
    return ids


def _table_nodes(tree: ast.AST, table: str) -> set:
    """ids of every node inside the dict literals assigned to ``table`` or passed to ``table.update``."""
    roots = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == table for t in targets) and isinstance(node.value, ast.Dict):
                roots.append(node.value)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update"
                and isinstance(node.func.value, ast.Name) and node.func.value.id == table):
            roots += [a for a in node.args if isinstance(a, ast.Dict)]
    return {id(n) for root in roots for n in ast.walk(root)}


def _names_in_code(path: Path, table: str = None):
    """``(line, text)`` of every identifier, import path and non-docstring string constant of ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    skip = _docstring_nodes(tree) | (_table_nodes(tree, table) if table else set())
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value
        elif isinstance(node, ast.Name):
            yield node.lineno, node.id
        elif isinstance(node, ast.Attribute):
            yield node.lineno, node.attr
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node.lineno, node.name
        elif isinstance(node, ast.arg):
            yield node.lineno, node.arg
        elif isinstance(node, ast.ImportFrom):
            yield node.lineno, node.module or ""
        elif isinstance(node, ast.alias):
            yield getattr(node, "lineno", 0), node.name


def _top_level_modules():
    return sorted(p.stem for p in PACKAGE.glob("*.py"))


def test_layout_every_top_level_module_is_classified():
    """A new top-level module is either generic (listed above and checked), allowed to name operators (with a
    reason), or an alias of a module of an operator folder."""
    unclassified = []
    for name in _top_level_modules():
        tree = ast.parse((PACKAGE / f"{name}.py").read_text())
        if name not in GENERIC_MODULES and name not in NAMING_ALLOWED and not _is_alias_shim(tree):
            unclassified.append(name)
    assert not unclassified, (f"top-level modules {unclassified}: add them to GENERIC_MODULES (they take the "
                              f"operator as a parameter) or move them into an operator folder")
    missing = [name for name in GENERIC_MODULES if not (PACKAGE / f"{name}.py").exists()]
    assert not missing, f"GENERIC_MODULES lists modules that do not exist: {missing}"


@pytest.mark.parametrize("module", GENERIC_MODULES)
def test_layout_generic_module_names_no_operator(module):
    words = _operator_words()
    hits = [f"{module}.py:{line}: {text[:80]!r}"
            for line, text in _names_in_code(PACKAGE / f"{module}.py", TABLE_NAMES.get(module))
            if any(word in text.lower() for word in words)]
    assert not hits, ("generic modules take the operator as a parameter (mimo_numerics.operator.get(op)); these "
                      "lines name one:\n" + "\n".join(hits))


def test_layout_the_name_check_catches_a_per_operator_branch(tmp_path):
    """The check above sees an operator name in code (an ``if op == ...`` branch, an import from an operator
    folder), not in docstrings or in the tolerance table's entries."""
    source = tmp_path / "candidate.py"
    source.write_text(
        '"""Docstrings may say mamba_mimo_fwd."""\n'
        'TOLERANCES = {"mamba_mimo_fwd.same_policy_rel_rms": 1}\n'
        'def run(op):\n'
        '    """So may this one: mamba_mimo_bwd_bwd."""\n'
        '    if op == "mamba_mimo_fwd":\n'
        '        from .ops.mamba_mimo_bwd_fwd import reference\n'
        '    return op\n')
    hits = sorted((line, text) for line, text in _names_in_code(source, "TOLERANCES")
                  if any(word in text.lower() for word in _operator_words()))
    assert hits == [(5, "mamba_mimo_fwd"), (6, "ops.mamba_mimo_bwd_fwd")]


def test_layout_alias_shims_point_into_registered_operator_folders():
    for name in _top_level_modules():
        path = PACKAGE / f"{name}.py"
        tree = ast.parse(path.read_text())
        if not _is_alias_shim(tree):
            continue
        statement = next(n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module.startswith("ops."))
        source = f"{statement.module}.{statement.names[0].name}"
        folder = source.split(".")[1]
        assert folder in registry.OPERATORS, f"{path.name} aliases a module of ops/{folder}, not a registered operator"
        module = importlib.import_module(f"mimo_numerics.{name}")
        assert module.__name__ == f"mimo_numerics.{source}", f"mimo_numerics.{name} is not the module it aliases"


def test_layout_every_operator_folder_is_a_package_of_pyproject():
    packages = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {f"mimo_numerics.ops.{p.name}" for p in OPS.iterdir() if (p / "__init__.py").exists()}
    assert folders - packages == set(), f"operator folders missing from pyproject.toml packages: {folders - packages}"


@pytest.mark.parametrize("name", registry.OPERATORS)
def test_layout_registered_operator_has_its_folder_and_every_part(name):
    folder = OPS / name
    for part in ("sites", "spec", "oracle", "golden"):
        assert (folder / f"{part}.py").exists(), f"ops/{name}/{part}.py is missing"
    op = registry.get(name)
    assert op.name == name
    assert set(registry.site_table(name)), f"ops/{name}/sites.py defines no site"
    for field in ("reference", "oracle", "make_inputs", "grids", "validate", "outputs_type", "golden",
                  "golden_outputs"):
        path = getattr(op, field)
        assert path, f"{name}: spec field {field} is empty"
        module, attribute = path.split(":")
        assert callable(getattr(importlib.import_module(module), attribute)), f"{name}.{field}: {path}"
    # the operator's own parts live in its folder (stage 1's validation and the case model it shares with the
    # other kernels keep their public top-level paths: NAMING_ALLOWED, GENERIC_MODULES)
    own = ("reference", "oracle", "golden", "golden_outputs", "outputs_type")
    for field in own:
        assert getattr(op, field).startswith(f"mimo_numerics.ops.{name}."), f"{name}.{field} is outside ops/{name}"
