/*
 * sha256.h - SHA-256 (FIPS 180-4), used for plan and layout digests.
 *
 * Streaming interface on caller-owned context; no allocation, libc only.
 * The compression function is portable C, or the x86 SHA extensions
 * (SHA-NI) when the CPU has them (chosen once, at the first sha256_init;
 * both give the same digests).
 */
#ifndef REFIT_COMMON_SHA256_H
#define REFIT_COMMON_SHA256_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SHA256_DIGEST_LEN 32
#define SHA256_HEX_LEN 65 /* 64 hex digits + NUL */

typedef struct sha256_ctx {
	uint32_t h[8];
	uint64_t total;
	uint8_t buf[64];
	size_t buflen;
} sha256_ctx_t;

void sha256_init(sha256_ctx_t *c);
void sha256_update(sha256_ctx_t *c, const void *data, size_t n);
void sha256_final(sha256_ctx_t *c, uint8_t out[SHA256_DIGEST_LEN]);
/* One-shot digest of data as lower-case hex into hex[SHA256_HEX_LEN]. */
void sha256_hex(const void *data, size_t n, char hex[SHA256_HEX_LEN]);
void sha256_to_hex(const uint8_t d[SHA256_DIGEST_LEN], char hex[SHA256_HEX_LEN]);

typedef enum sha256_impl {
	SHA256_IMPL_AUTO,     /* SHA-NI when the CPU has it, else portable */
	SHA256_IMPL_PORTABLE, /* the C rounds */
	SHA256_IMPL_SHANI,    /* x86 SHA extensions */
} sha256_impl_t;

/*
 * Test hook: make every context use `impl` from now on.  Returns false
 * (nothing changed) when the CPU or the build lacks it.  Not for use while
 * other threads hash.
 */
bool sha256_impl_set(sha256_impl_t impl);
/* The implementation in use (PORTABLE or SHANI). */
sha256_impl_t sha256_impl_get(void);
/* "portable" or "sha-ni". */
const char *sha256_impl_name(sha256_impl_t impl);

#endif
