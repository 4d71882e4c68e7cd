/*
 * convert_elem.h - the per-element conversion rules (docs/conversion.md),
 * shared by the host code (convert.c) and the CUDA kernels
 * (daemon/transport/convert_kernels.cu), so both round alike bit for bit.
 * Integer operations plus one IEEE fp32 division (the scale); CUDA code must
 * be compiled without --use_fast_math (nvcc's default divides exactly).
 */
#ifndef REFIT_DATAPLANE_CONVERT_ELEM_H
#define REFIT_DATAPLANE_CONVERT_ELEM_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define DP_HD static __host__ __device__ __forceinline__
#else
#define DP_HD static inline
#endif

/*
 * MXFP8 (OCP MX v1.0): the block's shared scale 2^X, X = floor(log2(amax))
 * - 8 clamped to [-127, 127], as its e8m0 byte X + 127; a block holding a
 * NaN or an infinity gets 0xff (NaN).  Zero and subnormal amax give 0.
 */
DP_HD uint8_t
dp_elem_mx_scale(uint32_t amax)
{
	uint32_t e = (amax & 0x7fffffffu) >> 23;

	if (e == 0xff)
		return 0xff;
	return (uint8_t)(e > 8 ? e - 8 : 0);
}

/* The divisor 2^(b - 127) of an e8m0 byte, as fp32 bits (0xff: NaN). */
DP_HD uint32_t
dp_elem_mx_divisor(uint8_t b)
{
	if (b == 0xff)
		return 0x7fc00000u;
	return b ? (uint32_t)b << 23 : 0x00400000u;
}

/* The same 32 bits as the other type: the intrinsic on the device, memcpy
 * on the host (no aliasing games). */
#ifdef __CUDA_ARCH__
#define DP_BITCAST(to, v, intrinsic) return intrinsic(v)
#else
#define DP_BITCAST(to, v, intrinsic)              \
	do {                                      \
		to r_;                            \
		memcpy(&r_, &(v), sizeof(r_));    \
		return r_;                        \
	} while (0)
#endif

DP_HD uint32_t
dp_bits_of(float f)
{
	DP_BITCAST(uint32_t, f, __float_as_uint);
}

DP_HD float
dp_float_of(uint32_t u)
{
	DP_BITCAST(float, u, __uint_as_float);
}

/* a >> sh rounded to nearest, ties to even (1 <= sh <= 31) */
DP_HD uint32_t
dp_shr_rne(uint32_t a, uint32_t sh)
{
	uint32_t m = a >> sh, rem = a & ((1u << sh) - 1), half = 1u << (sh - 1);

	return m + ((rem > half) | ((rem == half) & m & 1u));
}

/* fp32 bits -> bf16 bits: nearest even, any NaN -> 0x7fc0 */
DP_HD uint16_t
dp_elem_bf16(uint32_t u)
{
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return 0x7fc0;
	return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/*
 * fp32 bits -> the bits of a narrower float, nearest even: the sign moves
 * down sshift bits; NaN -> nan; |x| at or past over -> over_code (inf or the
 * saturated max); normals (|x| >= normal) lose rebias from the exponent and
 * drop low mantissa bits; below 2^(zero_e - 127) -> zero; the rest are
 * subnormals, the significand shifted by sub_base - e.
 */
DP_HD uint32_t
dp_narrow(uint32_t u, uint32_t sshift, uint32_t nan, uint32_t over, uint32_t over_code,
	  uint32_t normal, uint32_t rebias, uint32_t drop, uint32_t zero_e, uint32_t sub_base)
{
	uint32_t s = (u & 0x80000000u) >> sshift;
	uint32_t a = u & 0x7fffffffu, e = a >> 23;

	if (a > 0x7f800000u)
		return nan;
	if (a >= over)
		return s | over_code;
	if (a >= normal) {
		uint32_t r = a - (rebias << 23);

		return s | ((r + ((1u << (drop - 1)) - 1) + ((r >> drop) & 1u)) >> drop);
	}
	if (e < zero_e)
		return s;
	return s | dp_shr_rne((a & 0x7fffffu) | 0x800000u, sub_base - e);
}

/* fp32 bits -> fp16 bits: IEEE nearest even, overflow to inf, NaN -> 0x7e00;
 * >= 65520 rounds past 65504; normal from 2^-14; below 2^-25 rounds to zero */
DP_HD uint16_t
dp_elem_fp16(uint32_t u)
{
	return (uint16_t)dp_narrow(u, 16, 0x7e00, 0x477ff000u, 0x7c00, 0x38800000u, 112, 13, 102,
				   126);
}

/* fp32 bits -> e4m3fn code: nearest even, saturating to +-448 (inf too),
 * NaN -> 0x7f; normal from 2^-6; at most 2^-10 rounds to zero (ties to 0) */
DP_HD uint8_t
dp_elem_e4m3(uint32_t u)
{
	return (uint8_t)dp_narrow(u, 24, 0x7f, 0x43e00000u, 0x7e, 0x3c800000u, 120, 20, 117, 141);
}

/* fp16 bits -> fp32 bits, exact */
DP_HD uint32_t
dp_widen_fp16(uint16_t h)
{
	uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;

	if (e == 0)   /* zero or subnormal: m * 2^-24 is exact in fp32 */
		return s | dp_bits_of((float)m * 5.9604644775390625e-8f);
	if (e == 31)
		return s | 0x7f800000u | (m << 13);
	return s | ((e + 112u) << 23) | (m << 13);
}

/* scale_inv (fp32 bits) of a block whose max |x| has fp32 bits amax */
DP_HD uint32_t
dp_elem_scale_inv(uint32_t amax)
{
	float a = dp_float_of(amax & 0x7fffffffu);

	if ((amax & 0x7fffffffu) > 0x7f800000u)
		return 0x7fc00000u;
	if (a < 1e-4f)
		a = 1e-4f;
	return dp_bits_of(a / 448.0f);
}

#endif
