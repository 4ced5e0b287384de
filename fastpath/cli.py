"""The `fastpath` command: info, doctor, calibrate, example-config, bench, serve."""
from __future__ import annotations

import argparse
import json
import os
import sys
import zipfile

import numpy as np

import fastpath
from fastpath import lob
from fastpath._build import DEMO_MODEL, EXAMPLE_CONFIG, engine_region_bytes, load_model
from fastpath._checks import MAX_SYMBOLS
from fastpath._kernels import jitter_probe
from fastpath._ranges import parse_ranges
from fastpath.control import doctor
from fastpath.control.config import load_config, read_toml
from fastpath.control.host import Host, format_cpulist, read_topology, sample_busy
from fastpath.errors import FastpathError, InputError, ModelError
from fastpath.gpu import gpu_status
from fastpath.model import HEAD_KINDS, Head, Model, parity
from fastpath.model.bundle import _path
from fastpath.serving import server
from fastpath.tuning import (_check_time_order, _dense_symbols, calibrate, resolve_features,
                             weights_error)


_FIELDS_EXAMPLE = {"--z-fields": "0-111", "--window-fields": "40,60,61"}


def _parse_fields(spec: str | None, default, option: str):
    """'0-111,120,130-133' -> [0..111, 120, 130..133], in the order written; 'none' -> [].
    A list that names no field ('', ' ', ',') is a usage error: --window-fields "$UNSET"
    meant none, silently, and the default --z-fields then grew to fill the model's inputs
    (the demo model's 3 window fields fitted as 6 more z fields, exit 0)."""
    if spec is None:
        return list(default)
    if spec.strip().lower() == "none":
        return []
    try:
        fields = parse_ranges(spec, f"{option} field list")
    except ValueError as exc:
        raise SystemExit(f"fastpath calibrate: {exc}") from None
    if not fields:
        raise SystemExit(f"fastpath calibrate: {option} {spec!r} names no field; expected a "
                         f"field list such as '{_FIELDS_EXAMPLE.get(option, '0-3,8')}', or "
                         f"'none' for no fields (leave {option} out for the default)")
    return fields


def _int_in(lo: int, hi: int):
    """argparse type: an int in [lo, hi], else a usage error (not a traceback from deep in
    the fit, as a window of -3 gave)."""
    def conv(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer in {lo}..{hi}, got {text!r}")
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"expected an integer in {lo}..{hi}, got {v}")
        return v
    return conv


def _max_error(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"max_error must be a signal error in (0, 2], got {text!r}")
    if not 0 < v <= 2:              # NaN fails this too
        raise argparse.ArgumentTypeError(f"max_error must be a signal error in (0, 2], got {text}")
    return v


def _holdout(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = float("nan")
    if not 0 <= v <= 0.9:           # NaN fails this too
        raise argparse.ArgumentTypeError(f"holdout must be the fraction of ticks held out, in "
                                         f"[0, 0.9], got {text!r}")
    return v


def _jitter_seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = float("nan")
    if not 0 < v <= 3600:           # NaN fails this too
        raise argparse.ArgumentTypeError(f"expected seconds in (0, 3600], got {text!r}")
    return v


_HEAD_FORM = "KIND[:OUTPUTS][@SCALE]"


def _head_arg(text: str):
    """argparse type for --head: KIND[:OUTPUTS][@SCALE] -> fastpath.model.Head, e.g.
    'classifier3', 'classifier3:2,1,0', 'regression:1', 'regression:0@0.004',
    'tanh_sigmoid:3,1'; the values Head takes (kind, output indices, scale), checked by it."""
    body, at, scale_text = text.partition("@")
    kind, colon, outs_text = body.partition(":")
    kind = kind.strip()
    if kind not in HEAD_KINDS:
        raise argparse.ArgumentTypeError(f"expected {_HEAD_FORM} with KIND one of "
                                         f"{', '.join(HEAD_KINDS)}, got {text!r}")
    outs = ()
    if colon:
        try:
            outs = tuple(int(v) for v in outs_text.split(","))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {_HEAD_FORM}, OUTPUTS the output indices the head reads, "
                f"comma-separated (e.g. {kind}:{','.join(map(str, HEAD_KINDS[kind]))}), got "
                f"{text!r}") from None
    scale = 1.0
    if at:
        try:
            scale = float(scale_text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {_HEAD_FORM}, SCALE a number > 0 (the "
                                             f"regression head's), got {text!r}") from None
        if kind != "regression":
            raise argparse.ArgumentTypeError(f"@SCALE is the regression head's scale; head "
                                             f"{kind!r} takes none, got {text!r}")
    try:
        return Head(kind, scale, outs)
    except ModelError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (from {text!r})") from None


class _HeadOption(argparse.Action):
    """--head: the Head (_head_arg) in args.head, and in args.head_scale_given whether the
    text named a scale (@SCALE): a regression head's scale 1 given on purpose is not the
    default nobody chose, which _regression_scale_note speaks of."""

    def __call__(self, parser, namespace, text, option_string=None):
        try:
            head = _head_arg(text)
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentError(self, str(exc)) from None
        setattr(namespace, self.dest, head)
        namespace.head_scale_given = "@" in text


def _regression_scale_note(model, scale_given: bool, cmd: str, source,
                           head_given: bool = True) -> str | None:
    """A line for stderr when `model` runs a regression head whose scale nobody fitted or
    gave, else None. Its signal is tanh(out / 1.0): an output in a return's units (~1e-3)
    reads as a signal near 0 whatever it predicts, one in price units saturates at +-1, and
    nothing said so. The Python API stays quiet (no warning on the engine's way); the
    commands that run a model say it once, before they start. head_given: --head was given
    (else the model's own head, set after a fit through the Python API, is what runs)."""
    h = model.head_spec
    if h.kind != "regression" or scale_given:
        return None
    fit = model.meta.get("head_fit") if isinstance(model.meta, dict) else None
    fitted = None
    if isinstance(fit, dict):
        try:
            fitted = float(fit["abs_prediction_q"]) / float(fit["target"])
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            fitted = None
        # a fit records the output it was made on (bundles before it: the head's own); a
        # scale fitted to output 0 says nothing of output 1's units
        if fit.get("outputs") is not None and list(fit["outputs"]) != list(h.outputs):
            fitted = None
    if fitted is not None and abs(fitted - h.scale) <= 1e-6 * max(abs(fitted), 1e-30):
        return None                             # calibrate's scale, in force
    if h.scale != 1.0:
        return None                             # a scale someone set (Head(scale=...))
    i = h.outputs[0]
    where = "" if i == 0 else f":{i}"
    if fitted is not None:
        return (f"fastpath {cmd}: note: {source}'s regression head runs at scale 1.0, not the "
                f"{fitted:.6g} calibrate fitted ("
                + ("--head without @SCALE replaced it" if head_given else
                   "the head was set after the fit")
                + f"): signal = tanh(output / 1.0); give --head regression{where}@{fitted:.6g}"
                + (", or leave --head out to keep the bundle's" if head_given else ""))
    return (f"fastpath {cmd}: note: {source}'s regression head runs at scale 1.0, never "
            f"fitted: signal = tanh(output / 1.0), near 0 or saturated at +-1 unless the "
            f"output is in those units; fit it with `fastpath calibrate` or give it with "
            f"--head regression{where}@SCALE")


def _say_regression_scale_note(args, model, cmd: str) -> None:
    """_regression_scale_note for the model a command (serve, doctor) loaded from --model /
    --head, on stderr when there is one."""
    note = _regression_scale_note(model, getattr(args, "head_scale_given", False), cmd,
                                  "the demo model" if args.model is None else args.model,
                                  args.head is not None)
    if note:
        print(note, file=sys.stderr, flush=True)


def _load(path, head, default=None):
    """The model at `path` (or `default`: the demo model) with --head's head, if given: an
    ONNX file is imported with it (Model.from_onnx(path, head=...)), a bundle takes it in
    place of its own (Model.load(path, head=...), as with_head)."""
    # `is None`: --model "" (an unset shell variable) served the demo model, silently
    path = default if path is None else path
    if head is None:
        return load_model(path)
    p = _path(path, "--model")
    if p.lower().endswith(".onnx"):
        return Model.from_onnx(p, head=head)
    return Model.load(p, head=head)


def _load_native(path, head):
    """(model, the library's own booster) for a LightGBM text model (.txt) or an XGBoost model
    (.json / .ubj), read by the native loaders; None for any other file."""
    low = str(path).lower()
    try:
        if low.endswith(".txt"):
            import lightgbm
            model = Model.from_lightgbm(path, head=head)
            return model, lightgbm.Booster(model_file=path)
        if low.endswith((".json", ".ubj")):
            import xgboost
            model = Model.from_xgboost(path, head=head)
            return model, xgboost.Booster(model_file=path)
    except ImportError as exc:
        raise SystemExit(f"fastpath calibrate: --model {path}: its parity check needs the "
                         f"{exc.name} package (pip install {exc.name})") from None
    return None


def cmd_info(args) -> int:
    eng = fastpath.get_default_engine()
    info = {"version": fastpath.__version__, "simd": fastpath.simd(),
            "cpu_features": fastpath.cpu_features(), "clock": fastpath.clock_info(),
            "default_model": {"path": DEMO_MODEL, "dims": eng.model.dims, "meta": eng.model.meta,
                              "feature_path": eng.feature_path,
                              "cache": eng.config.cache_origin}}
    print(json.dumps(info, indent=1))
    return 0


def _load_npy(path: str, what: str, kinds: str = "iuf", opt: str = "--ticks"):
    """One array from a .npy file, of a numeric kind in `kinds`; anything else (an .npz
    archive, text, strings, booleans) is a usage error naming the file, not a traceback, and
    one that cannot be read (missing, a directory) names the option that gave it."""
    try:
        with open(path, "rb") as f:
            head = f.read(6)
    except OSError as exc:
        # "[Errno 2] No such file or directory: 'x'" did not say which of three files
        raise SystemExit(f"fastpath calibrate: {opt} {path!r}: cannot read it "
                         f"({exc.strerror or exc})") from None
    if head != b"\x93NUMPY" and head[:4] != b"PK\x03\x04":
        # np.load takes any other start for a pickle: an empty file raised a bare EOFError,
        # a text file "contains pickled (object) data ... allow_pickle", which it does not
        what_is = "empty" if not head else f"starts with {head!r}, not the .npy magic"
        raise SystemExit(f"fastpath calibrate: {path} is not a numpy .npy file of {what}: "
                         f"{what_is} (write it with np.save)")
    try:
        a = np.load(path, allow_pickle=False)
    except (ValueError, EOFError, zipfile.BadZipFile) as exc:     # a truncated file or archive
        raise SystemExit(f"fastpath calibrate: {path} is not a numpy .npy file of {what}: {exc}")
    if not isinstance(a, np.ndarray):       # np.load opens an .npz archive as a mapping
        a.close()
        raise SystemExit(f"fastpath calibrate: {path} is an .npz archive; expected one .npy "
                         f"array of {what} (np.save)")
    if a.dtype.kind not in kinds:
        want = "integers" if kinds == "iu" else "numbers (int or float)"
        raise SystemExit(f"fastpath calibrate: {path} must hold {what} as {want}, got dtype "
                         f"{a.dtype}")
    return a


def _check_fields(fields, raw_len: int, option: str):
    bad = [f for f in fields if not 0 <= f < raw_len]
    if bad:
        raise SystemExit(f"fastpath calibrate: {option} names field {bad[0]}, but the ticks have "
                         f"{raw_len} fields (0..{raw_len - 1})")
    seen = set()
    for f in fields:
        if f in seen:       # '0-10,0' is a typo far more often than a wish to feed a field twice
            raise SystemExit(f"fastpath calibrate: {option} lists field {f} twice; expected "
                             f"each field once")
        seen.add(f)
    return fields


def _check_out(path: str) -> None:
    """--out before any fitting: a name Model.save refuses, or a folder that is not there,
    failed only after the whole fit (minutes with --max-error), the last under the name of
    the temp file the save writes first."""
    if path.lower().endswith(".onnx"):
        raise SystemExit(f"fastpath calibrate: --out {path} names an ONNX file; the command "
                         f"writes a fastpath bundle: name it .fpm")
    if os.path.isdir(path):
        raise SystemExit(f"fastpath calibrate: --out {path} is a directory; give the bundle's "
                         f"file name (e.g. {os.path.join(path, 'model.fpm')})")
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d):
        raise SystemExit(f"fastpath calibrate: --out {path}: no directory {d} to write it in")
    if not os.access(d, os.W_OK | os.X_OK):
        raise SystemExit(f"fastpath calibrate: --out {path}: directory {d} is not writable by "
                         f"this user")


def _ticks_from_data(args):
    """(raw ticks, symbols, timestamps or None) of a recorded book given with --data (any
    source lob.read_data reads); the timestamps only for the cache-policy fit."""
    if args.ticks is not None or args.symbols is not None or args.ts is not None:
        given = [o for o, v in (("--ticks", args.ticks), ("--symbols", args.symbols),
                                ("--ts", args.ts)) if v is not None]
        raise SystemExit(f"fastpath calibrate: --data gives the ticks, their symbols and times; "
                         f"leave out {', '.join(given)}")
    try:
        bs, what = lob.read_data(args.data)
        raws = lob.raw_from_book(bs)
    except (FastpathError, OSError) as exc:
        raise SystemExit(f"fastpath calibrate: --data {args.data}: cannot read it: {exc}") from None
    print(f"ticks: {len(raws)} from {what} ({len(np.unique(bs.symbols))} symbol(s))")
    return raws, bs.symbols, (bs.ts_ns if args.max_error is not None else None)


def _calibrate_ticks(args) -> tuple:
    """(raws, symbols or None, ts or None) from --data or --ticks/--symbols/--ts, checked."""
    _check_out(args.out)
    if args.data is not None:
        raws, syms, ts = _ticks_from_data(args)
        args.ticks = args.data
    else:
        raws = _load_npy(args.ticks, "ticks")
        # `is not None`: --symbols "" (an unset shell variable) fitted every tick as symbol 0
        syms = (_load_npy(args.symbols, "symbols", "iu", "--symbols")
                if args.symbols is not None else None)
        ts = _load_npy(args.ts, "timestamps", "iu", "--ts") if args.ts is not None else None
    if raws.ndim != 2:
        raise SystemExit(f"fastpath calibrate: {args.ticks} must hold a 2-d array (ticks, raw_len), "
                         f"got shape {raws.shape}")
    bad = ~np.isfinite(raws)
    if bad.any():
        r, c = np.argwhere(bad)[0]
        raise SystemExit(f"fastpath calibrate: {args.ticks} tick {r} field {c} is {raws[r, c]}; "
                         f"ticks must be finite ({int(bad.any(1).sum())} tick(s) are not): repair "
                         f"or drop them")
    if syms is not None and syms.shape != (len(raws),):
        raise SystemExit(f"fastpath calibrate: {args.symbols} must hold {len(raws)} symbols, got "
                         f"shape {syms.shape}")
    if syms is not None and len(syms) and syms.min() < 0:
        raise SystemExit(f"fastpath calibrate: {args.symbols} holds symbol {syms.min()}; symbols "
                         f"are ids >= 0")
    if syms is not None and len(syms) and syms.max() >= MAX_SYMBOLS:
        # the --ts file given as --symbols was taken: every tick its own symbol, each window
        # fitted on one tick, and a bundle no engine could serve those ids with
        hint = (" (these look like ns timestamps: they go to --ts)" if syms.max() > 10 ** 15
                else "")
        raise SystemExit(f"fastpath calibrate: {args.symbols} holds symbol {syms.max()}; symbols "
                         f"are ids 0..{MAX_SYMBOLS - 1}, an engine's engine.n_symbols at most "
                         f"{MAX_SYMBOLS}{hint}")
    if ts is not None and (ts.shape != (len(raws),) or ts.dtype.kind not in "iu"):
        raise SystemExit(f"fastpath calibrate: {args.ts} must hold {len(raws)} integer ns "
                         f"timestamps, got {ts.dtype} shape {ts.shape}")
    if args.holdout is not None and args.max_error is None:
        raise SystemExit("fastpath calibrate: --holdout is used by the cache-policy fit; give "
                         "--max-error too")
    if ts is not None and args.max_error is None:
        raise SystemExit("fastpath calibrate: --ts is used by the cache-policy fit; give "
                         "--max-error too")
    if ts is not None:
        # checked here, before the fit, in the option's name: the fit's own checks spoke of
        # ts_ns, the Python argument ("ts_ns must be >= 0, row 7 is -1")
        big = np.flatnonzero(ts > np.iinfo(np.int64).max) if ts.dtype.kind == "u" else ()
        if len(big):
            raise SystemExit(f"fastpath calibrate: --ts row {big[0]} is {ts[big[0]]}, which "
                             f"does not fit a signed 64-bit int of ns")
        _check_time_order(ts, syms, _dense_symbols(syms, len(raws)), "--ts")
    return raws, syms, ts


def _calibrate_model(args):
    """The model to calibrate; a native tree model prints its parity with the library first."""
    native = _load_native(args.model, args.head)
    if native is not None:
        model = native[0]
        print(f"parity with {type(native[1]).__module__.split('.')[0]}'s own predict "
              f"(max error, relative to max(|native|, 1)):")
        print(parity(model, native[1]))
    else:
        model = _load(args.model, args.head)
    return model


def cmd_calibrate(args) -> int:
    raws, syms, ts = _calibrate_ticks(args)
    if args.head is not None and args.head.kind == "regression" and \
            getattr(args, "head_scale_given", False):
        raise SystemExit(f"fastpath calibrate: --head gives the regression head a scale "
                         f"(@{args.head.scale:g}), but calibrate fits the regression head's "
                         f"scale to the ticks; give the head without @SCALE")
    model = _calibrate_model(args)
    if model.trees is not None and args.weights in ("bf16", "int8"):
        # refused by with_weights only after the whole fit, which it had printed
        raise SystemExit(f"fastpath calibrate: --weights {args.weights} packs an MLP's hidden "
                         f"layers; {args.model} is a tree ensemble, which runs its float32 "
                         f"thresholds (leave --weights out)")
    n_in = model.dims[0]
    w_default = lob.WINDOW_FIELDS if raws.shape[1] == lob.RAW_LEN else ()
    w = _check_fields(_parse_fields(args.window_fields, w_default, "--window-fields"),
                      raws.shape[1], "--window-fields")
    z = _check_fields(_parse_fields(args.z_fields, range(n_in - 2 * len(w)), "--z-fields"),
                      raws.shape[1], "--z-fields" if args.z_fields else
                      f"the default --z-fields (the first {n_in - 2 * len(w)} fields: the model's {n_in} "
                      f"inputs less 2 x {len(w)} window features)")
    if len(z) + 2 * len(w) != n_in:
        raise SystemExit(f"fastpath calibrate: {len(z)} z fields + 2 x {len(w)} window fields = "
                         f"{len(z) + 2 * len(w)} features, but the model takes {n_in}")
    try:
        # the spec z-scores by default, what the demo model and an MLP trained on z-scored
        # inputs read; a tree or a pipeline with its own scaler must say (as calibrate asks)
        features = resolve_features(model, args.features, ("--features raw", "--features zscore"),
                                    "fastpath calibrate")
    except ModelError as exc:
        raise SystemExit(str(exc)) from None
    names = lob.field_names() if raws.shape[1] == lob.RAW_LEN else ()
    out = calibrate(model, raws, z, w, args.window, syms, names, features)
    fs = out.feature_spec
    kind = "z-scored" if features == "zscore" else "raw (not scaled)"
    print(f"feature spec: raw_len {fs.raw_len}, {len(z)} {kind} fields, {len(w)} windowed "
          f"fields over {args.window} ticks, fitted on {len(raws)} ticks")
    h = out.head_spec
    if h.kind == "regression":
        print(f"head: regression, signal = tanh(out / {h.scale:.6g}) (scale fitted: the "
              f"{out.meta['head_fit']['quantile']:.0%} quantile of |prediction| maps to "
              f"{np.tanh(out.meta['head_fit']['target']):.2f})")
    else:
        print(f"head: {h.kind} (outputs {list(h.outputs)})")
    if args.weights == "fp32" and out.trees is not None:
        # "fp32 hidden layers" spoke of an MLP's
        print("weights: fp32 (a tree ensemble's float32 thresholds and leaves: nothing to "
              "measure against)")
    elif args.weights == "fp32" == out.weights:
        print("weights: fp32 hidden layers (the model's own: nothing to measure against)")
    elif args.weights is not None:
        # a model already holding the weights asked for is measured too: --weights int8 on
        # an int8 model printed nothing, where the help promises the error against fp32
        # back to fp32: what the weights it had cost (fp32 against fp32 would read 0)
        measured = out.weights if args.weights == "fp32" else args.weights
        e = weights_error(out, raws, measured, syms)
        what = (f"fp32 hidden layers (were {out.weights}; {out.weights}'s signal against fp32"
                if args.weights == "fp32" else f"{args.weights} hidden layers (signal against fp32")
        print(f"weights: {what} on these ticks: max |d| {e['max_abs']:.4g} (tick "
              f"{e['worst_tick']}), mean {e['mean_abs']:.3g}, {e['sign_flips']} sign flip(s) in "
              f"{e['n']})")
        if args.weights != out.weights:
            out = out.with_weights(args.weights)
    if args.max_error is None:
        cache = ("cache: off (no --max-error given; fit a policy with --max-error E, the largest "
                 "|signal error| a cache hit may cost, or enable one in the engine config)")
    else:
        if ts is None:
            print("cache fit: no --ts given, ticks taken 1 ms apart for the age guard")
        out, rep = out.fit_cache_policy(raws, syms, max_error=args.max_error, ts_ns=ts,
                                        holdout=0.25 if args.holdout is None else args.holdout)
        rep.ts_name = "timestamps with --ts"
        print(rep.table())
        p = out.cache_policy
        cache = (f"cache: on, fitted to max error {p.fitted_max_error:g} (cosine >= "
                 f"{p.cos_threshold:g}, norm within {p.norm_tol:g})" if p.enabled else
                 "cache: off (no policy fitted within the budget)")
    out.save(args.out)
    print(f"wrote {args.out}; {cache}")
    return 0


def _gpu_status() -> tuple:
    return gpu_status()


def _jitter(seconds: float, threshold_ns: int) -> dict:
    """jitter_probe's report for `seconds`, probed in pieces of at most a second and merged:
    the probe spins in C without looking at signals, so Ctrl-C waited out the whole
    --jitter (up to an hour); between pieces the interrupt is taken."""
    out, left, hist = None, seconds, {}
    while left > 1e-9:
        piece = jitter_probe(min(1.0, left), threshold_ns)
        left -= piece["seconds"]
        for lo, hi, n in piece["histogram"]:
            hist[(lo, hi)] = hist.get((lo, hi), 0) + n
        if out is None:
            out = piece
        else:
            out["reads"] += piece["reads"]
            out["gaps"] += piece["gaps"]
            out["max_gap_ns"] = max(out["max_gap_ns"], piece["max_gap_ns"])
    out["seconds"] = seconds
    out["histogram"] = [[lo, hi, n] for (lo, hi), n in sorted(hist.items())]
    return out


def _doctor_model(args):
    """The model doctor sizes (what its engine locks): --model with --head's head. A model
    that runs only with a head it was not given (an ONNX with 3 raw outputs) was refused,
    asking for a --head doctor has no use for: the head is a few numbers in the engine, not
    memory. Such a model is sized with a stand-in head reading output 0, and a note says so
    (serve and calibrate will ask for the head); a model no head can load is refused with
    its own error."""
    try:
        model = _load(args.model, args.head, DEMO_MODEL)
    except ModelError as exc:
        if args.head is not None:
            raise
        try:
            model = _load(args.model, Head("regression", outputs=(0,)), DEMO_MODEL)
        except ModelError:
            raise exc from None
        print(f"fastpath doctor: note: {args.model} sized with a stand-in head (a head does "
              f"not change what the engine locks); serving it needs one: {exc}", file=sys.stderr)
        return model
    _say_regression_scale_note(args, model, "doctor")
    return model


def cmd_doctor(args) -> int:
    cfg = load_config(args.config)     # a binary file is a ConfigError naming it
    core = args.core if args.core is not None else (
        cfg.placement.core if cfg.placement.core != "auto" else None)
    host = Host(args.root)
    if args.core is not None:
        online = read_topology(host).cpus
        if args.core not in online:
            # choose_core's refusal names placement.core, a key the user did not write here
            raise SystemExit(f"fastpath doctor: --core {args.core} is not an online CPU of this "
                             f"host (online: {format_cpulist(online)})")
    busy = sample_busy(host, 0.2) if args.root == "/" else {}
    model = _doctor_model(args)
    res = doctor.run_checks(host, core, cfg.placement.policy, cfg.placement.priority,
                            use_gpu=args.gpu, busy=busy, config=args.config,
                            arena_bytes=engine_region_bytes(model, cfg),
                            # decided here, from the file load_config read: doctor's own
                            # reading of it missed the [serve] table of a file saved with a
                            # byte-order mark and left the segment out of the mlock total
                            serve=bool(args.serve) or (args.config is not None and
                                                       "serve" in read_toml(args.config)),
                            raw_len=model.feature_spec.raw_len,
                            gpu_backend=_gpu_status() if args.gpu and args.root == "/" else None)
    if args.jitter:
        pinned = True
        try:
            os.sched_setaffinity(0, {res["core"]})
        except OSError as exc:
            pinned = False
            print(f"fastpath doctor: cannot pin to CPU {res['core']}: {exc.strerror}", file=sys.stderr)
        ran_on = format_cpulist(os.sched_getaffinity(0))
        res["jitter"] = _jitter(args.jitter, args.jitter_threshold_ns)
        # unpinned, the probe ran wherever the scheduler put it: the report named the core it
        # could not pin to as the one measured
        res["jitter"]["cpu"] = res["core"] if pinned else None
        res["jitter"]["ran_on"] = ran_on
    if args.json:
        print(json.dumps(res, indent=1))
    else:
        mark = {"pass": "PASS", "warn": "WARN", "fail": "FAIL"}
        print(f"fastpath doctor: checks for CPU {res['core']} "
              f"(placement: {'; '.join(res['placement']['reasons'])})")
        for c in res["checks"]:
            print(f"  [{mark[c['status']]}] {c['name']:<22} {c['detail']}")
            if c["fix"] and c["status"] != "pass":
                print(f"  {'':<29}fix: {c['fix']}")
        if "jitter" in res:
            j = res["jitter"]
            where = (f"CPU {j['cpu']}" if j["cpu"] is not None else
                     f"CPUs {j['ran_on']} (not pinned to CPU {res['core']})")
            print(f"\n  jitter on {where}: {j['seconds']} s, {j['reads']} clock reads, "
                  f"{j['gaps']} gaps > {j['threshold_ns']} ns, max {j['max_gap_ns'] / 1000:.1f} us")
            for lo, hi, n in j["histogram"]:
                print(f"    {lo / 1000:>10.1f} - {hi / 1000:>10.1f} us  {n:>8}  {'#' * min(60, n.bit_length() * 4)}")
        print(f"\n  {res['failed']} failed, {res['warned']} warnings, "
              f"{len(res['checks']) - res['failed'] - res['warned']} passed")
    return 1 if res["failed"] else 0


def cmd_example_config(args) -> int:
    with open(EXAMPLE_CONFIG) as f:
        sys.stdout.write(f.read())
    return 0


def cmd_serve(args) -> int:
    model = args.model
    if args.model is not None or args.head is not None:
        # loaded here, once: what it runs is known before it starts (the regression note)
        model = _load(args.model, args.head, DEMO_MODEL)
        _say_regression_scale_note(args, model, "serve")
    return server.run_foreground(args.name, model, args.config, stats=args.stats,
                                 tick_sizes=_tick_sizes_option(args.tick_size))


def _tick_sizes_option(values):
    """--tick-size as serve()'s tick_sizes: None, one number for every symbol (TICK), or
    {symbol: number} (SYMBOL=TICK, repeated); the values are checked by serve()."""
    if not values:
        return None
    if len(values) == 1 and "=" not in values[0]:
        return _number_option("--tick-size", values[0])
    out = {}
    for v in values:
        sym, eq, tick = v.partition("=")
        if not eq or not sym.strip().isdigit():
            raise InputError(f"--tick-size {v!r}: give SYMBOL=TICK for each symbol (e.g. "
                             f"--tick-size 0=0.01 --tick-size 1=0.5), or one TICK for every "
                             f"symbol")
        out[int(sym)] = _number_option(f"--tick-size {v}", tick)
    return out


def _number_option(what, text):
    try:
        return float(text)
    except ValueError:
        raise InputError(f"{what}: {text!r} is not a number") from None


def cmd_bench(argv) -> int:
    from fastpath.bench.run import main
    try:
        return main(argv, prog="fastpath bench")
    except SystemExit as exc:
        # the bench's own refusals (a --data it cannot read) are bench/run.py's words
        if isinstance(exc.code, str) and exc.code.startswith("bench/run.py: "):
            raise SystemExit("fastpath bench: " + exc.code[len("bench/run.py: "):]) from None
        raise


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "bench":
        # past argparse (the bench parses its own options), not past the exit codes: a --data
        # it cannot read exited 1 and Ctrl-C was a traceback
        return _guarded("bench", cmd_bench, argv[1:])
    ap = argparse.ArgumentParser(prog="fastpath", description="fastpath command line")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("info", help="kernel set, clock and default model")
    sub.add_parser("example-config", help="print the commented example TOML config")
    d = sub.add_parser("doctor", help="host readiness checks, each with a verdict and a fix")
    d.add_argument("--json", action="store_true", help="machine-readable output")
    d.add_argument("--jitter", type=_jitter_seconds, metavar="SECONDS",
                   help="spin on the chosen core this long (> 0, up to 3600 s) and histogram "
                        "the gaps (cyclictest-style)")
    d.add_argument("--jitter-threshold-ns", type=_int_in(1, 1 << 40), default=1000,
                   help="smallest gap recorded (ns, >= 1)")
    d.add_argument("--core", type=_int_in(0, (1 << 16) - 1),
                   help="check this core instead of the one placement chooses")
    d.add_argument("--config", help="TOML config (placement policy and priority)")
    d.add_argument("--gpu", action="store_true", help="checks as for the GPU backend")
    d.add_argument("--model", help="the model the engine runs (.onnx / .fpm; default: the demo "
                                   "model), for the size of what it locks")
    d.add_argument("--head", action=_HeadOption, metavar=_HEAD_FORM,
                   help="the head that turns the model's outputs into signal and confidence "
                        "(Model.from_onnx(head=...), or with_head for a bundle): KIND one of "
                        "tanh_sigmoid, regression, classifier3, classifier2; OUTPUTS the "
                        "indices it reads, e.g. classifier3:2,1,0 or regression:1; SCALE a "
                        "regression head's scale (default 1)")
    d.add_argument("--serve", action="store_true",
                   help="count the `fastpath serve` segment as locked too (default: when the "
                        "config has a [serve] table)")
    d.add_argument("--root", default="/", help=argparse.SUPPRESS)
    sub.add_parser("bench", help="the latency bench (same as python bench/run.py; --help there)")
    c = sub.add_parser("calibrate", help="fit a model's feature spec, a regression head's scale "
                       "(and, with --max-error, its cache policy) from recorded raw ticks")
    src = c.add_mutually_exclusive_group(required=True)
    src.add_argument("--ticks", help=".npy of recorded raw ticks, shape (n, raw_len)")
    src.add_argument("--data", help="a recorded book instead of --ticks (and --symbols, --ts): a "
                     "Binance capture folder, 'orderbook.csv,message.csv' (LOBSTER), a Databento "
                     "MBP-10 .dbn[.zst], or a Tardis book CSV[.gz][,trades.csv]")
    c.add_argument("--symbols", help=".npy of each tick's symbol (windows are per symbol)")
    c.add_argument("--model", required=True,
                   help="model to calibrate (.fpm, .onnx, a LightGBM .txt or an XGBoost "
                        ".json / .ubj: these two are loaded natively and their parity with "
                        "the library's own predict printed)")
    c.add_argument("--out", required=True, help="bundle to write (.fpm)")
    c.add_argument("--head", action=_HeadOption, metavar=_HEAD_FORM,
                   help="the head that turns the model's outputs into signal and confidence "
                        "(Model.from_onnx(head=...), or with_head for a bundle): KIND one of "
                        "tanh_sigmoid, regression, classifier3, classifier2; OUTPUTS the "
                        "indices it reads, e.g. classifier3:2,1,0 or regression:1; SCALE a "
                        "regression head's scale (not here: calibrate fits it)")
    c.add_argument("--z-fields", help="raw fields to z-score, e.g. '0-111', or 'none' "
                   "(default: the first n_in - 2 x window fields)")
    c.add_argument("--window-fields", help="raw fields with rolling mean/std, e.g. '40,60,61', "
                   "or 'none' (default: fastpath.lob.WINDOW_FIELDS for 256-wide ticks, else "
                   "none)")
    c.add_argument("--features", choices=("zscore", "raw"),
                   help="what the model was trained on: zscore (each feature's mean and std "
                        "fitted here, the default for an MLP) or raw (the fields, and their "
                        "rolling mean / std, as they are); a tree ensemble or a model with its "
                        "own input scaler must say which")
    c.add_argument("--window", type=_int_in(1, 65536), default=32,
                   help="ticks in the rolling window (1..65536)")
    c.add_argument("--max-error", type=_max_error, metavar="E",
                   help="fit the cache policy by shadow replay of the ticks: the loosest policy "
                        "whose every hit is within E of the fresh signal (without it the "
                        "bundle's cache is off)")
    c.add_argument("--holdout", type=_holdout, default=None, metavar="F",
                   help="with --max-error: the last F of the ticks (default 0.25) are held out "
                        "of the choice and must keep the budget too (0: fit on every tick, "
                        "checked on none)")
    c.add_argument("--weights", choices=("fp32", "bf16", "int8"),
                   help="hidden-layer weights the bundle runs with; the signal error against "
                        "fp32 weights is measured on the ticks and printed (before "
                        "any cache-policy fit, which is then fitted to these weights)")
    c.add_argument("--ts", help=".npy of each tick's int64 ns timestamp, for the cache age guard "
                   "in the fit (default: ticks 1 ms apart)")
    s = sub.add_parser("serve", help="serve one pinned engine to other processes over shared "
                       "memory (fastpath.connect), in the foreground until SIGINT/SIGTERM")
    s.add_argument("--name", required=True, help="the name clients connect to")
    s.add_argument("--config", help="TOML config ([serve], [placement], [engine], ...)")
    s.add_argument("--model", help="model (.fpm or .onnx; default: the demo model)")
    s.add_argument("--head", action=_HeadOption, metavar=_HEAD_FORM,
                   help="the head that turns the model's outputs into signal and confidence "
                        "(Model.from_onnx(head=...), or with_head for a bundle): KIND one of "
                        "tanh_sigmoid, regression, classifier3, classifier2; OUTPUTS the "
                        "indices it reads, e.g. classifier3:2,1,0 or regression:1; SCALE a "
                        "regression head's scale (default 1; calibrate fits one)")
    s.add_argument("--tick-size", action="append", metavar="[SYMBOL=]TICK",
                   help="tick size of the live book that book update requests step: one TICK "
                        "for every symbol, or SYMBOL=TICK, repeated (fastpath.serve's "
                        "tick_sizes); a book update for a symbol without one is refused")
    s.add_argument("--stats", action="store_true", help="print throughput, queue depth and "
                   "per-stage latency percentiles every second")
    args = ap.parse_args(argv)
    return _guarded(args.cmd, {"info": cmd_info, "calibrate": cmd_calibrate,
                               "doctor": cmd_doctor, "example-config": cmd_example_config,
                               "serve": cmd_serve}[args.cmd], args)


def _guarded(cmd: str, fn, args) -> int:
    """fn(args), its failures said as `fastpath CMD: ...` with the exit codes README gives:
    2 for bad input, 130 for Ctrl-C."""
    try:
        return fn(args)
    except FastpathError as exc:
        print(f"fastpath {cmd}: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # the reader went away (`fastpath doctor --json | head`): not bad input, nothing to
        # say; stdout is pointed at /dev/null so the exit's flush does not raise it again
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 1
    except OSError as exc:
        print(f"fastpath {cmd}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # Ctrl-C: the user's stop, not a fault to show a traceback for
        print(f"fastpath {cmd}: interrupted", file=sys.stderr)
        return 130
    except MemoryError as exc:
        # an engine the host has no room for (control.memory.allocate says how much): the
        # config asks too much of this host, said as such, not a traceback
        print(f"fastpath {cmd}: {exc or 'out of memory'}", file=sys.stderr)
        return 2
    except SystemExit as exc:
        # a command's own check of its input files (calibrate's .npy checks) raises
        # SystemExit(message), which exits 1; argparse exits 2 on a bad option and a model or
        # config error returns 2 above: one code for "bad input", whichever check found it
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
