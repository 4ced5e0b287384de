"""Kernel parameter lists two ways: the PTX `.entry` declarations nvcc emits for
csrc/cuda/fp_mlp.cu, and the pycuda prepare() format strings fastpath/gpu/_backend.py
launches them with (read from its AST, nothing imported)."""
from __future__ import annotations

import ast
import re
import shutil
import struct
import subprocess

_ENTRY = re.compile(r"\.entry\s+(\w+)\s*\(([^)]*)\)", re.S)
# .param [.align N] .<type><bits> [.ptr .<space> .align N] name[[count]]
_PARAM = re.compile(r"\.param\s+(?:\.align\s+\d+\s+)?\.([a-z])(\d+)\b[^\[]*?(?:\[(\d+)\])?\s*$")


def nvcc() -> str | None:
    return shutil.which("nvcc")


def ptx(cu: str, include: str, timeout_s: int = 300) -> str:
    """nvcc -ptx of `cu` for sm_80 (the oldest architecture the fatbin holds)."""
    r = subprocess.run([nvcc(), "-ptx", "-arch=sm_80", "-I", include, "-o", "-", cu],
                       capture_output=True, text=True, timeout=timeout_s)
    if r.returncode:
        raise RuntimeError(f"nvcc -ptx {cu} failed:\n{r.stderr[-3000:]}")
    return r.stdout


def entry_params(ptx_text: str) -> dict:
    """kernel name -> [bytes of each parameter] from the PTX's .entry declarations."""
    out = {}
    for name, body in _ENTRY.findall(ptx_text):
        sizes = []
        for decl in filter(None, (d.strip() for d in body.split(","))):
            m = _PARAM.search(decl)
            if not m:
                raise ValueError(f"unparsed parameter of {name}: {decl!r}")
            sizes.append(int(m.group(2)) // 8 * int(m.group(3) or 1))
        out[name] = sizes
    return out


def _const(node):
    """A format string written as a literal, or as literal * int / literal + literal."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Add)):
        left, right = _const(node.left), _const(node.right)
        return left * right if isinstance(node.op, ast.Mult) else left + right
    raise ValueError(f"prepare() argument is not a constant: {ast.dump(node)}")


def prepare_formats(source: str) -> dict:
    """kernel name -> prepare() format, pairing get_function("name") and .prepare(fmt) made
    in the same function of `source`."""
    out = {}
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        names, fmts = [], []
        for node in ast.walk(fn):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                # a name given as a variable (the module's up-front fetch of every kernel)
                # launches nothing: only a literal name pairs with a prepare()
                if (node.func.attr == "get_function" and node.args
                        and isinstance(node.args[0], ast.Constant)):
                    names.append(node.args[0].value)
                elif node.func.attr == "prepare" and node.args:
                    fmts.append(_const(node.args[0]))
        if len(names) == 1 and len(fmts) == 1:
            out[names[0]] = fmts[0]
    return out


def format_sizes(fmt: str) -> list:
    """bytes of each argument pycuda packs for a prepare() format (struct's native sizes)."""
    return [struct.calcsize(c) for c in fmt if not c.isspace()]


def mismatches(ptx_sizes: dict, formats: dict) -> list:
    """What disagrees between the PTX entries and the prepare() formats (empty: all agree)."""
    out = [f"{k}: launched (prepare {formats[k]!r}) but no .entry in the PTX"
           for k in sorted(set(formats) - set(ptx_sizes))]
    for k in sorted(set(ptx_sizes) & set(formats)):
        want, have = ptx_sizes[k], format_sizes(formats[k])
        if want != have:
            out.append(f"{k}: the PTX takes {len(want)} parameters of {want} bytes, prepare "
                       f"{formats[k]!r} packs {len(have)} of {have}")
    return out
