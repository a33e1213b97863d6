"""Program state: host-set scalar registers, scalar arithmetic on them, and load/store of a slice
of a module-level persistent buffer (a ``global``) at a run-time offset.

A module declares its state beside its functions (``Module.globals``, ``Module.host_regs``):

    global @kv : tensor<64x4xf32>            -- persistent, zero-initialised, kept from run to run
    host_reg @pos {max = 63, min = 0}        -- a signed 32-bit value the host sets per run

Scalars are rank-0 ``i32`` tensors.  Offsets count rows of the global's first axis.  What the ops
need from the module (that the global exists, the result's type, that every offset stays inside
the buffer for every register value the declarations allow) is checked by ``ir/state.py``, which
``Module.verify`` runs: an op alone cannot see the module's declarations, so ``infer_types`` of
the global ops only checks what it can see and the module check does the rest.
"""

from __future__ import annotations

from typing import ClassVar

from mcpc.ir.core import Attr, Operation
from mcpc.ir.dtypes import I32
from mcpc.ir.types import TensorType

SCALAR = TensorType((), I32)
# Functions of ``mcp.scalar``: the subset of the ``salu`` instruction's that computes values.
SCALAR_FUNCS = ("add", "sub", "mul", "min", "max")


def _check_scalar(t: TensorType, what: str) -> None:
    if t != SCALAR:
        raise ValueError(f"{what} must be a scalar tensor<i32>, got {t}")


class StateOp(Operation):
    """Base of the ops that read or write run state: never folded, never evaluated outside a run
    (``fold-constants`` skips them; the interpreter runs them against a state object)."""

    STATEFUL: ClassVar[bool] = True


class HostRegOp(StateOp):
    """``mcp.host_reg {name}``: the value the host set for the declared register ``name`` in this
    run (rank-0 ``i32``)."""

    name = "mcp.host_reg"
    NUM_OPERANDS = 0
    ATTRS = {"name": Attr("str", doc="a host register declared by the module")}

    @classmethod
    def infer_types(cls, operand_types, attrs):
        return [SCALAR]


class ScalarOp(Operation):
    """``mcp.scalar a[, b] {func, imm = 0}``: ``func(a, b + imm)`` (``func(a, imm)`` with one
    operand) on signed 32-bit scalars, wrapped to s32 — exactly the ``salu`` instruction.
    ``func`` is one of ``add sub mul min max``."""

    name = "mcp.scalar"
    NUM_OPERANDS = None
    ATTRS = {"func": Attr("str"), "imm": Attr("int", 0)}

    @classmethod
    def infer_types(cls, operand_types, attrs):
        if len(operand_types) not in (1, 2):
            raise ValueError(f"expects 1 or 2 operands, has {len(operand_types)}")
        for i, t in enumerate(operand_types):
            _check_scalar(t, f"operand #{i}")
        if attrs.get("func") not in SCALAR_FUNCS:
            raise ValueError(f"func {attrs.get('func')!r} is not one of {', '.join(SCALAR_FUNCS)}")
        if not -(1 << 31) <= int(attrs.get("imm", 0)) < 1 << 31:
            raise ValueError(f"imm {attrs['imm']} does not fit s32")
        return [SCALAR]


class GlobalLoadOp(StateOp):
    """``mcp.global_load offset {global}``: rows ``[offset, offset + n)`` of global ``global``,
    ``n`` being the result's first dim (the result has the global's dtype and trailing dims)."""

    name = "mcp.global_load"
    NUM_OPERANDS = 1
    ATTRS = {"global": Attr("str")}

    @classmethod
    def infer_types(cls, operand_types, attrs):
        raise ValueError("the result type of mcp.global_load comes from its global: give it explicitly")

    def verify(self) -> None:  # the result type is checked against the global by ir/state.py
        from mcpc.errors import VerifyError

        try:
            self._verify_schema()
            _check_scalar(self.operands[0].type, "the offset")
            if self.results[0].type.rank < 1:
                raise ValueError("the result must have rank >= 1 (rows of the global)")
        except (ValueError, TypeError, IndexError) as e:
            raise VerifyError(f"{self.describe()}: {e}") from None


class GlobalStoreOp(StateOp):
    """``mcp.global_store value, offset {global}``: writes ``value`` over rows
    ``[offset, offset + value.shape[0])`` of global ``global``.  No result; never removed by ``dce``."""

    name = "mcp.global_store"
    NUM_OPERANDS = 2
    NUM_RESULTS = 0
    HAS_SIDE_EFFECTS = True
    ATTRS = {"global": Attr("str")}

    @classmethod
    def infer_types(cls, operand_types, attrs):
        value, offset = operand_types
        if value.rank < 1:
            raise ValueError("the stored value must have rank >= 1 (rows of the global)")
        _check_scalar(offset, "the offset")
        return []
