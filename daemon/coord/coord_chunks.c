/*
 * coord_chunks.c - content-defined chunks of the state document and their
 * manifest (coord_chunks.h).
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/strbuf.h"
#include "daemon/coord/coord_chunks.h"

/* The gear table: 256 pseudo-random words from a fixed seed (splitmix64),
 * the same in every build, so every coordinator cuts alike. */
static void
gear_table(uint64_t g[256])
{
	uint64_t x = 0x7265666974ULL; /* "refit" */

	for (int i = 0; i < 256; i++) {
		uint64_t z = (x += 0x9e3779b97f4a7c15ULL);

		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
		z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
		g[i] = z ^ (z >> 31);
	}
}

/* bits of the cut mask: 2^bits about avg - min = max / 4 - max / 16 */
static unsigned
mask_bits(size_t max)
{
	size_t span = max / 4 - max / 16;
	unsigned b = 0;

	while (b < 40 && ((size_t)1 << (b + 1)) <= span)
		b++;
	return b;
}

size_t
coord_chunks_cut(const char *data, size_t len, size_t max, size_t **ends)
{
	uint64_t g[256];
	size_t min, n = 0, cap = 8, start = 0;
	unsigned bits;

	if (max < COORD_CHUNK_MAX_MIN)
		max = COORD_CHUNK_MAX_MIN;
	min = max / 16;
	bits = mask_bits(max);
	gear_table(g);
	*ends = NULL;
	if (len == 0)
		return 0;
	*ends = xmalloc(cap * sizeof(**ends));
	while (start < len) {
		size_t end = start + max < len ? start + max : len, i = start + min;
		uint64_t h = 0;

		/* the hash of the 64 bytes before i decides: start it there */
		for (size_t j = i > start + 64 ? i - 64 : start; j < i && j < end; j++)
			h = (h << 1) + g[(unsigned char)data[j]];
		for (; i < end; i++) {
			h = (h << 1) + g[(unsigned char)data[i]];
			if ((h >> (64 - bits)) == 0) {
				end = i + 1;
				break;
			}
		}
		if (n == cap)
			*ends = xrealloc(*ends, (cap *= 2) * sizeof(**ends));
		(*ends)[n++] = end;
		start = end;
	}
	return n;
}

void
coord_manifest_make(const char *text, size_t len, size_t max, coord_manifest_t *m)
{
	size_t *ends, start = 0;

	memset(m, 0, sizeof(*m));
	m->length = len;
	sha256_hex(text, len, m->hex);
	m->n = coord_chunks_cut(text, len, max, &ends);
	m->chunks = xcalloc(m->n ? m->n : 1, sizeof(*m->chunks));
	for (size_t i = 0; i < m->n; i++) {
		m->chunks[i].len = ends[i] - start;
		sha256_hex(text + start, m->chunks[i].len, m->chunks[i].hex);
		start = ends[i];
	}
	free(ends);
}

char *
coord_manifest_text(const coord_manifest_t *m, size_t *len)
{
	strbuf_t sb;
	char *out;

	strbuf_init(&sb);
	strbuf_printf(&sb, "%s\nlength %zu\nsha256 %s\n", COORD_MANIFEST_TAG, m->length, m->hex);
	for (size_t i = 0; i < m->n; i++)
		strbuf_printf(&sb, "chunk %s %zu\n", m->chunks[i].hex, m->chunks[i].len);
	*len = sb.len;
	out = xmalloc(sb.len + 1);
	memcpy(out, sb.s ? sb.s : "", sb.len);
	out[sb.len] = '\0';
	strbuf_fini(&sb);
	return out;
}

static bool
is_hex64(const char *s)
{
	for (int i = 0; i < 64; i++)
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return false;
	return s[64] == '\0';
}

/* "WORD HEX [LEN]" -> hex (and *n); false: not that */
static bool
parse_line(const char *ln, const char *word, char hex[SHA256_HEX_LEN], size_t *n)
{
	char h[80], tail[4];
	unsigned long long v = 0;
	size_t w = strlen(word);
	int got;

	if (strncmp(ln, word, w) != 0 || ln[w] != ' ')
		return false;
	got = n ? sscanf(ln + w + 1, "%79s %llu%3s", h, &v, tail)
		: sscanf(ln + w + 1, "%79s%3s", h, tail);
	if (got != (n ? 2 : 1) || strlen(h) != 64 || !is_hex64(h))
		return false;
	memcpy(hex, h, SHA256_HEX_LEN);
	if (n)
		*n = (size_t)v;
	return true;
}

static refit_status_t
bad(coord_manifest_t *m, refit_err_t *err, const char *where, size_t line, const char *what)
{
	coord_manifest_fini(m);
	return refit_err_set(err, REFIT_ERR_INVALID_ARG, "%s: not a state manifest: line %zu: "
			     "%s", where, line, what);
}

refit_status_t
coord_manifest_parse(const char *text, size_t len, const char *where, coord_manifest_t *m,
		     refit_err_t *err)
{
	char *copy = xmalloc(len + 1), *save = NULL, *ln;
	size_t line = 0, cap = 0, sum = 0;
	bool have_len = false, have_sha = false;
	refit_status_t rc = REFIT_OK;

	memset(m, 0, sizeof(*m));
	memcpy(copy, text, len);
	copy[len] = '\0';
	if (memchr(text, '\0', len) != NULL) {
		free(copy);
		return bad(m, err, where, 0, "a NUL byte");
	}
	for (ln = strtok_r(copy, "\n", &save); ln && rc == REFIT_OK;
	     ln = strtok_r(NULL, "\n", &save)) {
		unsigned long long v;
		char tail[4];

		line++;
		if (line == 1) {
			if (strcmp(ln, COORD_MANIFEST_TAG) != 0)
				rc = bad(m, err, where, line, "the first line is not \""
					 COORD_MANIFEST_TAG "\" (another format or version)");
		} else if (strncmp(ln, "length ", 7) == 0) {
			if (have_len || sscanf(ln + 7, "%llu%3s", &v, tail) != 1)
				rc = bad(m, err, where, line, "length twice or not a number");
			else
				m->length = (size_t)v;
			have_len = true;
		} else if (strncmp(ln, "sha256 ", 7) == 0) {
			if (have_sha || !parse_line(ln, "sha256", m->hex, NULL))
				rc = bad(m, err, where, line, "sha256 twice or not 64 hex digits");
			have_sha = true;
		} else if (strncmp(ln, "chunk ", 6) == 0) {
			coord_chunk_ref_t r;

			if (!parse_line(ln, "chunk", r.hex, &r.len) || r.len == 0) {
				rc = bad(m, err, where, line, "a chunk line is not \"chunk HEX64 LEN\"");
				break;
			}
			if (m->n == cap)
				m->chunks = xrealloc(m->chunks, (cap = cap ? cap * 2 : 16) *
						     sizeof(*m->chunks));
			m->chunks[m->n++] = r;
			sum += r.len;
		} else {
			rc = bad(m, err, where, line, "an unknown line");
		}
	}
	free(copy);
	if (rc != REFIT_OK)
		return rc;
	if (line == 0)
		return bad(m, err, where, 0, "empty");
	if (!have_len || !have_sha)
		return bad(m, err, where, line, have_len ? "no sha256 line" : "no length line");
	if (sum != m->length) {
		char what[96];

		snprintf(what, sizeof(what), "the chunks add up to %zu bytes, length says %zu",
			 sum, m->length);
		return bad(m, err, where, line, what);
	}
	return REFIT_OK;
}

refit_status_t
coord_manifest_verify(const coord_manifest_t *m, const char *doc, size_t len, const char *where,
		      refit_err_t *err)
{
	char hex[SHA256_HEX_LEN];

	if (len != m->length)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "%s: the document assembled is "
				     "%zu bytes, the manifest says %zu", where, len, m->length);
	sha256_hex(doc, len, hex);
	if (strcmp(hex, m->hex) != 0)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "%s: the document assembled has "
				     "sha256 %s, the manifest says %s", where, hex, m->hex);
	return REFIT_OK;
}

void
coord_manifest_fini(coord_manifest_t *m)
{
	free(m->chunks);
	memset(m, 0, sizeof(*m));
}
