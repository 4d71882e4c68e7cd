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

#endif

DP_HD uint32_t
dp_bits_of(float f)
{
#ifdef __CUDA_ARCH__
	return __float_as_uint(f);
#else
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
#endif
}

DP_HD float
dp_float_of(uint32_t u)
{
#ifdef __CUDA_ARCH__
	return __uint_as_float(u);
#else
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
#endif
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

/* fp32 bits -> fp16 bits: IEEE nearest even, overflow to inf, NaN -> 0x7e00 */
DP_HD uint16_t
dp_elem_fp16(uint32_t u)
{
	uint16_t s = (uint16_t)((u >> 16) & 0x8000u);
	uint32_t a = u & 0x7fffffffu, e = a >> 23;

	if (a > 0x7f800000u)
		return 0x7e00;
	if (a >= 0x477ff000u)           /* >= 65520: rounds past 65504 */
		return s | 0x7c00;
	if (a >= 0x38800000u) {          /* >= 2^-14: normal */
		uint32_t r = a - (112u << 23);

		return s | (uint16_t)((r + 0xfffu + ((r >> 13) & 1u)) >> 13);
	}
	if (e < 102)                     /* < 2^-25: rounds to zero */
		return s;
	return s | (uint16_t)dp_shr_rne((a & 0x7fffffu) | 0x800000u, 126 - e);
}

/* fp32 bits -> e4m3fn code: nearest even, saturating to +-448, NaN -> 0x7f */
DP_HD uint8_t
dp_elem_e4m3(uint32_t u)
{
	uint8_t s = (uint8_t)((u >> 24) & 0x80u);
	uint32_t a = u & 0x7fffffffu, e = a >> 23;

	if (a > 0x7f800000u)
		return 0x7f;
	if (a >= 0x43e00000u)            /* >= 448, inf: saturate */
		return s | 0x7e;
	if (a >= 0x3c800000u) {          /* >= 2^-6: normal */
		uint32_t r = a - (120u << 23);

		return s | (uint8_t)((r + 0x7ffffu + ((r >> 20) & 1u)) >> 20);
	}
	if (e < 117)                     /* <= 2^-10 (ties to 0) */
		return s;
	return s | (uint8_t)dp_shr_rne((a & 0x7fffffu) | 0x800000u, 141 - e);
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
