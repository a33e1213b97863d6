"""Calibration data and what the quantization passes learn from it.

``load_calibration`` reads ``--calib FILE.npz`` (or a directory of ``*.npz`` files, concatenated in
name order): one array per model input, named like the input, the batch axis leading and holding
any number of samples, the other dims as compiled (``input_ids`` [256, 35] for a build of shape
[1, 35]).  The samples are cut into batches of the compiled batch size.

``run_collecting`` runs a function on those batches with the reference interpreter (the definition
of every op) and hands chosen intermediate values to a callback, which is how the quantizers see
each matmul's input activations and how sensitivity measures a layer's output error.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mcpc.arch import numerics as nx
from mcpc.errors import InputError
from mcpc.ir.core import Function
from mcpc.ir.interpreter import evaluate_op
from mcpc.ir.ops import MatMulOp


@dataclass(frozen=True)
class CalibrationData:
    """Calibration batches for one function: each a dict input name -> array of the argument's
    exact shape and dtype; ``source`` names the file(s) for messages and reports."""

    batches: tuple[dict[str, np.ndarray], ...]
    source: str

    @property
    def samples(self) -> int:
        """Samples in all batches (batch axis of the first input summed)."""
        return sum(next(iter(b.values())).shape[0] if b else 1 for b in self.batches)

    def limited(self, samples: int | None) -> CalibrationData:
        """The first batches holding at most ``samples`` samples (at least one batch)."""
        if samples is None:
            return self
        out, n = [], 0
        for b in self.batches:
            size = next(iter(b.values())).shape[0] if b else 1
            if out and n + size > samples:
                break
            out.append(b)
            n += size
        return CalibrationData(tuple(out), self.source)


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: cannot read calibration data: {exc}") from None


def load_calibration(path: str | Path, func: Function, samples: int | None = None) -> CalibrationData:
    """Read calibration arrays for ``func``'s arguments from an .npz file or a directory of them.

    Raises InputError naming the file and the input for a missing file, a missing or extra array,
    a shape that does not match the compiled one after the batch axis, fewer samples than one
    batch, or a dtype that cannot be converted without loss (integers to integers, floats to floats).
    """
    path = Path(path)
    if path.is_dir():
        files = sorted(path.glob("*.npz"))
        if not files:
            raise InputError(f"{path}: calibration directory holds no .npz files")
    elif path.is_file():
        files = [path]
    else:
        raise InputError(f"{path}: no such calibration file or directory")
    parts = [_read_npz(f) for f in files]
    arrays: dict[str, np.ndarray] = {}
    for f, part in zip(files, parts, strict=True):
        missing = [a.name for a in func.args if a.name not in part]
        extra = sorted(set(part) - set(func.arg_names))
        if missing or extra:
            said = []
            if missing:
                said.append(f"no array for input(s) {', '.join(map(repr, missing))}")
            if extra:
                said.append(f"array(s) {', '.join(map(repr, extra))} name no input")
            raise InputError(
                f"{f}: {'; '.join(said)} (calibration arrays are named like the model inputs: "
                f"{', '.join(map(repr, func.arg_names))})"
            )
        for arg in func.args:
            a = part[arg.name]
            want = arg.type.shape[1:] if arg.type.rank else ()
            if a.ndim != arg.type.rank or tuple(a.shape[1:]) != tuple(want):
                raise InputError(
                    f"{f}: calibration array '{arg.name}' has shape {list(a.shape)}; expected "
                    f"[samples, {', '.join(map(str, want))}] (the batch axis leading, then the compiled "
                    f"shape {list(arg.type.shape)} after its batch dim)"
                )
            npd = arg.type.dtype.np_dtype
            same_kind = (np.issubdtype(a.dtype, np.integer) and np.issubdtype(npd, np.integer)) or (
                np.issubdtype(a.dtype, np.floating) and np.issubdtype(npd, np.floating)
            )
            if a.dtype != npd and not (same_kind or (a.dtype == np.bool_ and npd == np.bool_)):
                raise InputError(f"{f}: calibration array '{arg.name}' is {a.dtype}, the input is {npd}")
            arrays[arg.name] = (
                a.astype(npd) if arg.name not in arrays else np.concatenate([arrays[arg.name], a.astype(npd)])
            )
    if not func.args:
        raise InputError(f"{path}: the function has no inputs to calibrate with")
    counts = {n: a.shape[0] for n, a in arrays.items()}
    if len(set(counts.values())) != 1:
        raise InputError(f"{path}: calibration arrays hold different sample counts: {counts}")
    total = next(iter(counts.values()))
    leading = {a.type.shape[0] for a in func.args if a.type.rank}
    if len(leading) > 1:
        raise InputError(
            f"{path}: the compiled inputs have different leading (batch) dims {sorted(leading)}; "
            "calibration cuts samples along one batch axis"
        )
    batch = leading.pop() if leading else 1
    if samples is not None:
        total = min(total, max(samples, batch))
    if total < batch:
        raise InputError(f"{path}: {total} calibration sample(s), fewer than one batch of {batch}")
    batches = tuple(
        {n: np.ascontiguousarray(a[i : i + batch]) for n, a in arrays.items()}
        for i in range(0, total - batch + 1, batch)
    )
    return CalibrationData(batches, ", ".join(str(f) for f in files))


def run_collecting(
    func: Function,
    inputs: dict[str, np.ndarray],
    watch: dict[int, Callable[[np.ndarray], None]] | None = None,
    replace: dict[int, np.ndarray] | None = None,
    fast_matmul: bool = False,
    start: int = 0,
    env: dict[int, np.ndarray] | None = None,
    keep: dict[int, np.ndarray] | None = None,
) -> list[np.ndarray]:
    """Run ``func`` on ``inputs`` with the reference interpreter; return its results.

    ``watch`` maps ``id(value)`` to a callback receiving that value once computed; ``replace`` maps
    ``id(value)`` to an array used instead of computing it (a weight swapped for its quantized
    reconstruction, for sensitivity).  Values no later op reads are dropped as the run goes.
    ``fast_matmul`` computes matmuls with numpy's f32 matmul instead of the interpreter's tiled
    accumulation order: statistics for calibration need the values, not their last bits.
    ``start`` and ``env`` resume a run at op ``start`` from the values ``env`` holds (id(value) ->
    array, e.g. a ``keep`` of an earlier run with some values replaced); ``keep``, when given, is
    filled with every value of the run (nothing is dropped).
    """
    watch = watch or {}
    replace = replace or {}
    last_use: dict[int, int] = {}
    for i, op in enumerate(func.ops):
        for v in op.operands:
            last_use[id(v)] = i
    if env is None:  # a fresh run: the arguments are values a watcher may want (a matmul reading an input)
        env = {id(a): inputs[a.name] for a in func.args}
        for a in func.args:
            if id(a) in watch:
                watch[id(a)](env[id(a)])
    else:
        env = dict(env)
    for i in range(start, len(func.ops)):
        op = func.ops[i]
        if op.IS_TERMINATOR:
            if keep is not None:
                keep.update(env)
            return [env[id(v)] for v in op.operands]
        if len(op.results) == 1 and id(op.result) in replace:
            results = [replace[id(op.result)]]
        elif fast_matmul and isinstance(op, MatMulOp):
            a, b = (env[id(v)] for v in op.operands)
            b = np.swapaxes(b, -1, -2) if op.attrs["trans_b"] else b
            y = np.matmul(a.astype(np.float32), b.astype(np.float32))
            results = [nx.cast(y, op.result.type.dtype.name)]
        else:
            results = evaluate_op(op, [env[id(v)] for v in op.operands])
        for r, arr in zip(op.results, results, strict=True):
            env[id(r)] = arr
            if id(r) in watch:
                watch[id(r)](arr)
        if keep is None:
            for v in op.operands:
                if last_use.get(id(v)) == i and not v.is_argument:
                    env.pop(id(v), None)
    raise InputError(f"func @{func.name} has no mcp.return")
