/*
 * wire.h - integers on the wire: little-endian, byte by byte, whatever the
 * host's order (frames, handshakes, checksum trailers, the memory socket's
 * key).  Never a C struct's or an integer's memory.  libc only.
 */
#ifndef REFIT_COMMON_WIRE_H
#define REFIT_COMMON_WIRE_H

#include <stdint.h>

/* the low n bytes (1..8) of v at p, least significant first */
static inline void
wire_put_le(uint8_t *p, uint64_t v, int n)
{
	for (int i = 0; i < n; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

/* the n-byte (1..8) little-endian number at p */
static inline uint64_t
wire_get_le(const uint8_t *p, int n)
{
	uint64_t v = 0;

	for (int i = 0; i < n; i++)
		v |= (uint64_t)p[i] << (8 * i);
	return v;
}

#endif
