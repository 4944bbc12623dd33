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
import importlib.util  # noqa: E402
import tomllib  # noqa: E402

import pytest  # noqa: E402

from mimo_numerics.ops import registry  # noqa: E402

PACKAGE = ROOT / "mimo_numerics"
OPS = PACKAGE / "ops"

#: The generic modules: each takes the operator as a parameter and names none.
GENERIC_MODULES = (
    "bundle_manifest", "bundles", "drift", "envinfo", "exact_random", "inference", "metrics", "nonfinite",
    "operator", "plots", "policy", "presets", "pytest_plugin", "report", "rounding", "sensitivity", "sweep",
    "testing", "tolerances", "golden_data", "golden_samples", "provenance", "benchmark_cases", "gate_cases",
    "gate_checks", "gate_devices", "gate_nearest", "gate_noise", "gate_report", "gate_settings", "tensor_core", "mufu",
)
#: Top-level modules allowed to name operators, with the reason.
NAMING_ALLOWED = {
    "__init__": "the package's public re-exports (mn.mamba_mimo_fwd, ...)",
    "__main__": "python -m mimo_numerics",
    "cli": "CLI defaults and the whole op's commands",
    "validation": "the Dims / argument checks every operator uses; stage 1's validate_inputs at its public path "
                  "(loaded on first use from ops/mamba_mimo_bwd_fwd/validation.py)",
    "cases": "the case model the kernels share (CaseSpec, StoredCase, the draws); stage 1's make_inputs and grids at "
             "their public path (loaded on first use from ops/mamba_mimo_bwd_fwd/cases.py)",
}
#: The one table whose entries are keyed by operator name (``tolerances.TOLERANCES``): its keys and measurement
#: texts may name operators, the module's code may not.
TABLE_NAMES = {"tolerances": "TOLERANCES"}


def _operator_words():
    words = {p.name for p in OPS.iterdir()
             if p.is_dir() and (p / "__init__.py").exists() and not p.name.startswith("_")}  # _common: no operator
    words |= set(registry.OPERATORS)
    # the short names the op folders use for the two backward kernels
    words |= {"bwd_fwd", "bwd_bwd"}
    return sorted(words)


def _is_alias_shim(tree: ast.Module) -> bool:
    """A module that only stands for a module of an operator folder: its body is ``from .ops.<op>.<m> import ...``
    and ``__all__ = [...]`` (a re-export), or ``sys.modules[__name__] = <that module>`` (an alias by identity, for a
    module whose run-time settings users set)."""
    body = [n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    imports = [n for n in body if isinstance(n, (ast.Import, ast.ImportFrom))]
    rest = [n for n in body if n not in imports]
    from_ops = [n for n in imports if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("ops.")]
    if len(from_ops) != 1 or len(rest) != 1 or not isinstance(rest[0], ast.Assign):
        return False
    target = ast.unparse(rest[0].targets[0])
    return "sys.modules" in target or (target == "__all__" and len(imports) == 1)


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


def _defined_names(path: Path) -> set:
    """Names a module defines at its top level (functions, classes, assignments)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def test_layout_alias_shims_point_into_registered_operator_folders():
    for name in _top_level_modules():
        path = PACKAGE / f"{name}.py"
        tree = ast.parse(path.read_text())
        if not _is_alias_shim(tree):
            continue
        statement = next(n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module.startswith("ops."))
        identity = statement.module.count(".") == 1  # from .ops.<op> import <module> as _module
        source = f"{statement.module}.{statement.names[0].name}" if identity else statement.module
        folder = source.split(".")[1]
        assert folder in registry.OPERATORS, f"{path.name} aliases a module of ops/{folder}, not a registered operator"
        module = importlib.import_module(f"mimo_numerics.{name}")
        target = importlib.import_module(f"mimo_numerics.{source}")
        if identity:
            assert module is target, f"mimo_numerics.{name} is not the module it aliases"
        else:
            public = sorted(n for n in _defined_names(Path(target.__file__)) if not n.startswith("_"))
            assert sorted(set(public) - set(module.__all__)) == [], f"mimo_numerics.{name} lacks public names"
            assert all(getattr(module, n) is getattr(target, n) for n in module.__all__)


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
    # the operator's own parts live in its folder (the case model the kernels share is mimo_numerics.cases)
    own = ("reference", "oracle", "golden", "golden_outputs", "outputs_type", "validate", "make_inputs", "grids")
    for field in own:
        assert getattr(op, field).startswith(f"mimo_numerics.ops.{name}."), f"{name}.{field} is outside ops/{name}"


# ---------------------------------------------------------------------------------------------------------------
# Imports (issue 21): nothing inside the package, the scripts or the tests goes through a top-level alias of an
# operator module, and no module takes another module's private name.

#: Top-level modules that only stand for a module of an operator folder (the public stage-1 API), and the stage-1
#: names the two generic modules keep at their old public path (``cases.make_inputs``, ``validation.validate_inputs``).
ALIAS_MODULES = ("reference", "reference_cpu", "oracle", "outputs", "upstream", "golden")
ALIAS_NAMES = {"cases": "_STAGE1_NAMES", "validation": "_STAGE1_NAMES"}
#: Test files that test the aliases themselves (they may import them).
ALIAS_TESTS = ("test_layout.py", "test_public_aliases.py")
#: Alias imports outside the tests, with the reason: (file, module imported).
ALIAS_ALLOWED = {
    ("benchmarks/bench_reference.py", "mimo_numerics.reference"):
        "the --baseline worker times another commit's package: the old public paths are the ones every commit has",
    ("benchmarks/bench_reference.py", "mimo_numerics.cases"):
        "as above (make_inputs, as_args, as_kwargs at their old public path)",
}
#: The only private names that may cross modules, with the reason.
PRIVATE_ALLOWED = {
    ("scripts/measure_gate_tolerances.py", "_as_output_dict"):
        "testing.py is being split by concern (issue 21 item 8); the split makes it public",
}
SCANNED = [PACKAGE, ROOT / "kernels", ROOT / "scripts", ROOT / "benchmarks", ROOT / "golden", ROOT / "tests",
           ROOT / "examples"]


def _alias_names(module: str) -> tuple:
    return tuple(getattr(importlib.import_module(f"mimo_numerics.{module}"), ALIAS_NAMES[module]))


def _python_files():
    for folder in SCANNED:
        if folder.is_dir():
            yield from sorted(p for p in folder.rglob("*.py") if ".venv" not in p.parts)


def _module_of(path: Path):
    """``mimo_numerics.x.y`` for a file of the package (kernels/ is installed as mimo_numerics.kernels), else None."""
    for folder, name in ((PACKAGE, "mimo_numerics"), (ROOT / "kernels", "mimo_numerics.kernels")):
        if folder in path.parents or path.parent == folder:
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            return ".".join([name] + parts)
    return None


def _absolute(node: ast.ImportFrom, path: Path) -> str:
    """The absolute module of a ``from ... import`` (relative ones resolved against the file's package)."""
    if not node.level:
        return node.module or ""
    here = _module_of(path)
    if here is None:
        return node.module or ""
    package = here.split(".") if path.name == "__init__.py" else here.split(".")[:-1]
    base = package[:len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _project_module(name: str) -> bool:
    return name == "mimo_numerics" or name.startswith("mimo_numerics.")


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _imports(path: Path):
    """``(line, module, name)`` for every project import of ``path``: ``import m`` gives ``(line, m, None)``, ``from m
    import x`` gives ``(line, m.x, None)`` when ``m.x`` is a module, else ``(line, m, x)``; plus ``(line, m, attr)``
    for an attribute read ``alias.attr`` of a module bound by an import (``from mimo_numerics import cases`` then
    ``cases.make_inputs``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _project_module(alias.name):
                    yield node.lineno, alias.name, None
                    if alias.asname:
                        bound[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(node, path)
            if not _project_module(module):
                continue
            for alias in node.names:
                full = f"{module}.{alias.name}"
                if _is_module(full):
                    yield node.lineno, full, None
                    bound[alias.asname or alias.name] = full
                else:
                    yield node.lineno, module, alias.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound:
            yield node.lineno, bound[node.value.id], node.attr
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
              and isinstance(node.value.value, ast.Name) and node.value.value.id in ("mn", "mimo_numerics")
              and node.value.attr in ALIAS_NAMES):
            yield node.lineno, f"mimo_numerics.{node.value.attr}", node.attr  # mn.cases.make_inputs


def _alias_hits(path: Path):
    for line, module, name in _imports(path):
        if (str(path.relative_to(ROOT)), module) in ALIAS_ALLOWED:
            continue
        short = module[len("mimo_numerics."):] if module.startswith("mimo_numerics.") else None
        if short in ALIAS_MODULES:
            yield f"{path.relative_to(ROOT)}:{line}: {module}" + (f".{name}" if name else "")
        elif short in ALIAS_NAMES and name in _alias_names(short):
            yield f"{path.relative_to(ROOT)}:{line}: {module}.{name}"
        elif module == "mimo_numerics" and name in ALIAS_MODULES:  # mn.reference
            yield f"{path.relative_to(ROOT)}:{line}: mimo_numerics.{name}"


def test_layout_nothing_imports_an_alias_module_internally():
    """The package, the scripts and the tests import stage 1's modules from ``ops/mamba_mimo_bwd_fwd/``; the
    top-level aliases are for users (tests of the aliases themselves excepted)."""
    hits = [hit for path in _python_files() if path.name not in ALIAS_TESTS and path.parent.name != "mimo_numerics"
            or (path.parent == PACKAGE and path.stem not in ALIAS_MODULES + ("__init__",))
            for hit in _alias_hits(path)]
    assert not hits, "import these from the operator module (ops/mamba_mimo_bwd_fwd/...):\n" + "\n".join(hits)


def _private_hits(path: Path):
    here = _module_of(path)
    for line, module, name in _imports(path):
        if name is None or not name.startswith("_") or name.startswith("__"):
            continue
        if module == here or _is_module(f"{module}.{name}"):  # its own name, or a private submodule of a package
            continue
        if (str(path.relative_to(ROOT)), name) in PRIVATE_ALLOWED:
            continue
        yield f"{path.relative_to(ROOT)}:{line}: {module}.{name}"


def test_layout_no_module_takes_another_modules_private_name():
    """``from m import _x`` and ``m._x`` across modules of the package and the scripts: a name another module needs
    is public in its home. Tests are white-box and may read privates."""
    hits = [hit for path in _python_files() if "tests" not in path.relative_to(ROOT).parts[:1]
            and "examples" not in path.relative_to(ROOT).parts[:1] for hit in _private_hits(path)]
    assert not hits, "make these names public where they live:\n" + "\n".join(hits)


def test_layout_the_import_checks_catch_aliases_and_privates(tmp_path):
    """Both checks see what they must: an alias import, a stage-1 name of ``cases``, ``m._x``, ``from m import _x``."""
    source = tmp_path / "candidate.py"
    source.write_text(
        "import mimo_numerics as mn\n"
        "from mimo_numerics import reference\n"
        "from mimo_numerics.cases import CaseSpec, make_inputs\n"
        "from mimo_numerics.validation import check_int, _STAGE1_NAMES\n"
        "from mimo_numerics import report\n"
        "x = report._hidden\n"
        "y = mn.oracle.mamba_mimo_bwd_fwd_oracle\n")
    aliases = sorted(hit.split(": ", 1)[1] for hit in _alias_hits_of(source))
    assert aliases == ["mimo_numerics.cases.make_inputs", "mimo_numerics.oracle", "mimo_numerics.reference"]
    privates = sorted(hit.split(": ", 1)[1] for hit in _private_hits_of(source))
    assert privates == ["mimo_numerics.report._hidden", "mimo_numerics.validation._STAGE1_NAMES"]


def _relative_to_root(function, source: Path):
    global ROOT
    saved, ROOT = ROOT, source.parent
    try:
        return list(function(source))
    finally:
        ROOT = saved


def _alias_hits_of(source: Path):
    return _relative_to_root(_alias_hits, source)


def _private_hits_of(source: Path):
    return _relative_to_root(_private_hits, source)


def test_layout_references_share_common_and_oracles_stay_independent():
    """The references (the forward's, stage 1's two paths, stage 2's) are built from ``ops/_common``; the FP64
    oracles (and the whole op's FP64 model) import nothing from it nor from any reference, and what the oracles share
    (``ops/_oracle``) no reference imports."""
    references = [OPS / "mamba_mimo_fwd" / "reference.py", OPS / "mamba_mimo_bwd_fwd" / "reference_generic.py",
                  OPS / "mamba_mimo_bwd_fwd" / "reference_cpu.py", OPS / "mamba_mimo_bwd_bwd" / "reference.py"]
    for path in references:
        assert any(module.startswith("mimo_numerics.ops._common") for _, module, _ in _imports(path)), path
    oracles = sorted(OPS.glob("*/oracle.py")) + [OPS / "mamba3_mimo" / "fp64_model.py"]
    for path in oracles:
        bad = [f"{module}.{name}" if name else module for _, module, name in _imports(path)
               if module.startswith("mimo_numerics.ops._common") or "reference" in module.rsplit(".", 1)[-1]
               or (name or "").startswith("reference")]
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}: the oracles share no code with the references"
    # what the oracles share among themselves (ops/_oracle) stays theirs: no reference, no _common module imports it
    shared_by_references = references + [OPS / "mamba_mimo_bwd_fwd" / "reference.py"] + sorted((OPS / "_common").glob("*.py"))
    for path in shared_by_references:
        bad = [module for _, module, _ in _imports(path) if module.startswith("mimo_numerics.ops._oracle")]
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}: ops/_oracle is the oracles' alone"
    assert any(module.startswith("mimo_numerics.ops._oracle") for path in oracles for _, module, _ in _imports(path))


def test_layout_stage1_reference_and_cpu_path_import_no_cycle():
    """reference.py dispatches to reference_generic and reference_cpu; neither imports reference.py back."""
    for part in ("reference_generic", "reference_cpu"):
        path = OPS / "mamba_mimo_bwd_fwd" / f"{part}.py"
        back = [module for _, module, _ in _imports(path) if module == "mimo_numerics.ops.mamba_mimo_bwd_fwd.reference"]
        assert not back, f"{part}.py imports reference.py (an import cycle)"


def test_layout_pyproject_comments_name_modules_that_exist():
    """A comment of pyproject.toml that names a ``mimo_numerics.x`` module names one that imports."""
    import re

    names = set(re.findall(r"#[^\n]*?\b(mimo_numerics(?:\.\w+)+)", (ROOT / "pyproject.toml").read_text()))
    missing = sorted(n for n in names if not _is_module(n))
    assert not missing, f"pyproject.toml comments name modules that do not exist: {missing}"
