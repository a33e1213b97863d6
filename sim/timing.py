"""Timing: the cycle cost of each instruction and the event loop over the three engine queues.

The model (docs/simulator.md, "How cycles are counted", is the definition):

* Instructions of an entry are dispatched in program order into three in-order queues (LD, EX,
  ST) by their engine; dispatch stops after the first ``halt``.
* At each step, among the queue heads whose awaited tokens are all available, the one with the
  earliest issue time issues (ties: LD, EX, ST).  issue = max(engine free, push time of each
  awaited token, and for DMA the DRAM channel free time).  It executes functionally at that
  moment, so a missing dependency token shows up as wrong data, as on hardware.
* Tokens are counting semaphores per ordered engine pair holding their push times (FIFO); a
  token is pushed when the signalling instruction and every earlier instruction of its engine
  have completed (a signal releases all its engine did before it).
* DMA (load, store, gather): transfer = ceil(bytes / dram_bytes_per_cycle); the channel and the
  engine are busy for the transfer; completion = issue + transfer + dram_latency_cycles.
* matmul (``matmul_cost``; ``matmul_w4a16_cost`` with the codes' packed bytes as B): busy =
  max(MAC passes over the rows actually present, B bytes / weight_bytes_per_cycle);
  completion = issue + busy + stream_latency (m <= stream_max_rows,
  the weight-streaming path) or + pipeline_latency (the array's fill and drain).  Vector ops:
  busy = ceil(elements / lanes[in_dtype]), completion = issue + busy + latency (special
  functions use sfu_lanes; vsel and vtopk use their dtype, transpose the unsigned type of its
  element size); vtopk makes topk_k passes over the row (a selection network).  setr, salu,
  setq, nop, halt: 1 cycle.
* Every live ISA spec names its cost function here (``InstrSpec.cost``); ``COSTS`` maps each
  mnemonic to it, resolved at import.  An instruction whose row count comes from a register is
  costed for the rows it actually processes, when it executes (``execute.compile_extent``).
* The EX engine is pipelined: it is free again after ``busy``; the next instruction waits for
  an earlier one's completion only when it reads or writes SRAM that one writes (the
  scoreboard, ``ex_dependencies``), so latency is paid along dependency chains.
* Cycles of the run = the latest completion.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any, NamedTuple

from mcpc.arch.isa import ENGINES, EX, SFU_FUNCS, Instr, resolve, vattn_heat_offset
from mcpc.arch.numerics import NUMPY_DTYPES

from .decode import Decoded
from .machine import PACKED, Fault, Machine, nbytes

_TRANSPOSE_LANES = {1: "i8", 2: "f16", 4: "f32", 8: "i64"}


class Cost(NamedTuple):
    """Static cost of one instruction: engine-busy cycles, extra cycles until completion, traffic."""

    busy: int
    tail: int
    macs: int
    dram_read: int
    dram_write: int


def _elem_bytes(dtype: str, count: int) -> int:
    """Bytes of ``count`` elements of ``dtype`` (4-bit types packed two per byte)."""
    return nbytes(dtype, count) if dtype in NUMPY_DTYPES else count


def dma_cost(i: Instr | Decoded, target: Any) -> Cost:
    """load/store/gather/scatter: the channel streams the bytes, the DRAM latency follows the
    transfer.  A gather or scatter moves the rows of its (run-time) count, not of its table."""
    indexed = i.op in ("gather", "scatter")
    nbytes_ = (i.count if indexed else i.rows) * i.row_bytes
    transfer = math.ceil(nbytes_ / target.dram_bytes_per_cycle)
    rd, wr = (0, nbytes_) if i.op in ("store", "scatter") else (nbytes_, 0)
    return Cost(transfer, target.dram_latency_cycles, 0, rd, wr)


def matmul_cost(i: Instr | Decoded, target: Any) -> Cost:
    """matmul on the array_rows x array_cols engine (docs/timing.md is the reasoning).

    * MAC passes: with m >= array_rows, ceil(m/rows) row passes of k steps per column tile (the
      old whole-array charge); with fewer rows present, the unused rows take other slices of K
      (folded: floor(rows/m) slices side by side), so a pass takes ceil(k / floor(rows/m)) steps.
      A step lasts rows*cols/macs_per_cycle[in_dtype] cycles.
    * Weight ingestion: each row pass reads B once, at most weight_bytes_per_cycle bytes per
      cycle (4-bit weights packed two per byte).
    * busy = max(MAC passes, weight ingestion); tail = stream_latency when m <= stream_max_rows
      (the weight-streaming path), else pipeline_latency (the array's fill and drain).
    """
    return _array_cost(i.m, i.n, i.k, i.in_dtype, _elem_bytes(i.in_dtype, i.k * i.n), target)


def matmul_w4a16_cost(i: Instr | Decoded, target: Any) -> Cost:
    """matmul_w4a16: ``matmul_cost`` at the MAC rate of the activations' dtype, the array ingesting
    the weight codes' bytes (packed for 4-bit): the bytes that stream, not the dequantized weights.
    The scales and zero points feed the dequantizer beside the array (read through the QParam
    pointers, a run-time value): their DRAM bytes are counted by the loads that bring them."""
    return _array_cost(i.m, i.n, i.k, i.in_dtype, _elem_bytes(i.w_dtype, i.k * i.n), target)


_RATE_DTYPE = {"u8": "i8", "u4": "i4"}  # unsigned codes multiply at their signed width's rate


def qa_cost(i: Instr | Decoded, target: Any) -> Cost:
    """vmmul.q4f8 / matmul_i8: ``matmul_cost`` at the slower MAC rate of the activation codes and
    the weight codes, the array ingesting the codes' bytes (int4 packed, int8 and fp8 one byte)."""
    rates = target.mac.macs_per_cycle
    q, w = (_RATE_DTYPE.get(d, d) for d in (i.q_dtype, i.w_dtype))
    if q not in rates or w not in rates:
        return Cost(1, 0, 0, 0, 0)
    slower = q if rates[q] <= rates[w] else w
    return _array_cost(i.m, i.n, i.k, slower, _elem_bytes(i.w_dtype, i.k * i.n), target)


def _array_cost(m: int, n: int, k: int, in_dtype: str, b_bytes: float, target: Any) -> Cost:
    mac = target.mac
    rate = mac.macs_per_cycle.get(in_dtype)
    if rate is None:  # traps when executed (execute.compile_instr); cost is irrelevant
        return Cost(1, 0, 0, 0, 0)
    if m == 0 or n == 0 or k == 0:
        return Cost(1, 0, 0, 0, 0)
    rows, cols = mac.array_rows, mac.array_cols
    passes = math.ceil(m / rows)
    steps = k if m >= rows else math.ceil(k / (rows // m))
    compute = passes * math.ceil(n / cols) * steps * rows * cols / rate
    ingest = passes * b_bytes / mac.weight_bytes_per_cycle
    busy = max(1, math.ceil(max(compute, ingest)))
    tail = mac.stream_latency if m <= mac.stream_max_rows else mac.pipeline_latency
    return Cost(busy, tail, m * n * k, 0, 0)


def vattn_cost(i: Instr | Decoded, target: Any) -> Cost:
    """vattn before it executes: the cost of empty windows.  Its real cost follows the window
    lengths it reads (``attention_cost``, charged at execution like a run-time extent)."""
    return Cost(1, 0, 0, 0, 0)


def attention_cost(
    lens: Any, share: int, d: int, in_dtype: str, kv_dtype: str, target: Any, heat_rows: int | None = None
) -> Cost:
    """Cycles of ``vattn`` over windows of lengths ``lens`` (one per table entry, ``share`` query
    rows each) of ``d``-element rows (docs/timing.md, "Attention over run-time windows").

    For each entry of length L: the array products S = Q·Kᵀ (share x L x d) and O = P·V
    (share x d x L) as ``matmul_cost`` charges them (rows present, K and V ingested once for the
    rows sharing them) at the slower MAC rate of the two dtypes; then exp of share·ΣL scores on
    the SFU lanes and four f32 vector passes over them (scale, max, subtract, sum and divide).
    The engine does them back to back (busy = their sum); tail = the array's short latency plus
    the vector pipeline's.  Nothing is charged for the K/V capacity beyond the windows.

    ``heat_rows`` (the K/V rows in use, when the instruction writes its heat table): two more f32
    vector passes, zeroing the share x heat_rows table and accumulating the share·ΣL probabilities."""
    mac, vec = target.mac, target.vector
    lens = [int(x) for x in lens if x > 0]
    heat = 0 if heat_rows is None or share <= 0 else share * int(heat_rows)
    if not lens or share <= 0 or d <= 0:
        return Cost(1 + math.ceil(heat / target.vector_lanes_for("f32")), 0, 0, 0, 0)
    rates = mac.macs_per_cycle
    dt = in_dtype if rates.get(in_dtype, 0) <= rates.get(kv_dtype, 0) else kv_dtype
    kvb = _elem_bytes(kv_dtype, d)
    array = 0
    for n_len, times in _counts(lens):
        qk = _array_cost(share, n_len, d, dt, n_len * kvb, target).busy
        pv = _array_cost(share, d, n_len, dt, n_len * kvb, target).busy
        array += times * (qk + pv)
    scores = share * sum(lens)
    f32_passes = 4 * scores + (0 if heat_rows is None else heat + scores)
    busy = array + math.ceil(scores / vec.sfu_lanes) + math.ceil(f32_passes / target.vector_lanes_for("f32"))
    tail = (mac.stream_latency if share <= mac.stream_max_rows else mac.pipeline_latency) + vec.latency
    return Cost(busy, tail, 2 * scores * d, 0, 0)


def kvdecomp_cost(i: Instr | Decoded, target: Any) -> Cost:
    """kvdecomp before it executes: no block.  Its real cost follows the descriptors it reads
    (``kvdecomp_data_cost``, charged at execution like a run-time extent)."""
    return Cost(1, 0, 0, 0, 0)


def kvdecomp_data_cost(row_bytes: int, d: int, desc: Any, kv_dtype: str, target: Any) -> Cost:
    """Cycles of ``kvdecomp`` over the blocks whose descriptors ``desc`` ([C, 4] u32) it read
    (docs/timing.md, "Compressed KV blocks"): the DRAM channel streams 16 bytes per descriptor plus
    each block's bytes (its ``nbytes`` when compressed, ``row_bytes`` when plain); the decoder then
    writes every element of each compressed block's full row (row_bytes / size(kv_dtype)) at the
    vector engine's ``kv_dtype`` lanes, as ``vdequant`` would.  busy = transfer + decode (the
    decoder consumes what the channel brought; the LD engine and the channel are held for both);
    tail = the DRAM latency (the decoder's pipeline depth is taken as hidden in it: an assumption)."""
    n = len(desc)
    if n == 0:
        return Cost(1, 0, 0, 0, 0)
    compressed = [int(w[2]) for w in desc if int(w[3]) & 0xFF]
    nbytes_ = 16 * n + sum(compressed) + (n - len(compressed)) * row_bytes
    transfer = math.ceil(nbytes_ / target.dram_bytes_per_cycle)
    elements = len(compressed) * (row_bytes // max(_elem_bytes(kv_dtype, 1), 1))
    decode = math.ceil(elements / target.vector_lanes_for(kv_dtype)) if elements else 0
    return Cost(max(1, transfer + decode), target.dram_latency_cycles, 0, nbytes_, 0)


def kvcomp_cost(i: Instr | Decoded, target: Any) -> Cost:
    """kvcomp before it executes.  Its real cost follows the bytes it stores (``kvcomp_data_cost``,
    charged at execution)."""
    return Cost(1, 0, 0, 0, 0)


def kvcomp_data_cost(i: Any, sizes: list[int], rewritten: list[int], target: Any) -> Cost:
    """Cycles of one ``kvcomp`` that stored ``sizes[h]`` bytes for head h and wrote ``rewritten[h]``
    rows back into the plain view (docs/timing.md, "Compressed KV blocks").  Per head the DRAM
    channel reads the descriptor (16 bytes), the slot's earlier rows and the new rows (tokens rows
    in all), and the token mask (8 bytes, ``heavy_hitter``); it writes the descriptor, the new
    unrounded rows (a block being filled) or the stored bytes (a full one), and the rows written
    back.  The vector engine makes f32 passes over the tokens x head_dim values: 4 for INT8 (range,
    quantize, dequantize, error), 3 for a magnitude top-k (``topk_magnitude``/``topk_entropy``: a
    two-pass radix select on 16-bit keys and the mask: an assumption), 1 to pack the tiles; the
    CRC-8 is computed on the write stream (no cycles: an assumption).  busy = transfer + passes
    (the unit compresses what the channel brought, then writes: not overlapped); tail = the DRAM
    latency."""
    esize = NUMPY_DTYPES[i.kv_dtype].itemsize
    d = i.row_bytes // (64 * esize)
    row = d * esize
    full, n, lo = bool(i.full), i.tokens, i.lo
    read = write = 0
    for size, back in zip(sizes, rewritten, strict=True):
        read += 16 + n * row + (8 if full and i.policy == 3 else 0)
        write += 16 + back * row + (size if full else (n - lo) * row)
    passes = 1 + 4 * bool(i.quant) + 3 * (full and i.policy in (1, 2))
    work = math.ceil(passes * i.heads * n * d / target.vector_lanes_for("f32"))
    transfer = math.ceil((read + write) / target.dram_bytes_per_cycle)
    return Cost(max(1, transfer + work), target.dram_latency_cycles, 0, read, write)


def _counts(values: list[int]) -> list[tuple[int, int]]:
    out: dict[int, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return list(out.items())


def vector_cost(i: Instr | Decoded, target: Any) -> Cost:
    """Vector ops: ceil(elements / lanes) issue cycles, then the vector pipeline's latency."""
    op, vec = i.op, target.vector
    if op == "vun" and i.func in SFU_FUNCS:
        lanes = vec.sfu_lanes
    elif op in ("vsel", "vtopk"):
        lanes = target.vector_lanes_for(i.dtype)
    elif op == "transpose":
        lanes = target.vector_lanes_for(_TRANSPOSE_LANES.get(i.elem_bytes, "i8"))
    elif op == "vdequant":  # computed in f32, written as out_dtype
        lanes = target.vector_lanes_for(i.out_dtype)
    else:
        lanes = target.vector_lanes_for(i.in_dtype)
    passes = max(i.topk_k, 1) if op == "vtopk" else 1  # vtopk: a selection network, k passes
    return Cost(max(1, passes * math.ceil(i.rows * i.cols / lanes)), vec.latency, 0, 0, 0)


def scalar_cost(i: Instr | Decoded, target: Any) -> Cost:
    """setr, salu, setq, nop, halt: one cycle."""
    return Cost(1, 0, 0, 0, 0)


def instr_cost(i: Instr | Decoded, target: Any) -> Cost:
    """Cycles and traffic of one instruction on ``target`` (see the module docstring)."""
    return COSTS[i.op](i, target)


# Every live mnemonic -> the cost function its spec names (RuntimeError at import if one is missing).
COSTS = resolve("cost", globals())


# -- SRAM regions and the EX scoreboard ------------------------------------------------------------
# A region is (addr, rows, width, stride) in bytes: rows of `width` bytes `stride` apart; a
# contiguous or one-row operand is normalised to rows == 1.
Region = tuple[int, int, int, int]


def _region(addr: int, rows: int, cols: int, stride: int, bcast: int, dtype: str) -> Region | None:
    if rows <= 0 or cols <= 0:
        return None
    width = _elem_bytes(dtype, 1 if bcast else cols)
    step = stride // 2 if dtype in PACKED else _elem_bytes(dtype, stride)
    return _raw_region(addr, rows, width, step)


def _raw_region(addr: int, rows: int, width: int, step: int) -> Region | None:
    if rows <= 0 or width <= 0:
        return None
    if rows == 1 or step == 0:
        return (addr, 1, width, 0)
    if step <= width:  # rows touch or overlap: one interval
        return (addr, 1, (rows - 1) * step + width, 0)
    return (addr, rows, width, step)


def sram_regions(i: Instr | Decoded) -> tuple[tuple[Region, ...], tuple[Region, ...]]:
    """(reads, writes): the SRAM regions an EX instruction reads and writes (empty for others)."""
    op = i.op
    if op in ("matmul", "matmul_w4a16", "vmmul.q4f8", "matmul_i8"):
        dt = i.in_dtype
        a = _region(i.a, i.m, i.k, i.a_stride, 0, dt)
        b_rows, b_cols = (i.n, i.k) if i.trans_b else (i.k, i.n)
        b = _region(i.b, b_rows, b_cols, i.b_stride, 0, dt if op == "matmul" else i.w_dtype)
        c = _region(i.c, i.m, i.n, i.c_stride, 0, "f32")
        reads, writes = [a, b, c if i.acc else None], [c]
    elif op in ("vbin", "vbini"):
        reads = [_region(i.src0, i.rows, i.cols, i.s0_stride, i.s0_bcast, i.in_dtype)]
        if op == "vbin":
            reads.append(_region(i.src1, i.rows, i.cols, i.s1_stride, i.s1_bcast, i.in_dtype))
        writes = [_region(i.dst, i.rows, i.cols, i.dst_stride, 0, i.out_dtype)]
    elif op == "vdequant":
        reads = [_region(i.src, i.rows, i.cols, i.src_stride, 0, i.in_dtype)]
        writes = [_region(i.dst, i.rows, i.cols, i.dst_stride, 0, i.out_dtype)]
    elif op == "vun":
        reads = [_region(i.src, i.rows, i.cols, i.src_stride, i.src_bcast, i.in_dtype)]
        writes = [_region(i.dst, i.rows, i.cols, i.dst_stride, 0, i.out_dtype)]
    elif op == "vred":
        reads = [_region(i.src, i.rows, i.cols, i.src_stride, 0, i.in_dtype)]
        writes = [_region(i.dst, 1, i.rows, 0, 0, i.out_dtype)] if i.cols else []
    elif op == "vsel":
        dst = _region(i.dst, i.rows, i.cols, i.dst_stride, 0, i.dtype)
        cond_w = 1 if i.cond_bcast else i.cols
        reads = [_raw_region(i.cond, i.rows, cond_w, i.cond_stride) if i.cols else None, dst]
        reads.append(_region(i.src, i.rows, i.cols, i.src_stride, i.src_bcast, i.dtype))
        writes = [dst]
    elif op == "vtopk":
        reads = [_region(i.src, i.rows, i.cols, i.src_stride, 0, i.dtype)]
        writes = [_region(i.dst, i.rows, i.topk_k, i.dst_stride, 0, i.dtype)]
        writes.append(_region(i.idx, i.rows, i.topk_k, i.idx_stride, 0, "i32"))
    elif op == "vattn":
        rows, d, n, entries = i.rows, i.head_dim, i.kv_rows, i.rows // max(i.share, 1)
        reads = [_region(i.src, rows, d, d, 0, i.in_dtype), _region(i.kv, 2 * n, d, d, 0, i.kv_dtype)]
        reads.append(_raw_region(i.win, 1, 8 * entries, 0))
        writes = [_region(i.dst, rows, d, d, 0, i.in_dtype)]
        if i.heat:
            share = max(i.share, 1)
            writes.append(_region(i.dst + vattn_heat_offset(rows, d, i.in_dtype), n, share, share, 0, "f32"))
    elif op == "transpose":
        eb = i.elem_bytes
        reads = [_raw_region(i.src, i.rows, i.cols * eb, i.src_stride * eb) if i.cols else None]
        writes = [_raw_region(i.dst, i.cols, i.rows * eb, i.dst_stride * eb) if i.rows else None]
    else:
        return (), ()
    return tuple(r for r in reads if r), tuple(w for w in writes if w)


def _end(r: Region) -> int:
    return r[0] + (r[1] - 1) * r[3] + r[2]


def _row_hits(s0: int, s1: int, t: Region) -> bool:
    """Does the interval [s0, s1) meet a row of the strided region ``t``?"""
    addr, rows, width, step = t
    lo = max(0, (s0 - width - addr) // step + 1)
    hi = min(rows - 1, -(-(s1 - addr) // step) - 1)
    return lo <= hi


def overlaps(a: Region, b: Region) -> bool:
    """Whether two regions share a byte (exact for one-row and equal-stride regions, and when one
    side has at most 64 rows; otherwise the bounding intervals decide, which can only add a wait)."""
    if a[0] >= _end(b) or b[0] >= _end(a):
        return False
    if a[1] == 1:
        return b[1] == 1 or _row_hits(a[0], a[0] + a[2], b)
    if b[1] == 1:
        return _row_hits(b[0], b[0] + b[2], a)
    if a[3] == b[3]:
        s, d = a[3], b[0] - a[0]
        lo = max(-(b[1] - 1), (d - a[2]) // s + 1)
        hi = min(a[1] - 1, -(-(d + b[2]) // s) - 1)
        return lo <= hi
    if a[1] > b[1]:
        a, b = b, a
    if a[1] <= 64:
        return any(_row_hits(a[0] + r * a[3], a[0] + r * a[3] + a[2], b) for r in range(a[1]))
    return True


def _any_overlap(xs: tuple[Region, ...], ys: tuple[Region, ...]) -> bool:
    return any(overlaps(x, y) for x in xs for y in ys)


def ex_dependencies(instrs: list, costs: list[Cost]) -> list[tuple[tuple[int, int], ...]]:
    """The EX scoreboard, precomputed: for each instruction, ``((j, slack), ...)`` meaning it may
    not issue before ``done[j] - slack`` (earlier EX instructions ``j`` still in flight).

    ``instrs[idx]`` is an instruction (or None for a word that did not decode), ``costs[idx]`` its
    Cost.  An EX instruction waits for the completion of every earlier EX instruction that writes
    SRAM it reads (read after write: slack 0) or writes (write after write: its own write must land
    later, slack = its tail).  An accumulating matmul whose only such dependency is the previous
    matmul's output tile (same region) takes the partial sums at the array's output in issue order
    (accumulator forwarding: slack = its tail).  Write after read needs no wait: operands are read
    while the instruction occupies the engine, results land at completion, and the engine is in
    order.  An earlier instruction is checked only while it can still be in flight, i.e. while the
    busy cycles issued after it are fewer than its tail.
    """
    n = len(instrs)
    deps: list[tuple[tuple[int, int], ...]] = [()] * n
    # one list per distinct tail value: (cum_busy_before, idx, busy, tail, reads, writes, whi, wlo)
    recent: dict[int, list] = {}
    cum = 0
    for idx in range(n):
        ins = instrs[idx]
        if ins is None or ins.engine != EX:
            continue
        busy, tail = costs[idx].busy, costs[idx].tail
        reads, writes = sram_regions(ins)
        if reads or writes:
            found = []
            rlo = min((r[0] for r in reads + writes), default=0)
            rhi = max((_end(r) for r in reads + writes), default=0)
            for t, lst in recent.items():
                drop = 0
                for e in lst:
                    if cum - e[0] - e[2] >= t:  # issued long enough ago: surely complete
                        drop += 1
                        continue
                    if e[7] >= rhi or rlo >= e[6]:
                        continue
                    raw = _any_overlap(reads, e[5])
                    if raw and ins.op == "matmul" and ins.acc and instrs[e[1]].op == "matmul":
                        c = reads[-1]
                        if e[5] == (c,) and not _any_overlap(reads[:-1], e[5]):
                            raw = False  # accumulator forwarding
                            found.append((e[1], tail))
                            continue
                    if raw:
                        found.append((e[1], 0))
                    elif _any_overlap(writes, e[5]):
                        found.append((e[1], tail))
                if drop:
                    del lst[:drop]
            deps[idx] = tuple(found)
        if writes and tail > 0:
            wlo = min(w[0] for w in writes)
            whi = max(_end(w) for w in writes)
            recent.setdefault(tail, []).append((cum, idx, busy, tail, reads, writes, whi, wlo))
        cum += busy
    return deps


class Deadlock(Exception):
    """No queue head can issue although some queues are not empty; ``blocked`` are instruction indices."""

    def __init__(self, blocked: list[tuple[int, list[int]]]):
        super().__init__("deadlock")
        self.blocked = blocked  # (instruction index, engines it waits on without a token)


class Faulted(Exception):
    """An instruction trapped; ``index`` is its position in the program, ``message`` the reason."""

    def __init__(self, index: int, message: str):
        super().__init__(message)
        self.index, self.message = index, message


# Record layout (tuples are the fastest thing to unpack in the loop):
#   (engine, waits, signals, handler, args, busy, tail, is_dma, deps)
# deps: ((j, slack), ...) from ex_dependencies: issue no earlier than done[j] - slack.
REC_ENGINE, REC_WAITS, REC_SIGNALS, REC_FN, REC_ARGS, REC_BUSY, REC_TAIL, REC_DMA, REC_DEPS = range(9)
_ILLEGAL_PY = (ValueError, TypeError, ArithmeticError, IndexError)


def simulate(
    recs: list[tuple],
    order: range,
    machine: Machine,
    max_cycles: int | None = None,
    executed: list[int] | None = None,
) -> tuple[list, list, list, dict]:
    """Run instructions ``order`` (global indices into ``recs``) through the three queues.

    ``max_cycles`` bounds a runaway program: the first instruction that would issue after that
    cycle raises Faulted instead of executing.

    Returns ``(issue, done, stall, tokens_left)``: per-instruction issue and completion cycle
    (lists indexed by position in ``order``), per-engine stall cycles, and the tokens still
    pending at the end (``{"EX->LD": 1}``; empty when the program balances them, as it should).
    ``executed``, when given, receives the instruction indices in the order they executed.
    Raises Faulted or Deadlock.
    """
    base = order.start
    queues: list[list[int]] = [[], [], []]
    for idx in order:
        queues[recs[idx][REC_ENGINE]].append(idx)
    n = len(order)
    issue = [0] * n
    done = [0] * n
    free = [0, 0, 0]
    last = [0, 0, 0]  # latest completion per engine so far
    stall = [0, 0, 0]
    pos = [0, 0, 0]
    lens = [len(q) for q in queues]
    tokens = [[deque(), deque(), deque()] for _ in range(3)]  # tokens[src][dst]: push times
    chan = 0  # DRAM channel free time
    engines = (0, 1, 2)
    while True:
        best = -1
        best_t = 0
        for e in engines:
            p = pos[e]
            if p == lens[e]:
                continue
            r = recs[queues[e][p]]
            t = free[e]
            for src in r[1]:
                q = tokens[src][e]
                if not q:
                    break
                if q[0] > t:
                    t = q[0]
            else:
                for j, slack in r[8]:
                    if j >= base and done[j - base] - slack > t:
                        t = done[j - base] - slack
                if r[7] and chan > t:
                    t = chan
                if best < 0 or t < best_t:
                    best, best_t = e, t
        if best < 0:
            if pos != lens:
                raise Deadlock(_blocked(recs, queues, pos, lens, tokens))
            left = {
                f"{ENGINES[a]}->{ENGINES[b]}": len(tokens[a][b])
                for a in range(3)
                for b in range(3)
                if tokens[a][b]
            }
            return issue, done, stall, left
        e = best
        idx = queues[e][pos[e]]
        r = recs[idx]
        if max_cycles is not None and best_t > max_cycles:
            limit = f"cycle limit reached: would issue at cycle {best_t} > --max-cycles {max_cycles}"
            raise Faulted(idx, limit)
        for src in r[1]:
            tokens[src][e].popleft()
        try:
            r[3](machine, r[4])
        except Fault as exc:
            raise Faulted(idx, str(exc)) from None
        except _ILLEGAL_PY as exc:  # a field combination the kernels reject (e.g. int ** negative)
            raise Faulted(idx, f"illegal operation: {exc}") from None
        stall[e] += best_t - free[e]
        busy, tail = r[5], r[6]
        if busy < 0:  # a run-time extent: the cost of what it actually did (execute.compile_extent)
            busy, tail = r[4][-1][0][:2]
        end = best_t + busy
        free[e] = end
        if r[7]:
            chan = end
        end += tail
        issue[idx - base] = best_t
        done[idx - base] = end
        if end > last[e]:
            last[e] = end
        if executed is not None:
            executed.append(idx)
        for dst in r[2]:  # a signal releases everything its engine issued before it
            tokens[e][dst].append(last[e])
        pos[e] += 1


def _blocked(recs, queues, pos, lens, tokens) -> list[tuple[int, list[int]]]:
    out = []
    for e in range(3):
        if pos[e] < lens[e]:
            idx = queues[e][pos[e]]
            out.append((idx, [src for src in recs[idx][1] if not tokens[src][e]]))
    return out
