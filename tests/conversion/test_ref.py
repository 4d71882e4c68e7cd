#!/usr/bin/python3
"""test_ref.py - the C conversion (build/tests/cvt-tool) against the numpy
reference (ref.py), bit for bit: every bf16 and fp16 value into e4m3 (at
scale 1 and at random scales), random fp32 with special values into bf16,
fp16 and e4m3 with block and tensor scales, partial blocks.

    test_ref.py BUILD_DIR     ends with "N passed, N failed"
"""
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ref  # noqa: E402

BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
TOOL = os.path.join(BUILD, "tests", "cvt-tool")
passed = failed = 0
NP = {"fp32": np.uint32, "bf16": np.uint16, "fp16": np.uint16, "fp8e4m3": np.uint8}


def run_c(bits, src, dst, scale, block):
    args = [TOOL, src, dst, scale, ",".join(str(s) for s in bits.shape)]
    if block:
        args.append(",".join(str(b) for b in block))
    out = subprocess.run(args, input=bits.tobytes(), stdout=subprocess.PIPE, check=True,
                         timeout=120).stdout
    n = bits.size * np.dtype(NP[dst]).itemsize
    q = np.frombuffer(out[:n], dtype=NP[dst]).reshape(bits.shape)
    s = np.frombuffer(out[n:], dtype=np.uint8 if scale == "mx" else np.uint32)
    return q, s


def check(name, bits, src, dst, scale="none", block=None):
    global passed, failed
    q_c, s_c = run_c(bits, src, dst, scale, block)
    q_r, s_r = ref.convert(bits, src, dst, scale, block)
    bad = np.flatnonzero(q_c.reshape(-1) != np.asarray(q_r).reshape(-1))
    if scale == "mx":
        s_rb = np.asarray(s_r, dtype=np.uint8).reshape(-1)
    else:
        s_r = np.asarray(s_r, dtype=np.float32).reshape(-1) if s_r is not None else \
            np.zeros(0, np.float32)
        s_rb = np.where(np.isnan(s_r), np.float32(np.nan), s_r).view(np.uint32)
        s_rb = np.where(np.isnan(s_r), np.uint32(0x7fc00000), s_rb)
    sbad = np.flatnonzero(s_c != s_rb) if s_c.size == s_rb.size else [0]
    if len(bad) or len(sbad):
        failed += 1
        i = bad[0] if len(bad) else None
        print("FAIL %s: %d elements and %d scales differ; first element %s: in %#x C %#x ref %#x"
              % (name, len(bad), len(sbad), i, *((int(bits.reshape(-1)[i]), int(q_c.reshape(-1)[i]),
                                                   int(np.asarray(q_r).reshape(-1)[i])) if i is not None else (0, 0, 0))))
    else:
        passed += 1


def rand_f32(rng, shape, specials=True):
    sign = rng.integers(0, 2, shape, dtype=np.uint32) << 31
    exp = rng.integers(100, 140, shape, dtype=np.uint32) << 23
    man = rng.integers(0, 1 << 23, shape, dtype=np.uint32)
    x = sign | exp | man
    if specials:
        flat = x.reshape(-1)
        sp = np.array([0, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 1, 0x807fffff,
                       0x477ff000, 0x43e80000, 0x3a800000], dtype=np.uint32)
        idx = rng.integers(0, flat.size, max(1, flat.size // 500))
        flat[idx] = sp[rng.integers(0, sp.size, idx.size)]
    return x


def main():
    rng = np.random.default_rng(20261130)
    allv = np.arange(65536, dtype=np.uint32).astype(np.uint16).reshape(256, 256)
    for src in ("bf16", "fp16"):
        # every value at scale 1: one 448 per 128 x 128 block, NaN/inf-free blocks
        x = allv.copy()
        isnan = np.isnan(ref.to_f32(x, src)) | np.isinf(ref.to_f32(x, src))
        x[isnan] = 0
        big = ref.to_f32(x, src).astype(np.float64)
        x[np.abs(big) > 448] = 0
        for bi in range(2):
            for bj in range(2):
                x[bi * 128, bj * 128] = 0x43e0 if src == "bf16" else 0x5f00  # 448
        check("every %s value -> e4m3 at scale 1" % src, x, src, "fp8e4m3", "block", [128, 128])
        check("every %s value -> e4m3, 128x128 blocks with specials" % src, allv, src,
              "fp8e4m3", "block", [128, 128])
        check("every %s value -> e4m3, 1x32 blocks" % src, allv, src, "fp8e4m3", "block", [1, 32])
        check("every %s value -> e4m3, tensor scale" % src, allv, src, "fp8e4m3", "tensor")
        check("every %s value -> MXFP8, 1x32 blocks" % src, allv, src, "fp8e4m3", "mx", [32])
    for it in range(12):
        shape = tuple(int(v) for v in rng.integers(1, 300, 2))
        x = rand_f32(rng, shape)
        check("fp32 %s -> bf16" % (shape,), x, "fp32", "bf16")
        check("fp32 %s -> fp16" % (shape,), x, "fp32", "fp16")
        blk = [int(v) for v in rng.integers(1, 140, 2)]
        check("fp32 %s -> e4m3 blocks %s" % (shape, blk), rand_f32(rng, shape, it % 2 == 0),
              "fp32", "fp8e4m3", "block", blk)
    for it in range(6):
        shape = tuple(int(v) for v in rng.integers(1, 200, 2))
        blk = [int(v) for v in rng.integers(1, 70, 1)]
        check("fp32 %s -> MXFP8 blocks 1x%s" % (shape, blk), rand_f32(rng, shape, it % 2 == 0),
              "fp32", "fp8e4m3", "mx", blk)
    tiny = rand_f32(rng, (64, 64), False) & np.uint32(0x807fffff)   # subnormal and zero
    tiny[::7] = 0
    check("fp32 subnormals -> MXFP8 (X clamped to -127)", tiny, "fp32", "fp8e4m3", "mx", [32])
    x3 = rand_f32(rng, (3, 130, 257), False)
    check("fp32 (3,130,257) -> e4m3 blocks [128,128] on trailing dims", x3, "fp32", "fp8e4m3",
          "block", [128, 128])
    check("fp32 (3,130,257) -> e4m3 tensor scale", x3, "fp32", "fp8e4m3", "tensor")
    allf = (np.arange(1 << 20, dtype=np.uint32) * 4093) & 0xffffffff
    allf = allf * np.uint32(4099) + np.uint32(12345)
    check("2^20 spread fp32 bit patterns -> bf16", allf.reshape(1024, 1024), "fp32", "bf16")
    check("2^20 spread fp32 bit patterns -> fp16", allf.reshape(1024, 1024), "fp32", "fp16")
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
