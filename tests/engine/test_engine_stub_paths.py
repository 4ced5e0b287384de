"""fastpath/_engine.pyi, the type stub of the compiled engine, declares the paths the engine
takes."""
import os


ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_engine_stub_takes_the_paths_the_engine_takes():
    """Engine(pathlib.Path("model.fpm")) runs (as Model.load(path: str | os.PathLike) does),
    but fastpath/_engine.pyi declared model: Model | str, so a type checker refused it."""
    import ast
    import pathlib

    import fastpath
    from fastpath._build import DEMO_MODEL
    assert fastpath.Engine(pathlib.Path(DEMO_MODEL)).n_features > 0
    tree = ast.parse(open(os.path.join(ROOT, "fastpath", "_engine.pyi")).read())
    eng = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Engine")
    init = next(n for n in eng.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    ann = ast.unparse(next(a for a in init.args.args if a.arg == "model").annotation)
    assert "PathLike" in ann, ann
