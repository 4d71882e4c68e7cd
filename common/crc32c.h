/*
 * crc32c.h - CRC-32C (Castagnoli), the checksum of verify-mode messages.
 * Software slicing-by-8; the SSE4.2 instruction when the CPU has it.
 */
#ifndef REFIT_COMMON_CRC32C_H
#define REFIT_COMMON_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Extend crc (0 to start) over n bytes. */
uint32_t crc32c(uint32_t crc, const void *data, size_t n);
/* The table-driven path alone (tests compare it with the instruction). */
uint32_t crc32c_sw(uint32_t crc, const void *data, size_t n);

#endif
