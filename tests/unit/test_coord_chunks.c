/*
 * test_coord_chunks.c - the state document's content-defined chunks and
 * their manifest (daemon/coord/coord_chunks.h): the same cuts every time,
 * sizes within min..max, empty and small documents, an edit in one place
 * changing only the chunks around it, the manifest's round trip, and its
 * refusals (another tag, a missing field, a bad line, chunks that do not
 * add up, a document whose digest or length is not the manifest's).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/strbuf.h"
#include "daemon/coord/coord_chunks.h"
#include "tests/unit/helpers.h"

/* A state-like JSON text: models of many tensors each (about 120 bytes a tensor). */
static char *
doc(int models, int tensors, size_t *len)
{
	strbuf_t sb;

	strbuf_init(&sb);
	strbuf_puts(&sb, "{\"version\":3,\"models\":[");
	for (int m = 0; m < models; m++) {
		strbuf_printf(&sb, "%s{\"name\":\"model-%d\",\"latest_version\":%d,\"tensors\":[",
			      m ? "," : "", m, 7 * m + 1);
		for (int t = 0; t < tensors; t++)
			strbuf_printf(&sb, "%s{\"name\":\"layers.%d.mlp.w%d\",\"dtype\":\"bf16\","
				      "\"shape\":[%d,%d],\"mesh\":[%d,%d],\"placements\":"
				      "[\"Shard(%d)\"]}", t ? "," : "", t / 7, t % 7,
				      1024 + t % 13 * 64, 4096 - t % 5 * 128, m, m + 1, t % 2);
		strbuf_puts(&sb, "]}");
	}
	strbuf_puts(&sb, "]}");
	*len = sb.len;
	return sb.s;
}

START_TEST(deterministic_and_bounded)
{
	size_t len, *a, *b, max = 64 * 1024;
	char *d = doc(4, 4000, &len);
	size_t na = coord_chunks_cut(d, len, max, &a), nb = coord_chunks_cut(d, len, max, &b);

	ck_assert_uint_gt(len, 1500000);
	ck_assert_uint_eq(na, nb);
	ck_assert(memcmp(a, b, na * sizeof(*a)) == 0);
	ck_assert_uint_eq(a[na - 1], len);
	for (size_t i = 0, start = 0; i < na; start = a[i++]) {
		size_t n = a[i] - start;

		ck_assert_uint_le(n, max);
		if (i + 1 < na)
			ck_assert_uint_ge(n, max / 16);
	}
	/* cut by content, not at max: the average well under it */
	ck_assert_uint_lt(len / na, max / 2);
	ck_assert_uint_gt(len / na, max / 16);
	free(a);
	free(b);
	free(d);
}
END_TEST

START_TEST(empty_and_small)
{
	size_t *e;

	ck_assert_uint_eq(coord_chunks_cut("", 0, 65536, &e), 0);
	free(e);
	ck_assert_uint_eq(coord_chunks_cut("{}", 2, 65536, &e), 1);
	ck_assert_uint_eq(e[0], 2);
	free(e);
	/* a max under the floor is raised to it */
	{
		size_t len, *c;
		char *d = doc(1, 200, &len);
		size_t n = coord_chunks_cut(d, len, 10, &c);

		for (size_t i = 0, s = 0; i < n; s = c[i++])
			ck_assert_uint_le(c[i] - s, COORD_CHUNK_MAX_MIN);
		free(c);
		free(d);
	}
}
END_TEST

/* How many chunks of b are not chunks of a. */
static size_t
changed(const coord_manifest_t *a, const coord_manifest_t *b)
{
	size_t n = 0;

	for (size_t i = 0; i < b->n; i++) {
		bool seen = false;

		for (size_t j = 0; j < a->n && !seen; j++)
			seen = strcmp(a->chunks[j].hex, b->chunks[i].hex) == 0;
		n += !seen;
	}
	return n;
}

START_TEST(local_edit)
{
	size_t len, max = 64 * 1024;
	char *d = doc(4, 3000, &len), *e = malloc(len + 32);
	coord_manifest_t a, b, c;
	size_t at = len / 3;

	coord_manifest_make(d, len, max, &a);
	ck_assert_uint_gt(a.n, 20);
	/* an insertion in the middle (a version number growing) */
	memcpy(e, d, at);
	memcpy(e + at, "12345", 5);
	memcpy(e + at + 5, d + at, len - at);
	coord_manifest_make(e, len + 5, max, &b);
	ck_assert_uint_le(changed(&a, &b), 2);
	/* a byte overwritten near the end */
	memcpy(e, d, len);
	e[len - 100] = e[len - 100] == '7' ? '8' : '7';
	coord_manifest_make(e, len, max, &c);
	ck_assert_uint_eq(changed(&a, &c), 1);
	coord_manifest_fini(&a);
	coord_manifest_fini(&b);
	coord_manifest_fini(&c);
	free(d);
	free(e);
}
END_TEST

START_TEST(round_trip)
{
	size_t len, mlen, off = 0;
	char *d = doc(2, 1500, &len), *t;
	coord_manifest_t a, b;
	refit_err_t err = {0};

	coord_manifest_make(d, len, 16 * 1024, &a);
	t = coord_manifest_text(&a, &mlen);
	ck_assert(t[0] != '{');
	ck_assert(strncmp(t, COORD_MANIFEST_TAG "\n", strlen(COORD_MANIFEST_TAG) + 1) == 0);
	ck_assert_int_eq(coord_manifest_parse(t, mlen, "k", &b, &err), REFIT_OK);
	ck_assert_uint_eq(b.n, a.n);
	ck_assert_uint_eq(b.length, len);
	ck_assert_str_eq(b.hex, a.hex);
	for (size_t i = 0; i < a.n; i++) {
		char hex[SHA256_HEX_LEN];

		ck_assert_str_eq(b.chunks[i].hex, a.chunks[i].hex);
		ck_assert_uint_eq(b.chunks[i].len, a.chunks[i].len);
		sha256_hex(d + off, b.chunks[i].len, hex);
		ck_assert_str_eq(hex, b.chunks[i].hex);
		off += b.chunks[i].len;
	}
	ck_assert_int_eq(coord_manifest_verify(&b, d, len, "k", &err), REFIT_OK);
	/* the document changed in one byte, or cut short: refused, named */
	d[len / 2] ^= 1;
	ck_assert_int_eq(coord_manifest_verify(&b, d, len, "etcd key /r/state", &err),
			 REFIT_ERR_INVALID_ARG);
	ck_assert_ptr_nonnull(strstr(err.msg, "etcd key /r/state"));
	ck_assert_ptr_nonnull(strstr(err.msg, "sha256"));
	refit_err_clear(&err);
	ck_assert_int_eq(coord_manifest_verify(&b, d, len - 1, "k", &err), REFIT_ERR_INVALID_ARG);
	ck_assert_ptr_nonnull(strstr(err.msg, "bytes, the manifest says"));
	coord_manifest_fini(&a);
	coord_manifest_fini(&b);
	free(t);
	free(d);
}
END_TEST

static void
refused(const char *text, const char *want)
{
	coord_manifest_t m;
	refit_err_t err = {0};

	ck_assert_int_eq(coord_manifest_parse(text, strlen(text), "etcd key /r/state", &m, &err),
			 REFIT_ERR_INVALID_ARG);
	ck_assert_msg(strstr(err.msg, want) && strstr(err.msg, "etcd key /r/state"),
		      "%s: \"%s\" lacks \"%s\"", text, err.msg, want);
	ck_assert_ptr_null(m.chunks);
}

#define H64 "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

START_TEST(parse_errors)
{
	refused("", "empty");
	refused("refit-state-chunks 2\nlength 3\nsha256 " H64 "\nchunk " H64 " 3\n",
		"first line");
	refused("{\"models\":[]}", "first line");
	refused(COORD_MANIFEST_TAG "\nsha256 " H64 "\nchunk " H64 " 3\n", "no length");
	refused(COORD_MANIFEST_TAG "\nlength 3\nchunk " H64 " 3\n", "no sha256");
	refused(COORD_MANIFEST_TAG "\nlength x\nsha256 " H64 "\n", "length");
	refused(COORD_MANIFEST_TAG "\nlength 3\nsha256 abc\n", "sha256");
	refused(COORD_MANIFEST_TAG "\nlength 3\nsha256 " H64 "\nchunk " H64 "\n", "chunk line");
	refused(COORD_MANIFEST_TAG "\nlength 3\nsha256 " H64 "\nchunk XYZ 3\n", "chunk line");
	refused(COORD_MANIFEST_TAG "\nlength 3\nsha256 " H64 "\nchunk " H64 " 0\n", "chunk line");
	refused(COORD_MANIFEST_TAG "\nlength 4\nsha256 " H64 "\nchunk " H64 " 3\n",
		"add up to 3 bytes, length says 4");
	refused(COORD_MANIFEST_TAG "\nlength 3\nsha256 " H64 "\nowner me\n", "unknown line");
	{
		coord_manifest_t m;
		refit_err_t err = {0};
		const char *ok = COORD_MANIFEST_TAG "\nlength 0\nsha256 " H64 "\n";

		ck_assert_int_eq(coord_manifest_parse(ok, strlen(ok), "k", &m, &err), REFIT_OK);
		ck_assert_uint_eq(m.n, 0);
		coord_manifest_fini(&m);
	}
}
END_TEST

Suite *
suite_coord_chunks(void)
{
	return th_suite("coord_chunks",
			th_tcase("core", 30,
				 TH_TESTS(deterministic_and_bounded, empty_and_small, local_edit,
					  round_trip, parse_errors)),
			NULL);
}
