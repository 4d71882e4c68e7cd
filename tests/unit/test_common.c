/*
 * test_common.c - status, errors, sha256, strbuf, parsing.
 */
#include <stdio.h>
#include <errno.h>
#include <string.h>

#include "common/alloc.h"
#include "common/crc32c.h"
#include "common/err.h"
#include "common/log.h"
#include "common/strmap.h"
#include "common/parse.h"
#include "common/sha256.h"
#include "common/strbuf.h"
#include "common/utf8.h"
#include "tests/unit/helpers.h"

START_TEST(utf8_checks)
{
	size_t bad = 99;
	char buf[REFIT_ERR_MSG_MAX];
	refit_err_t err;

	ck_assert(utf8_valid("", 0, NULL));
	ck_assert(utf8_valid("abc \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", 15, NULL));
	ck_assert(!utf8_valid("a\xff", 2, &bad));
	ck_assert_uint_eq(bad, 1);
	ck_assert(!utf8_valid("\xc0\xaf", 2, &bad));          /* overlong '/' */
	ck_assert(!utf8_valid("\xe0\x80\xaf", 3, &bad));      /* overlong */
	ck_assert(!utf8_valid("\xed\xa0\x80", 3, &bad));      /* surrogate */
	ck_assert(!utf8_valid("\xf4\x90\x80\x80", 4, &bad)); /* > U+10FFFF */
	ck_assert(!utf8_valid("ab\xe2\x82", 4, &bad));         /* cut short */
	ck_assert_uint_eq(bad, 2);
	strcpy(buf, "ab\xe2\x82");
	utf8_cut(buf);
	ck_assert_str_eq(buf, "ab");
	/* a message cut by its buffer ends on a character boundary */
	for (size_t pad = 0; pad < 4; pad++) {
		char big[2000];

		memset(big, 'x', pad);
		for (size_t i = pad; i + 2 < sizeof(big); i += 2) {
			big[i] = (char)0xc3;
			big[i + 1] = (char)0xa9;
			big[i + 2] = '\0';
		}
		refit_err_clear(&err);
		refit_err_set(&err, REFIT_ERR_INVALID_ARG, "%s", big);
		ck_assert(utf8_valid(err.msg, strlen(err.msg), NULL));
		ck_assert_uint_ge(strlen(err.msg), sizeof(err.msg) - 3);
		refit_err_prefix(&err, "%s", big);
		ck_assert(utf8_valid(err.msg, strlen(err.msg), NULL));
		refit_err_clear(&err);
		refit_err_set(&err, REFIT_ERR_INVALID_ARG, "short");
		refit_err_prefix(&err, "%.*s", (int)(sizeof(err.msg) - 2 - pad), big);
		ck_assert(utf8_valid(err.msg, strlen(err.msg), NULL));
	}
}
END_TEST

/* The FIPS 180-4 example vectors with the implementation in use. */
static void
sha256_check_vectors(void)
{
	char hex[SHA256_HEX_LEN];
	sha256_ctx_t c;
	uint8_t d[SHA256_DIGEST_LEN];
	char *million = xmalloc(1000000);

	sha256_hex("", 0, hex);
	ck_assert_str_eq(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
	sha256_hex("abc", 3, hex);
	ck_assert_str_eq(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
	sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", 56, hex);
	ck_assert_str_eq(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
	sha256_hex("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmno"
		   "ijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu", 112, hex);
	ck_assert_str_eq(hex, "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
	/* the million-'a' vector, fed in uneven pieces, then in one call */
	memset(million, 'a', 1000000);
	sha256_init(&c);
	for (size_t off = 0, step = 1; off < 1000000; off += step, step = step * 3 % 997 + 1)
		sha256_update(&c, million + off, off + step > 1000000 ? 1000000 - off : step);
	sha256_final(&c, d);
	sha256_to_hex(d, hex);
	ck_assert_str_eq(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
	sha256_hex(million, 1000000, hex);
	ck_assert_str_eq(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
	free(million);
}

START_TEST(sha256_vectors)
{
	ck_assert(sha256_impl_set(SHA256_IMPL_PORTABLE));
	ck_assert_int_eq(sha256_impl_get(), SHA256_IMPL_PORTABLE);
	sha256_check_vectors();
	if (sha256_impl_set(SHA256_IMPL_SHANI)) {
		ck_assert_int_eq(sha256_impl_get(), SHA256_IMPL_SHANI);
		sha256_check_vectors();
	} else {
		fprintf(stderr, "sha256_vectors: no SHA-NI here, the portable rounds alone\n");
	}
	ck_assert(sha256_impl_set(SHA256_IMPL_AUTO));
	ck_assert_int_ne(sha256_impl_get(), SHA256_IMPL_AUTO);
}
END_TEST

/* Digest of msg[0..n) fed in pieces cut at random points. */
static void
sha256_split(const uint8_t *msg, size_t n, uint32_t *seed, uint8_t d[SHA256_DIGEST_LEN])
{
	sha256_ctx_t c;
	size_t off = 0;

	sha256_init(&c);
	while (off < n) {
		size_t take;

		*seed = *seed * 1103515245u + 12345u;
		take = (*seed >> 8) % (n - off + 1);
		sha256_update(&c, msg + off, take);
		off += take;
	}
	sha256_final(&c, d);
}

/* Both implementations agree on every length 0..300 (random bytes,
 * random splits) and on long messages. */
START_TEST(sha256_impls_agree)
{
	uint8_t msg[4096], a[SHA256_DIGEST_LEN], b[SHA256_DIGEST_LEN];
	uint32_t seed = 12345, sa, sb;

	if (!sha256_impl_set(SHA256_IMPL_SHANI)) {
		fprintf(stderr, "sha256_impls_agree: no SHA-NI here, nothing to compare\n");
		return;
	}
	for (size_t i = 0; i < sizeof(msg); i++) {
		seed = seed * 1103515245u + 12345u;
		msg[i] = (uint8_t)(seed >> 16);
	}
	for (size_t n = 0; n <= 300; n++) {
		sa = sb = (uint32_t)n * 7919u + 1;
		ck_assert(sha256_impl_set(SHA256_IMPL_PORTABLE));
		sha256_split(msg, n, &sa, a);
		ck_assert(sha256_impl_set(SHA256_IMPL_SHANI));
		sha256_split(msg, n, &sb, b);
		ck_assert_msg(memcmp(a, b, sizeof(a)) == 0, "length %zu: digests differ", n);
		/* a different split gives the same digest */
		sb = (uint32_t)n + 99;
		sha256_split(msg, n, &sb, b);
		ck_assert_msg(memcmp(a, b, sizeof(a)) == 0, "length %zu: split changed it", n);
	}
	for (size_t n = 1000; n <= sizeof(msg); n += 1031) {
		sa = sb = 7;
		ck_assert(sha256_impl_set(SHA256_IMPL_PORTABLE));
		sha256_split(msg, n, &sa, a);
		ck_assert(sha256_impl_set(SHA256_IMPL_SHANI));
		sha256_split(msg, n, &sb, b);
		ck_assert_msg(memcmp(a, b, sizeof(a)) == 0, "length %zu: digests differ", n);
	}
	ck_assert(sha256_impl_set(SHA256_IMPL_AUTO));
}
END_TEST

START_TEST(err_first_wins)
{
	refit_err_t e;

	refit_err_clear(&e);
	ck_assert_int_eq(refit_err_set(&e, REFIT_ERR_INVALID_ARG, "first %d", 1),
			 REFIT_ERR_INVALID_ARG);
	ck_assert_int_eq(refit_err_set(&e, REFIT_ERR_SYS, "second"), REFIT_ERR_SYS);
	ck_assert_int_eq(e.status, REFIT_ERR_INVALID_ARG);
	ck_assert_str_eq(e.msg, "first 1");
	refit_err_prefix(&e, "file %s", "x.json");
	ck_assert_str_eq(e.msg, "file x.json: first 1");
	ck_assert_int_eq(refit_err_set(NULL, REFIT_ERR_SYS, "ignored"), REFIT_ERR_SYS);
	ck_assert_str_eq(refit_status_str(REFIT_ERR_STALE_EPOCH), "ERR_STALE_EPOCH");
	ck_assert_str_eq(refit_status_str((refit_status_t)999), "ERR_UNKNOWN");
}
END_TEST

START_TEST(err_prefix_truncates)
{
	refit_err_t e;
	char big[600];

	memset(big, 'x', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	refit_err_clear(&e);
	refit_err_set(&e, REFIT_ERR_INVALID_ARG, "%s", big);
	refit_err_prefix(&e, "pre");
	ck_assert_uint_eq(strlen(e.msg), REFIT_ERR_MSG_MAX - 1);
	ck_assert(strncmp(e.msg, "pre: xxx", 8) == 0);
}
END_TEST

START_TEST(strbuf_grows_and_escapes)
{
	strbuf_t sb;
	int64_t v[3] = {1, -2, 3};

	strbuf_init(&sb);
	for (int i = 0; i < 1000; i++)
		strbuf_printf(&sb, "%d,", i);
	ck_assert_uint_eq(sb.len, strlen(sb.s));
	strbuf_reset(&sb);
	strbuf_json_str(&sb, "a\"b\\c\n");
	ck_assert_str_eq(sb.s, "\"a\\\"b\\\\c\\u000a\"");
	strbuf_reset(&sb);
	strbuf_i64_list(&sb, v, 3);
	ck_assert_str_eq(sb.s, "[1, -2, 3]");
	strbuf_fini(&sb);
}
END_TEST

START_TEST(parse_sizes)
{
	uint64_t v;
	refit_err_t e;

	ck_assert_int_eq(refit_parse_size("4194304", &v, "x", NULL), REFIT_OK);
	ck_assert_uint_eq(v, 4194304);
	ck_assert_int_eq(refit_parse_size("4M", &v, "x", NULL), REFIT_OK);
	ck_assert_uint_eq(v, 4u << 20);
	ck_assert_int_eq(refit_parse_size("2GiB", &v, "x", NULL), REFIT_OK);
	ck_assert_uint_eq(v, 2ull << 30);
	ck_assert_int_eq(refit_parse_size("64kb", &v, "x", NULL), REFIT_OK);
	ck_assert_uint_eq(v, 64u << 10);
	refit_err_clear(&e);
	ck_assert_int_eq(refit_parse_size("4X", &v, "--chunk-bytes", &e), REFIT_ERR_INVALID_ARG);
	ck_assert_str_eq(e.msg, "--chunk-bytes: \"4X\" is not a size (e.g. 4194304, 4M, 4MiB)");
	ck_assert_int_eq(refit_parse_size("-1", &v, "x", NULL), REFIT_ERR_INVALID_ARG);
	ck_assert_int_eq(refit_parse_size("99999999999999999999T", &v, "x", NULL),
			 REFIT_ERR_INVALID_ARG);
	ck_assert_int_eq(refit_parse_u64("17", 1, 20, &v, "n", NULL), REFIT_OK);
	ck_assert_uint_eq(v, 17);
	ck_assert_int_eq(refit_parse_u64("21", 1, 20, &v, "n", NULL), REFIT_ERR_INVALID_ARG);
	ck_assert_int_eq(refit_parse_u64("1x", 1, 20, &v, "n", NULL), REFIT_ERR_INVALID_ARG);
}
END_TEST

START_TEST(vec_push)
{
	VEC(int) v = {0};

	for (int i = 0; i < 10000; i++)
		VEC_PUSH(&v, i);
	ck_assert_uint_eq(v.n, 10000);
	ck_assert_int_eq(v.v[9999], 9999);
	VEC_FREE(&v);
	ck_assert_ptr_null(v.v);
}
END_TEST

START_TEST(strmap_intern)
{
	strmap_t m;
	char key[32];

	strmap_init(&m);
	ck_assert_int_eq(strmap_get(&m, "absent"), -1);
	for (int i = 0; i < 5000; i++) {
		snprintf(key, sizeof(key), "node%d", i);
		strmap_put(&m, key, i);
	}
	for (int i = 0; i < 5000; i++) {
		snprintf(key, sizeof(key), "node%d", i);
		ck_assert_int_eq(strmap_get(&m, key), i);
	}
	strmap_put(&m, "node7", 70);
	ck_assert_int_eq(strmap_get(&m, "node7"), 70);
	ck_assert_uint_eq(m.n, 5000);
	ck_assert_int_eq(strmap_get(&m, "node5000"), -1);
	strmap_fini(&m);
}
END_TEST

START_TEST(log_levels)
{
	ck_assert_int_eq(log_level_parse("debug"), LOG_LVL_DEBUG);
	ck_assert_int_eq(log_level_parse("warn"), LOG_LVL_WARN);
	ck_assert_int_eq(log_level_parse("verbose"), -1);
	/* emitting at any level must not crash, with and without context */
	log_init("test", LOG_LVL_DEBUG, LOG_SUB_ALL);
	log_set_context(&(log_context_t){"node1", 3, 7, 42});
	log_info("hello %d", 1);
	log_debug(LOG_SUB_PLAN, "debug line");
	errno = ENOENT;
	log_warn("with errno");
	ck_assert_int_eq(errno, ENOENT);
}
END_TEST

START_TEST(crc32c_vectors)
{
	uint8_t buf[1000];
	uint32_t a, b;

	ck_assert_uint_eq(crc32c(0, "123456789", 9), 0xE3069283u);
	ck_assert_uint_eq(crc32c_sw(0, "123456789", 9), 0xE3069283u);
	ck_assert_uint_eq(crc32c(0, "", 0), 0);
	memset(buf, 0, 32);
	ck_assert_uint_eq(crc32c(0, buf, 32), 0x8A9136AAu); /* RFC 3720 B.4 */
	memset(buf, 0xff, 32);
	ck_assert_uint_eq(crc32c(0, buf, 32), 0x62A8AB43u);
	for (size_t i = 0; i < sizeof(buf); i++)
		buf[i] = (uint8_t)(i * 31 + 7);
	for (size_t n = 0; n < sizeof(buf); n += 37) {
		a = crc32c(0, buf, n);
		b = crc32c_sw(0, buf, n);
		ck_assert_uint_eq(a, b);
		/* streaming equals one shot */
		ck_assert_uint_eq(crc32c(crc32c(0, buf, n / 3), buf + n / 3, n - n / 3), a);
	}
}
END_TEST

Suite *
suite_common(void)
{
	return th_suite("common", th_tcase("core", 0, TH_TESTS(sha256_vectors,
			sha256_impls_agree, err_first_wins,
			err_prefix_truncates, strbuf_grows_and_escapes, parse_sizes, vec_push,
			strmap_intern, log_levels, crc32c_vectors, utf8_checks)), NULL);
}
