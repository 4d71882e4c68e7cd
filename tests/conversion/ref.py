#!/usr/bin/python3
"""ref.py - the reference quantizer for refit's precision conversion.

Written with numpy, independently of dataplane/convert.c: fp16 uses numpy's
own float16 cast, bf16 rounds on integer views, e4m3 rounds by searching a
table of all 256 codes (not by bit manipulation).  The rules are in
docs/conversion.md.  Functions take and return numpy arrays of raw bits
(uint16 for bf16/fp16, uint8 for e4m3) or float32.

As a program: `ref.py TEST` runs the self-checks.
"""
import sys

import numpy as np

E4M3_MAX = np.float32(448.0)
AMAX_MIN = np.float32(1e-4)


def _e4m3_table():
    """Values of the 126 non-negative finite e4m3fn codes 0x00..0x7e."""
    vals = []
    for code in range(0x7f):
        e, m = code >> 3, code & 7
        if e == 0:
            vals.append(m * 2.0 ** -9)
        else:
            vals.append((1 + m / 8.0) * 2.0 ** (e - 7))
    return np.array(vals, dtype=np.float64)


E4M3_VALS = _e4m3_table()


def to_f32(bits, dtype):
    """Widen raw bits of dtype ('fp32', 'bf16', 'fp16') exactly to float32."""
    if dtype == "fp32":
        return np.asarray(bits).view(np.float32)
    if dtype == "bf16":
        return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
    if dtype == "fp16":
        return np.asarray(bits, dtype=np.uint16).view(np.float16).astype(np.float32)
    raise ValueError("unknown dtype %r" % dtype)


def f32_to_bf16(x):
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7fff + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(np.asarray(x, dtype=np.float32)), np.uint16(0x7fc0), r)


def f32_to_fp16(x):
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(over="ignore"):
        h = x.astype(np.float16).view(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7e00), h)


def f32_to_e4m3(q):
    """Round float32 quotients to e4m3 codes (nearest, ties to even, saturate)."""
    q = np.asarray(q, dtype=np.float32)
    a = np.abs(q.astype(np.float64))
    a_sat = np.minimum(np.where(np.isnan(a), 0.0, a), 448.0)
    hi = np.searchsorted(E4M3_VALS, a_sat, side="left")   # first value >= a
    hi = np.minimum(hi, len(E4M3_VALS) - 1)
    lo = np.maximum(hi - 1, 0)
    dlo = a_sat - E4M3_VALS[lo]
    dhi = E4M3_VALS[hi] - a_sat
    pick_hi = (dhi < dlo) | ((dhi == dlo) & (hi % 2 == 0))
    code = np.where(pick_hi, hi, lo).astype(np.uint8)
    code = np.where(E4M3_VALS[hi] == a_sat, hi.astype(np.uint8), code)
    sign = np.where(np.signbit(q), np.uint8(0x80), np.uint8(0))
    return np.where(np.isnan(q), np.uint8(0x7f), code | sign).astype(np.uint8)


def block_scale(xf):
    """scale_inv (float32) of one block of float32 values."""
    if xf.size == 0:
        amax = np.float32(0)
    else:
        amax = np.max(np.abs(xf))          # NaN propagates
    if not np.isnan(amax) and amax < AMAX_MIN:
        amax = AMAX_MIN
    return np.float32(np.float32(amax) / E4M3_MAX)


def quantize_e4m3(bits, dtype, block=None):
    """Whole-tensor quantization.  block: per-dim extents (trailing dims,
    leading dims get 1), or None for one scale per tensor.  Returns
    (uint8 codes of the tensor's shape, float32 scales of the grid's shape;
    a 0-d array for a tensor scale)."""
    xf = to_f32(bits, dtype)
    shape = xf.shape
    nd = len(shape)
    if block is None:
        s = block_scale(xf.reshape(-1))
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            q = f32_to_e4m3(xf / s)
        return q, np.array(s, dtype=np.float32)
    blk = [1] * (nd - len(block)) + list(block)
    grid = tuple(-(-shape[d] // blk[d]) for d in range(nd))
    q = np.zeros(shape, dtype=np.uint8)
    scales = np.zeros(grid, dtype=np.float32)
    for g in np.ndindex(*grid) if nd else [()]:
        sl = tuple(slice(g[d] * blk[d], min(shape[d], (g[d] + 1) * blk[d])) for d in range(nd))
        xb = xf[sl]
        s = block_scale(xb.reshape(-1))
        scales[g] = s
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            q[sl] = f32_to_e4m3(xb / s)
    return q, scales


def mx_scale(xf):
    """e8m0 byte of one block (OCP MX v1.0, FP8 E4M3: emax 8): X =
    floor(log2(amax)) - 8 clamped to [-127, 127], stored X + 127; 0xff for a
    block holding a NaN or an infinity.  Uses frexp, not the fp32 bits."""
    with np.errstate(invalid="ignore"):
        amax = np.max(np.abs(xf.astype(np.float64))) if xf.size else 0.0
    if np.isnan(amax) or np.isinf(amax):
        return 0xff
    if amax == 0:
        return 0
    _, e = np.frexp(amax)               # amax = m * 2^e, 0.5 <= m < 1
    x = int(e) - 1 - 8
    return min(127, max(-127, x)) + 127


def quantize_mx(bits, dtype, block):
    """MXFP8: e4m3 codes and uint8 e8m0 scales, blocks on the trailing dims."""
    xf = to_f32(bits, dtype)
    shape = xf.shape
    nd = len(shape)
    blk = [1] * (nd - len(block)) + list(block)
    grid = tuple(-(-shape[d] // blk[d]) for d in range(nd))
    q = np.zeros(shape, dtype=np.uint8)
    scales = np.zeros(grid, dtype=np.uint8)
    for g in np.ndindex(*grid):
        sl = tuple(slice(g[d] * blk[d], min(shape[d], (g[d] + 1) * blk[d])) for d in range(nd))
        b = mx_scale(xf[sl].reshape(-1))
        scales[g] = b
        div = np.float32(np.nan) if b == 0xff else np.float32(2.0 ** (b - 127))
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            q[sl] = f32_to_e4m3(xf[sl] / div)
    return q, scales


def convert(bits, src, dst, scale="none", block=None):
    """The whole conversion of a tensor given as raw bits: returns
    (destination bits, scales or None)."""
    if dst in ("bf16", "fp16"):
        xf = to_f32(bits, src)
        return (f32_to_bf16(xf) if dst == "bf16" else f32_to_fp16(xf)), None
    if dst == "fp8e4m3" and scale == "mx":
        return quantize_mx(bits, src, block or [32])
    if dst == "fp8e4m3":
        return quantize_e4m3(bits, src, None if scale == "tensor" else (block or [128, 128]))
    raise ValueError("unknown destination dtype %r" % dst)


def _selftest():
    f = lambda v: np.array(v, dtype=np.float32)
    fails = 0

    def eq(name, got, want):
        nonlocal fails
        got = [int(v) for v in np.asarray(got).reshape(-1)]
        if got != list(want):
            print("FAIL %s: got %s want %s" % (name, [hex(v) for v in got], [hex(v) for v in want]))
            fails += 1
    eq("bf16", f32_to_bf16(f([1.0, 1.00390625, 1.01171875, -2.0, np.inf, np.nan, 3.3895314e38, 3.4028235e38])),
       [0x3f80, 0x3f80, 0x3f82, 0xc000, 0x7f80, 0x7fc0, 0x7f7f, 0x7f80])
    eq("fp16", f32_to_fp16(f([1.0, 65504.0, 65520.0, 2.0 ** -24, 2.0 ** -25, np.nan])),
       [0x3c00, 0x7bff, 0x7c00, 0x0001, 0x0000, 0x7e00])
    eq("e4m3", f32_to_e4m3(f([0.0, -0.0, 448.0, 464.0, 500.0, -np.inf, np.nan, 2.0 ** -9,
                              2.0 ** -10, 3 * 2.0 ** -10, 1.0625, 1.1875, 2.0 ** -6])),
       [0x00, 0x80, 0x7e, 0x7e, 0x7e, 0xfe, 0x7f, 0x01, 0x00, 0x02, 0x38, 0x3a, 0x08])
    q, s = quantize_e4m3(f([0.0, -0.0, 0.0, 0.0]).view(np.uint32).reshape(2, 2), "fp32", [2, 2])
    eq("zero block scale", s.view(np.uint32), [0x346facad])
    eq("zero block q", q, [0x00, 0x80, 0x00, 0x00])
    print("%d passed, %d failed" % (6 - fails, fails))
    return 1 if fails else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "test":
        sys.exit(_selftest())
    print(__doc__)
