"""The house plan holds: imports point down, and the import cycles that once tied the model
to the control plane and the control plane to the engine cannot come back.

Every import in fastpath/ and control/ (installed as fastpath.control) is read with `ast`,
at module level and inside functions, and checked against what each layer may use.
"""
import ast
import os

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..")
COMPILED = {"fastpath._engine", "fastpath._kernels", "fastpath._serve"}      # Cython, not parsed here


def _modules() -> dict:
    """module name -> source path, for every .py under fastpath/, control/ and bench/ (the
    last two install as fastpath.control and fastpath.bench)."""
    out = {}
    for top, pkg in (("fastpath", "fastpath"), ("control", "fastpath.control"),
                     ("bench", "fastpath.bench")):
        base = os.path.join(ROOT, top)
        for d, dirs, files in os.walk(base):
            dirs[:] = [x for x in dirs if x not in ("data", "__pycache__")]
            rel = os.path.relpath(d, base)
            parts = [pkg] + ([] if rel == "." else rel.split(os.sep))
            for f in files:
                if f.endswith(".py"):
                    name = ".".join(parts if f == "__init__.py" else parts + [f[:-3]])
                    out[name] = os.path.join(d, f)
    return out


MODULES = _modules()


def _imports(name: str, path: str) -> list:
    """(target module, function name or None for module level, line) for each import."""
    tree = ast.parse(open(path).read(), path)
    is_pkg = path.endswith("__init__.py")
    out = []

    def visit(node, func):
        for child in ast.iter_child_nodes(node):
            f = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else func
            if isinstance(child, ast.Import):
                out.extend((a.name, func, child.lineno) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                mod = child.module or ""
                if child.level:
                    base = name.split(".") if is_pkg else name.split(".")[:-1]
                    base = base[:len(base) - child.level + 1]
                    mod = ".".join(base + ([mod] if mod else []))
                for a in child.names:
                    sub = f"{mod}.{a.name}"
                    # `from fastpath import lob` imports the module fastpath.lob
                    out.append((sub if sub in MODULES or sub in COMPILED else mod, func,
                                child.lineno))
            visit(child, f)

    visit(tree, None)
    return [(t, f, ln) for t, f, ln in out if t == "fastpath" or t.startswith("fastpath.")]


IMPORTS = {m: _imports(m, p) for m, p in MODULES.items()}

BASE = {"fastpath.errors", "fastpath._checks", "fastpath._ranges"}
# layer -> what its modules may import from fastpath (a prefix ending in "." allows a package)
ALLOWED = {
    "fastpath.errors": set(),
    "fastpath._checks": {"fastpath.errors"},
    "fastpath._ranges": set(),
    "fastpath.model.": BASE | {"fastpath.model", "fastpath.model."},
    "fastpath.lob.": BASE | {"fastpath.lob", "fastpath.lob."},
    "fastpath.control.": BASE | {"fastpath.model", "fastpath.control", "fastpath.control."},
}
# the one upward call a layer makes on purpose: Model.fit_cache_policy delegates to the
# shadow replay in fastpath.tuning (which drives the engine), at call time only
EXCEPTIONS = {("fastpath.model.model", "fastpath.tuning", "fit_cache_policy")}


def _layer(mod: str):
    for k in ALLOWED:
        if mod == k or k.endswith(".") and (mod.startswith(k) or mod == k[:-1]):
            return k
    return None


def _allowed(target: str, allowed: set) -> bool:
    return any(target == a or a.endswith(".") and target.startswith(a) for a in allowed)


@pytest.mark.parametrize("mod", sorted(m for m in MODULES if _layer(m)))
def test_imports_point_down(mod):
    allowed = ALLOWED[_layer(mod)]
    bad = [f"line {ln}: {t}" + (f" (in {f}())" if f else "")
           for t, f, ln in IMPORTS[mod]
           if not _allowed(t, allowed) and (mod, t, f) not in EXCEPTIONS]
    assert not bad, f"{mod} imports above its layer: {bad}"


def test_every_fastpath_import_exists():
    known = set(MODULES) | COMPILED | {"fastpath"}
    stale = [f"{m} line {ln}: {t}" for m, imps in IMPORTS.items() for t, _, ln in imps
             if t not in known]
    assert not stale, f"imports of modules that do not exist: {stale}"


def test_module_level_imports_have_no_cycle():
    graph = {m: {t for t, f, _ in imps if f is None and t in MODULES and t != m}
             for m, imps in IMPORTS.items()}
    # a package's __init__ importing its own submodules is how packages re-export
    for m in graph:
        graph[m] = {t for t in graph[m] if not (MODULES[m].endswith("__init__.py")
                                                and t.startswith(m + "."))}
    state: dict = {}

    def walk(m, path):
        state[m] = 1
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path + [m, t]))
            if t not in state:
                walk(t, path + [m])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            walk(m, [])


def test_the_old_cycles_are_gone():
    def targets(mod):
        return {t for t, _, _ in IMPORTS[mod]}
    for m in MODULES:
        if m.startswith("fastpath.model"):
            assert not {t for t in targets(m) if t.startswith(("fastpath.control", "fastpath._"))
                        and t not in BASE}, m
    assert "fastpath._onnx" not in MODULES
    assert not targets("fastpath.model.onnx_import") & {"fastpath.model", "fastpath.model.types"}
    assert not {t for t in targets("fastpath.control.config") if t in COMPILED}


def test_one_range_parser():
    from fastpath import cli
    from fastpath._ranges import parse_ranges
    from fastpath.control.host import parse_cpulist
    assert parse_ranges("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_ranges(" 5, 1-2 ,") == [5, 1, 2]            # order kept (feature order)
    assert parse_cpulist("8,0-3,2") == [0, 1, 2, 3, 8]       # a set of CPUs
    assert parse_cpulist("0-7:2") == [0, 2, 4, 6]
    assert cli._parse_fields("0-2,7", (), "--z-fields") == [0, 1, 2, 7]
    for bad, why in (("3-1", "ends before it starts"), ("a-3", "start 'a'"),
                     ("1,x", "number 'x'"), ("-1", "start ''"), ("0-4:0", "step 0"),
                     ("4:2", "step without a range")):
        with pytest.raises(ValueError, match=why):
            parse_ranges(bad)
        with pytest.raises(ValueError, match="cpulist"):
            parse_cpulist(bad)
        with pytest.raises(SystemExit, match="--z-fields field list"):
            cli._parse_fields(bad, (), "--z-fields")
    # the control plane and the command line call this one parser, not a copy of their own
    import inspect
    for f in (parse_cpulist, cli._parse_fields):
        src = inspect.getsource(f)
        assert "parse_ranges(" in src and "partition(" not in src and "split(" not in src


def test_public_names_keep_their_paths():
    import fastpath
    from fastpath import lob
    from fastpath.model import CachePolicy, FeatureSpec, Layer, Model
    assert fastpath.Model is Model and fastpath.CachePolicy is CachePolicy
    assert (Layer, FeatureSpec) == (fastpath.Layer, fastpath.FeatureSpec)
    for name in ("generate_stream", "raw_from_book", "read_binance", "read_lobster",
                 "field_names", "future_return_bps", "label_volatility", "BookStream",
                 "RAW_LEN", "WINDOW_FIELDS", "STATE_FIELDS", "LEVELS", "HALF_LIVES", "REGIMES"):
        assert hasattr(lob, name), name
    assert "Raw layout (RAW_LEN = 256 float32)" in lob.__doc__
    from fastpath import tuning
    assert callable(tuning.calibrate) and callable(tuning.fit_cache_policy)
    assert callable(Model.fit_cache_policy) and callable(Model.from_onnx)
