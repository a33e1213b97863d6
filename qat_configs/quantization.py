"""The ``quantization:`` section of a QAT config (schema v1, optional): weights, activations,
calibration, per-layer overrides and sensitivity-driven precision (the KV cache has its own
top-level section, qat_configs/kv_cache.py).

::

    quantization:
      weights: {bits: 4, group_size: 32, symmetric: true, scale_dtype: f16, algorithm: auto}
      activations: {dtype: i8, where: output_layer}      # f16 (the default): not quantized
      calibration: {method: ema, decay: 0.999, data: calib.npz}
      lm_head: {keep: true}                                # the default: the LM head stays 16-bit
      overrides:
        - {pattern: "*lm_head*", keep: true}               # this layer stays in the float build dtype
      sensitivity: {metric: rel_l2, thresholds: {int6: 2.0e-3, int8: 1.0e-2}}

Every key drives the build or is refused: ``needs_calibration`` names the key that needs
calibration data so the driver can refuse a build without it (exit 2).  The meaning of each key is in
docs/qat-config.md; the pass that reads this section is ``mcpc.passes.quantize_weights``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

ALGORITHMS = ("rtn", "mse", "awq", "gptq", "auto")
WEIGHT_BITS = (4, 6, 8)
ACTIVATION_DTYPES = ("f32", "f16", "bf16", "i8", "u8", "i4", "u4")
FLOAT_ACTIVATIONS = ("f32", "f16", "bf16")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WeightQuant(_Section):
    """How MatMul/Gemm weights are quantized: ``bits`` integer codes (4, 6 held in an 8-bit
    container clipped to the 6-bit range, or 8) in groups of ``group_size`` along the contracted
    (K) axis with one ``scale_dtype`` scale per group (and a zero point when not ``symmetric``), or
    ``format: f8e4m3fn`` (fp8 codes, symmetric).  ``algorithm`` picks the quantizer; ``auto`` is
    GPTQ when calibration data is given, else the data-free clipping search ``mse``."""

    format: Literal["int", "f8e4m3fn"] = "int"
    bits: int = 4
    group_size: int = Field(default=32, ge=0)
    symmetric: bool = True
    scale_dtype: Literal["f16", "f32"] = "f16"
    algorithm: Literal["rtn", "mse", "awq", "gptq", "auto"] = "auto"
    desc_act: bool = False
    rounding: Literal["half_even", "half_away"] = "half_even"

    @model_validator(mode="after")
    def _consistent(self) -> WeightQuant:
        if self.bits not in WEIGHT_BITS:
            raise ValueError(f"bits: expected one of {', '.join(map(str, WEIGHT_BITS))}, got {self.bits}")
        if self.format == "f8e4m3fn":
            if self.bits != 8 or not self.symmetric or self.algorithm not in ("rtn", "auto"):
                raise ValueError(
                    "format f8e4m3fn takes bits: 8, symmetric: true and algorithm rtn or auto "
                    f"(got bits {self.bits}, symmetric {self.symmetric}, algorithm {self.algorithm})"
                )
        if self.desc_act and self.algorithm not in ("gptq", "auto"):
            raise ValueError(f"desc_act is a GPTQ option; algorithm {self.algorithm} has no act-order")
        return self

    @property
    def code_dtype(self) -> str:
        """The IR dtype of the codes: i4/u4 (4 bits), i8/u8 (6 and 8 bits), f8e4m3fn."""
        if self.format == "f8e4m3fn":
            return "f8e4m3fn"
        width = 4 if self.bits == 4 else 8
        return f"{'i' if self.symmetric else 'u'}{width}"


class ActivationQuant(_Section):
    """Activation quantization: ``dtype`` a float type (not quantized, the default) or an integer
    type quantized with calibrated scales on the input of ``where``: ``output_layer`` (the last
    quantized matmul of the graph: a decoder's LM head, an encoder's last projection) or ``all``
    (every quantized matmul)."""

    dtype: Literal["f32", "f16", "bf16", "i8", "u8", "i4", "u4"] = "f16"
    where: Literal["none", "output_layer", "all"] = "none"
    symmetric: bool = False

    @model_validator(mode="after")
    def _consistent(self) -> ActivationQuant:
        quantized = self.dtype not in FLOAT_ACTIVATIONS
        if quantized and self.where == "none":
            raise ValueError(f"dtype {self.dtype} quantizes activations: say where (output_layer or all)")
        if not quantized and self.where != "none":
            raise ValueError(f"where: {self.where} needs an integer dtype (i8, u8, i4, u4), got {self.dtype}")
        return self

    @property
    def quantized(self) -> bool:
        return self.where != "none"


class Calibration(_Section):
    """How calibration statistics are gathered: activation ranges by ``method`` (``ema`` of
    min/max with ``decay``, ``minmax``, ``percentile``); ``data`` an .npz file or a directory of
    them, relative to the config file (``--calib`` overrides it); ``samples`` caps how many
    samples are used (all when omitted)."""

    method: Literal["ema", "minmax", "percentile"] = "ema"
    decay: float = Field(default=0.999, gt=0, lt=1)
    percentile: float = Field(default=99.99, gt=50, le=100)
    data: str | None = None
    samples: int | None = Field(default=None, ge=1)


class _LayerChange(_Section):
    """``keep: true`` leaves a layer unquantized (in the float build dtype); the other keys replace
    the ``weights`` settings for it."""

    keep: bool = False
    bits: int | None = None
    group_size: int | None = Field(default=None, ge=0)
    symmetric: bool | None = None
    scale_dtype: Literal["f16", "f32"] | None = None
    algorithm: Literal["rtn", "mse", "awq", "gptq", "auto"] | None = None
    desc_act: bool | None = None

    def changes(self) -> dict:
        """The ``weights`` keys this entry sets."""
        return {
            k: v
            for k, v in self.model_dump(exclude={"pattern", "keep"}).items()
            if v is not None and k in WeightQuant.model_fields
        }

    def apply(self, weights: WeightQuant) -> WeightQuant:
        """``weights`` with this entry's keys replaced (validated again)."""
        return WeightQuant.model_validate({**weights.model_dump(), **self.changes()})


class Override(_LayerChange):
    """Settings for the layers whose name matches ``pattern`` (fnmatch, against the MatMul/Gemm
    node name and the weight's initializer name): ``keep: true`` leaves the layer unquantized,
    the other keys replace the ``weights`` settings."""

    pattern: str = Field(min_length=1)


class LmHead(_LayerChange):
    """The LM head (found by graph structure, passes/quantize_weights.py ``lm_head_layers``): by
    default (``keep: true``) it stays in the float build dtype, as production W4A16 recipes leave
    it; ``keep: false`` quantizes it like the other layers, with any ``weights`` key replaced
    (e.g. ``{keep: false, bits: 8}``).  Overrides naming it still win."""

    keep: bool = True

    @model_validator(mode="after")
    def _keys_need_quantizing(self) -> LmHead:
        if self.keep and self.changes():
            raise ValueError(
                f"{', '.join(self.changes())} set how to quantize the LM head, but keep: true leaves it "
                "unquantized: add keep: false"
            )
        return self


class Thresholds(_Section):
    """Largest sensitivity a layer may have to be built INT6, INT8 (above: kept in float)."""

    int6: float = Field(ge=0)
    int8: float = Field(ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> Thresholds:
        if self.int6 > self.int8:
            raise ValueError(f"int6 ({self.int6}) must not exceed int8 ({self.int8})")
        return self


class Sensitivity(_Section):
    """Sensitivity-driven precision: each layer's sensitivity is the model output's error
    (``metric``: ``rel_l2`` = ‖y_q − y‖ / ‖y‖, ``cosine`` = 1 − cos) with that layer alone
    quantized to INT6, over ``samples`` calibration samples; ``thresholds`` assign INT6 / INT8 /
    float per layer (overrides still win)."""

    metric: Literal["rel_l2", "cosine"] = "rel_l2"
    thresholds: Thresholds
    samples: int = Field(default=8, ge=1)


class Quantization(_Section):
    """The whole ``quantization:`` section (see the module docstring)."""

    weights: WeightQuant = WeightQuant()
    activations: ActivationQuant = ActivationQuant()
    calibration: Calibration = Calibration()
    lm_head: LmHead = LmHead()
    overrides: list[Override] = []
    sensitivity: Sensitivity | None = None

    @model_validator(mode="after")
    def _overrides_valid(self) -> Quantization:
        try:
            self.lm_head.apply(self.weights)
        except ValidationError as exc:
            msg = exc.errors()[0]["msg"].removeprefix("Value error, ")
            raise ValueError(f"lm_head: {msg}") from None
        for i, o in enumerate(self.overrides):
            try:
                o.apply(self.weights)
            except ValueError as exc:
                first = str(exc).splitlines()
                raise ValueError(f"overrides[{i}] ({o.pattern!r}): {first[-1].strip()}") from None
        return self

    def needs_calibration(self) -> str | None:
        """The key (dotted path) that needs calibration data, or None when the section builds without."""
        if self.weights.algorithm in ("awq", "gptq"):
            return f"quantization.weights.algorithm: {self.weights.algorithm}"
        if not self.lm_head.keep and self.lm_head.algorithm in ("awq", "gptq"):
            return f"quantization.lm_head.algorithm: {self.lm_head.algorithm}"
        for i, o in enumerate(self.overrides):
            if o.algorithm in ("awq", "gptq"):
                return f"quantization.overrides[{i}].algorithm: {o.algorithm}"
        if self.activations.quantized:
            return f"quantization.activations.where: {self.activations.where}"
        if self.sensitivity is not None:
            return "quantization.sensitivity"
        return None
