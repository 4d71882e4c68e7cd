/*
 * sha256.c - SHA-256 after FIPS 180-4 section 6.2: padding and buffering,
 * and two compression functions over whole 64-byte blocks, the portable C
 * rounds and the x86 SHA extensions (SHA-NI), picked once by CPUID.
 */
#include <pthread.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define HAVE_SHANI_BUILD 1
#endif

#include "common/sha256.h"

static const uint32_t K[64] = {
	0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1,
	0x923f82a4, 0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3,
	0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
	0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
	0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147,
	0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
	0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
	0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
	0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
	0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208,
	0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static inline uint32_t
ror(uint32_t x, int n)
{
	return (x >> n) | (x << (32 - n));
}

static void
block(uint32_t st[8], const uint8_t *p)
{
	uint32_t w[64], a, b, cc, d, e, f, g, h;

	for (int i = 0; i < 16; i++)
		w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
		       (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
	for (int i = 16; i < 64; i++) {
		uint32_t s0 = ror(w[i - 15], 7) ^ ror(w[i - 15], 18) ^ (w[i - 15] >> 3);
		uint32_t s1 = ror(w[i - 2], 17) ^ ror(w[i - 2], 19) ^ (w[i - 2] >> 10);
		w[i] = w[i - 16] + s0 + w[i - 7] + s1;
	}
	a = st[0]; b = st[1]; cc = st[2]; d = st[3];
	e = st[4]; f = st[5]; g = st[6]; h = st[7];
	for (int i = 0; i < 64; i++) {
		uint32_t S1 = ror(e, 6) ^ ror(e, 11) ^ ror(e, 25);
		uint32_t ch = (e & f) ^ (~e & g);
		uint32_t t1 = h + S1 + ch + K[i] + w[i];
		uint32_t S0 = ror(a, 2) ^ ror(a, 13) ^ ror(a, 22);
		uint32_t maj = (a & b) ^ (a & cc) ^ (b & cc);
		uint32_t t2 = S0 + maj;

		h = g; g = f; f = e; e = d + t1;
		d = cc; cc = b; b = a; a = t1 + t2;
	}
	st[0] += a; st[1] += b; st[2] += cc; st[3] += d;
	st[4] += e; st[5] += f; st[6] += g; st[7] += h;
}

static void
blocks_portable(uint32_t st[8], const uint8_t *p, size_t n)
{
	for (; n > 0; n--, p += 64)
		block(st, p);
}

#ifdef HAVE_SHANI_BUILD
/*
 * The same compression with SHA256RNDS2 (two rounds), SHA256MSG1 and
 * SHA256MSG2 (the message schedule).  RNDS2 keeps the working variables
 * as two vectors, {A, B, E, F} and {C, D, G, H} (A in the top lane), and
 * takes W[t] + K[t] for its two rounds in the low two lanes.
 */
__attribute__((target("sha,sse4.1"))) static void
blocks_shani(uint32_t st[8], const uint8_t *p, size_t n)
{
	/* big-endian words: reverse the bytes of each 32-bit lane */
	const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bll, 0x0405060700010203ll);
	__m128i abcd = _mm_loadu_si128((const __m128i *)&st[0]); /* lanes A B C D */
	__m128i efgh = _mm_loadu_si128((const __m128i *)&st[4]); /* lanes E F G H */
	__m128i badc = _mm_shuffle_epi32(abcd, 0xb1);             /* B A D C */
	__m128i hgfe = _mm_shuffle_epi32(efgh, 0x1b);             /* H G F E */
	__m128i abef = _mm_alignr_epi8(badc, hgfe, 8);            /* F E B A */
	__m128i cdgh = _mm_blend_epi16(hgfe, badc, 0xf0);         /* H G D C */

	for (; n > 0; n--, p += 64) {
		__m128i abef0 = abef, cdgh0 = cdgh, w[4];

		for (int i = 0; i < 4; i++)
			w[i] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 16 * i)),
						bswap);
#pragma GCC unroll 16
		for (int q = 0; q < 16; q++) { /* rounds 4q .. 4q+3 */
			__m128i wk;

			if (q >= 4) {
				/* W[t] = s1(W[t-2]) + W[t-7] + s0(W[t-15]) + W[t-16]:
				 * w[q&3] holds W[4q-16..], the next ones follow */
				__m128i x = _mm_sha256msg1_epu32(w[q & 3], w[(q + 1) & 3]);

				x = _mm_add_epi32(x, _mm_alignr_epi8(w[(q + 3) & 3],
								     w[(q + 2) & 3], 4));
				w[q & 3] = _mm_sha256msg2_epu32(x, w[(q + 3) & 3]);
			}
			wk = _mm_add_epi32(w[q & 3], _mm_loadu_si128((const __m128i *)&K[4 * q]));
			cdgh = _mm_sha256rnds2_epu32(cdgh, abef, wk);
			abef = _mm_sha256rnds2_epu32(abef, cdgh, _mm_shuffle_epi32(wk, 0x0e));
		}
		abef = _mm_add_epi32(abef, abef0);
		cdgh = _mm_add_epi32(cdgh, cdgh0);
	}
	__m128i feba = _mm_shuffle_epi32(abef, 0x1b); /* A B E F */
	__m128i dchg = _mm_shuffle_epi32(cdgh, 0xb1); /* G H C D */

	_mm_storeu_si128((__m128i *)&st[0], _mm_blend_epi16(feba, dchg, 0xf0));
	_mm_storeu_si128((__m128i *)&st[4], _mm_alignr_epi8(dchg, feba, 8));
}

/* CPUID: SHA (leaf 7, EBX bit 29), SSSE3 and SSE4.1 (leaf 1, ECX 9, 19). */
static bool
cpu_has_shani(void)
{
	unsigned a, b, c, d;

	if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 9)) || !(c & (1u << 19)))
		return false;
	if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
		return false;
	return (b & (1u << 29)) != 0;
}
#else
static bool
cpu_has_shani(void)
{
	return false;
}
#endif

static pthread_once_t once = PTHREAD_ONCE_INIT;
static bool have_shani;
static int impl = SHA256_IMPL_PORTABLE; /* read relaxed: set by init or the hook */

static void
impl_init(void)
{
	have_shani = cpu_has_shani();
	__atomic_store_n(&impl, have_shani ? SHA256_IMPL_SHANI : SHA256_IMPL_PORTABLE,
			 __ATOMIC_RELAXED);
}

static void
blocks(sha256_ctx_t *c, const uint8_t *p, size_t n)
{
#ifdef HAVE_SHANI_BUILD
	if (__atomic_load_n(&impl, __ATOMIC_RELAXED) == SHA256_IMPL_SHANI) {
		blocks_shani(c->h, p, n);
		return;
	}
#endif
	blocks_portable(c->h, p, n);
}

bool
sha256_impl_set(sha256_impl_t want)
{
	pthread_once(&once, impl_init);
	if (want == SHA256_IMPL_AUTO)
		want = have_shani ? SHA256_IMPL_SHANI : SHA256_IMPL_PORTABLE;
	if (want == SHA256_IMPL_SHANI && !have_shani)
		return false;
	if (want != SHA256_IMPL_SHANI && want != SHA256_IMPL_PORTABLE)
		return false;
	__atomic_store_n(&impl, (int)want, __ATOMIC_RELAXED);
	return true;
}

sha256_impl_t
sha256_impl_get(void)
{
	pthread_once(&once, impl_init);
	return (sha256_impl_t)__atomic_load_n(&impl, __ATOMIC_RELAXED);
}

const char *
sha256_impl_name(sha256_impl_t i)
{
	return i == SHA256_IMPL_SHANI ? "sha-ni" : i == SHA256_IMPL_PORTABLE ? "portable"
									   : "auto";
}

void
sha256_init(sha256_ctx_t *c)
{
	static const uint32_t iv[8] = {
		0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
		0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
	};

	pthread_once(&once, impl_init);
	memcpy(c->h, iv, sizeof(iv));
	c->total = 0;
	c->buflen = 0;
}

void
sha256_update(sha256_ctx_t *c, const void *data, size_t n)
{
	const uint8_t *p = data;

	c->total += n;
	if (c->buflen > 0) {
		size_t take = 64 - c->buflen < n ? 64 - c->buflen : n;

		memcpy(c->buf + c->buflen, p, take);
		c->buflen += take;
		p += take;
		n -= take;
		if (c->buflen < 64)
			return;
		blocks(c, c->buf, 1);
		c->buflen = 0;
	}
	if (n >= 64) {
		blocks(c, p, n / 64);
		p += n & ~(size_t)63;
		n &= 63;
	}
	memcpy(c->buf, p, n);
	c->buflen = n;
}

void
sha256_final(sha256_ctx_t *c, uint8_t out[SHA256_DIGEST_LEN])
{
	uint64_t bits = c->total * 8;
	uint8_t pad[72] = {0x80};
	size_t padlen = (c->buflen < 56 ? 56 : 120) - c->buflen;

	for (int i = 0; i < 8; i++)
		pad[padlen + i] = (uint8_t)(bits >> (56 - 8 * i));
	sha256_update(c, pad, padlen + 8);
	for (int i = 0; i < 8; i++) {
		out[4 * i] = (uint8_t)(c->h[i] >> 24);
		out[4 * i + 1] = (uint8_t)(c->h[i] >> 16);
		out[4 * i + 2] = (uint8_t)(c->h[i] >> 8);
		out[4 * i + 3] = (uint8_t)c->h[i];
	}
}

void
sha256_to_hex(const uint8_t d[SHA256_DIGEST_LEN], char hex[SHA256_HEX_LEN])
{
	static const char digits[] = "0123456789abcdef";

	for (int i = 0; i < SHA256_DIGEST_LEN; i++) {
		hex[2 * i] = digits[d[i] >> 4];
		hex[2 * i + 1] = digits[d[i] & 15];
	}
	hex[64] = '\0';
}

void
sha256_hex(const void *data, size_t n, char hex[SHA256_HEX_LEN])
{
	sha256_ctx_t c;
	uint8_t d[SHA256_DIGEST_LEN];

	sha256_init(&c);
	sha256_update(&c, data, n);
	sha256_final(&c, d);
	sha256_to_hex(d, hex);
}
