"""The house plan holds: imports point down, with no circles, and the hot path and the model
never reach the control plane or the bench.

Every import in fastpath/, control/ (installed as fastpath.control) and bench/ (fastpath.bench)
is read with `ast`, at module level and inside functions; the compiled modules' import lines
(.pyx and the .pxi files they include) are read with a regex. Nothing is imported to find them.
"""
import ast
import inspect
import os
import re

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
TOPS = (("fastpath", "fastpath"), ("control", "fastpath.control"), ("bench", "fastpath.bench"))


def _walk(ext: str) -> dict:
    """module name -> source path, for every file ending in `ext` under the three trees."""
    out = {}
    for top, pkg in TOPS:
        base = os.path.join(ROOT, top)
        for d, dirs, files in os.walk(base):
            dirs[:] = sorted(x for x in dirs if x not in ("data", "__pycache__", "include"))
            rel = os.path.relpath(d, base)
            parts = [pkg] + ([] if rel == "." else rel.split(os.sep))
            for f in sorted(files):
                if f.endswith(ext):
                    stem = f[:-len(ext)]
                    out[".".join(parts if stem == "__init__" else parts + [stem])] = \
                        os.path.join(d, f)
    return out


MODULES = _walk(".py")
COMPILED = _walk(".pyx")          # fastpath._engine, _kernels, _serve, fastpath.gpu._protocol, ...
KNOWN = set(MODULES) | set(COMPILED) | {"fastpath"}


def _py_imports(name: str, path: str) -> list:
    """(target, enclosing function or None at module level, line) for each import of `path`;
    targets outside fastpath are kept, by their full dotted name."""
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
                    out.append((sub if sub in KNOWN else mod, func, child.lineno))
            visit(child, f)

    visit(tree, None)
    return out


_PYX_IMPORT = re.compile(r"^(?P<indent>[ \t]*)(?:from[ \t]+(?P<mod>[\w.]+)[ \t]+import[ \t]+"
                         r"(?P<names>[\w, ()]+)|import[ \t]+(?P<plain>[\w.]+))", re.M)
_PYX_INCLUDE = re.compile(r'^include[ \t]+"(?P<file>[\w.]+)"', re.M)


def _pyx_imports(path: str) -> list:
    """(target, "<indented>" or None at module level, line) for each Python import line of a
    .pyx and of the .pxi files it includes (cimports are compile-time and not counted)."""
    src = open(path).read()
    out = []
    for m in _PYX_IMPORT.finditer(src):
        mod = m.group("mod") or m.group("plain")
        if m.group("names"):
            first = m.group("names").strip("( ").split(",")[0].strip()
            sub = f"{mod}.{first}"
            mod = sub if sub in KNOWN else mod
        out.append((mod, "<indented>" if m.group("indent") else None,
                    src.count("\n", 0, m.start()) + 1))
    for inc in _PYX_INCLUDE.finditer(src):
        out.extend(_pyx_imports(os.path.join(os.path.dirname(path), inc.group("file"))))
    return out


ALL_IMPORTS = {**{m: _py_imports(m, p) for m, p in MODULES.items()},
               **{m: _pyx_imports(p) for m, p in COMPILED.items()}}
IMPORTS = {m: [i for i in imps if i[0] == "fastpath" or i[0].startswith("fastpath.")]
           for m, imps in ALL_IMPORTS.items()}


def _is(target: str, prefix: str) -> bool:
    return target == prefix or target.startswith(prefix + ".")


BASE = {"fastpath.errors", "fastpath._checks", "fastpath._ranges"}
# layer -> what its modules may import from fastpath (a prefix ending in "." allows a package)
ALLOWED = {
    "fastpath.errors": set(),
    "fastpath._checks": {"fastpath.errors"},
    "fastpath._ranges": set(),
    "fastpath.model.": BASE | {"fastpath.model", "fastpath.model."},
    "fastpath.lob.": BASE | {"fastpath.lob", "fastpath.lob."},
    "fastpath.control.": BASE | {"fastpath.model", "fastpath.control", "fastpath.control.",
                          "fastpath.config", "fastpath._memory", "fastpath._privileges"},
}
# the one upward call a layer makes on purpose: Model.fit_cache_policy delegates to the
# shadow replay in fastpath.tuning (which drives the engine), at call time only
EXCEPTIONS = {("fastpath.model.model", "fastpath.tuning", "fit_cache_policy"),
              # the bench sets the BLAS pools' thread variables when it is imported: the
              # command line loads it only when `fastpath bench` runs
              ("fastpath.cli", "fastpath.bench.run", "cmd_bench")}

# what an import inside a function may load: the optional dependencies, which `import
# fastpath` must not need (and tomllib / tomli, which one Python has and another lacks)
OPTIONAL = {"onnx", "onnxruntime", "lightgbm", "xgboost", "catboost", "sklearn", "skl2onnx",
            "onnxmltools", "torch", "pycuda", "cupy", "tomllib", "tomli", "rich", "hdrh",
            "matplotlib", "threadpoolctl", "treelite", "tl2cgen", "lleaves", "atheris",
            "databento_dbn"}
# modules that still import inside functions what is not optional: each
# case turns red (strict xfail) once the module is fixed, so the entry can go
INNER_PENDING: dict = {}
# the hot path (the compiled engine, the modules that resolve and build its configuration, the
# serving worker and its client) and what it imports, module level or at call time; none of it
# may reach the control plane or bench
HOT = ("fastpath._engine", "fastpath._resolve", "fastpath._build", "fastpath._serve",
       "fastpath._client")


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


def test_model_imports_neither_control_bench_nor_the_compiled_engine():
    above = ("fastpath.control", "fastpath.bench", "fastpath._build", *COMPILED)
    bad = [f"{m} line {ln}: {t}" for m, imps in IMPORTS.items() if _is(m, "fastpath.model")
           for t, f, ln in imps if any(_is(t, a) for a in above)]
    assert not bad


def _reach(start, follow) -> dict:
    """module -> the module it was reached from, for everything `start` imports, directly or
    through what it imports (module level and at call time; `follow(m)` says whether to look
    into m's own imports)."""
    seen = {s: None for s in start}
    todo = list(start)
    while todo:
        m = todo.pop()
        if not follow(m):
            continue
        for t, _, _ in IMPORTS.get(m, ()):
            if t not in seen and t != "fastpath":
                seen[t] = m
                todo.append(t)
    return seen


def test_hot_path_reaches_no_control_plane_or_bench():
    seen = _reach(HOT, lambda m: True)
    bad = sorted(f"{t} (from {by})" for t, by in seen.items()
                 if _is(t, "fastpath.control") or _is(t, "fastpath.bench"))
    assert not bad, f"the hot path imports the control plane or the bench: {bad}"


def test_what_the_hot_path_reaches_imports_no_control_plane():
    """Beside the pending case above: the modules the hot path reaches (not through the
    control plane), other than fastpath._build and the compiled engine's own lines, import
    no control plane or bench."""
    def plane(m):
        return _is(m, "fastpath.control") or _is(m, "fastpath.bench")
    seen = _reach(HOT, lambda m: not plane(m))
    bad = [f"{m} line {ln}: {t}" for m in seen if m not in HOT and m in MODULES and not plane(m)
           for t, _, ln in IMPORTS[m] if plane(t)]
    assert not bad


def test_every_fastpath_import_exists():
    stale = [f"{m} line {ln}: {t}" for m, imps in IMPORTS.items() for t, _, ln in imps
             if t not in KNOWN and not t.startswith("fastpath._csrc")]
    assert not stale, f"imports of modules that do not exist: {stale}"


def _cycle(graph: dict):
    state: dict = {}

    def walk(m, path):
        state[m] = 1
        for t in sorted(graph.get(m, ())):
            if state.get(t) == 1:
                return path + [m, t]
            if t not in state:
                found = walk(t, path + [m])
                if found:
                    return found
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = walk(m, [])
            if found:
                return found
    return None


def test_module_level_imports_have_no_cycle():
    paths = {**MODULES, **COMPILED}
    graph = {m: {t for t, f, _ in imps if f is None and t in paths and t != m}
             for m, imps in IMPORTS.items()}
    # a package's __init__ importing its own submodules is how packages re-export
    for m in graph:
        graph[m] = {t for t in graph[m] if not (paths[m].endswith("__init__.py")
                                                and t.startswith(m + "."))}
    found = _cycle(graph)
    assert not found, "import cycle: " + " -> ".join(found)


def test_no_cycle_even_at_call_time():
    paths = {**MODULES, **COMPILED}
    graph = {m: {t for t, _, _ in imps if t in paths and t != m} for m, imps in IMPORTS.items()}
    for m in graph:
        graph[m] = {t for t in graph[m] if not (paths[m].endswith("__init__.py")
                                                and t.startswith(m + "."))}
    found = _cycle(graph)
    assert not found, "import cycle: " + " -> ".join(found)


def test_the_cycle_check_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def _inner(mod: str) -> list:
    return [f"line {ln}: {t} (in {f}())" for t, f, ln in ALL_IMPORTS[mod]
            if f is not None and t.split(".")[0] not in OPTIONAL
            and (mod, t, f) not in EXCEPTIONS]


@pytest.mark.parametrize("mod", [
    pytest.param(m, marks=pytest.mark.xfail(strict=True, reason=INNER_PENDING[m]))
    if m in INNER_PENDING else m for m in sorted(ALL_IMPORTS)])
def test_imports_inside_functions_are_optional_dependencies(mod):
    """An import inside a function hides the graph: only an optional dependency (one
    `import fastpath` must not need) is imported where it is used."""
    bad = _inner(mod)
    assert not bad, f"{mod} imports at call time what it could import at the top: {bad}"


def test_the_pyx_reader_sees_call_time_imports():
    imps = ALL_IMPORTS["fastpath._kernels"]
    assert ("fastpath.errors", None) in {(t, f) for t, f, _ in imps}
    assert any(t == "fastpath._core" and f is None for t, f, _ in imps)


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


def test_the_compiled_modules_import_paths_stay_valid():
    """The .pyx files import model names at run time: each path they name still holds it."""
    import importlib
    for m, imps in ALL_IMPORTS.items():
        if m not in COMPILED:
            continue
        src = open(COMPILED[m]).read()
        for mod, names in re.findall(r"^[ \t]*from[ \t]+(fastpath\.model[\w.]*)[ \t]+import[ \t]+"
                                     r"([\w, ]+)", src, re.M):
            target = importlib.import_module(mod)
            for n in names.split(","):
                assert hasattr(target, n.strip()), f"{m}: {mod}.{n.strip()}"
    from fastpath.model import types
    from fastpath.model.trees import TreeEnsemble
    assert types.Model.from_onnx and TreeEnsemble


def test_the_gpu_refusal_lives_in_gpu():
    """fastpath.gpu says which models its kernels refuse, without reaching up to _build; the
    engine's resolution (fastpath._build) gives the same answers."""
    import numpy as np

    import fastpath.gpu
    from fastpath import _build
    from fastpath.control.config import load_config
    from fastpath.gpu._pack import MAX_LAYERS
    from fastpath.gpu._refusal import gpu_refusal
    from fastpath.model import Layer, Model
    assert fastpath.gpu.gpu_refusal is gpu_refusal
    assert not {t for t, _, _ in IMPORTS["fastpath.gpu"] if _is(t, "fastpath._build")}
    one = Model((Layer(np.ones((2, 3)), np.zeros(2)),))
    two = Model((Layer(np.ones((4, 3)), np.zeros(4), "relu"), Layer(np.ones((2, 4)), np.zeros(2))))
    deep = Model(tuple(Layer(np.ones((3, 3)), np.zeros(3)) for _ in range(MAX_LAYERS - 1))
                 + (Layer(np.ones((2, 3)), np.zeros(2)),))
    cfg = load_config(None)
    for m in (one, two, deep, one.with_weights("bf16"), two.with_weights("int8")):
        for c in (None, cfg):
            assert gpu_refusal(m, c) == _build.gpu_refusal(m, c)
    assert gpu_refusal(one) is None and gpu_refusal(deep) is None
    assert "fp32 MLPs only" in gpu_refusal(two.with_weights("int8"))
