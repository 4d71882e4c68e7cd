/*
 * test_delta_base.c - a node's delta bases (daemon/node/delta_base.c) and a
 * slice's units encoded against them (slice_delta.c): bounded memory, one
 * slice per table, another plan's bases dropped; a unit round trip byte for
 * byte; a receiver that lacks the named base refuses the unit; a receiver
 * without room for some bases reports those messages alone.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/node/delta_base.h"
#include "daemon/node/slice_delta.h"
#include "tests/unit/helpers.h"

START_TEST(store_is_bounded)
{
	delta_store_t *st = delta_store_new(1000, 10);
	delta_tab_t *t = delta_tab_take(st, "m", "d1", "peer", true, 3), *u;

	ck_assert_ptr_nonnull(t);
	/* a second slice gets no table while one holds it (after its wait) */
	ck_assert_ptr_null(delta_tab_take(st, "m", "d1", "peer", true, 3));
	ck_assert_ptr_nonnull(delta_ent_get(st, t, 0, 600, 2));
	ck_assert_uint_eq(delta_store_used(st), 600 + 2 * sizeof(uint64_t));
	/* no room: none, never more than the bound */
	ck_assert_ptr_null(delta_ent_get(st, t, 1, 600, 2));
	ck_assert_ptr_null(delta_ent_get(st, t, 3, 10, 1));   /* past the table */
	ck_assert_ptr_nonnull(delta_ent_get(st, t, 2, 100, 1));
	ck_assert_uint_le(delta_store_used(st), 1000);
	delta_tab_release(st, t);
	/* the same plan again: the bases are there */
	t = delta_tab_take(st, "m", "d1", "peer", true, 3);
	ck_assert_ptr_nonnull(delta_ent_find(t, 0, 600, 2));
	ck_assert_ptr_null(delta_ent_find(t, 0, 601, 2));  /* another message's shape */
	delta_tab_release(st, t);
	/* another plan of the model: its old bases go */
	u = delta_tab_take(st, "m", "d2", "peer", true, 1);
	ck_assert_ptr_nonnull(u);
	ck_assert_uint_eq(delta_store_used(st), 0);
	delta_tab_release(st, u);
	delta_store_free(st);
}
END_TEST

typedef struct holder {
	delta_store_t *st;
	delta_tab_t *t;
} holder_t;

static void *
release_later(void *arg)
{
	holder_t *h = arg;

	usleep(50000);
	delta_tab_release(h->st, h->t);
	return NULL;
}

/* A slice waiting for a table the slice before still holds (an aborted one
 * ending) gets it once released, within the store's wait. */
START_TEST(waits_for_a_held_table)
{
	delta_store_t *st = delta_store_new(1000, 10000);
	holder_t h = {st, delta_tab_take(st, "m", "d", "p", false, 1)};
	pthread_t th;
	delta_tab_t *t;

	ck_assert_ptr_nonnull(h.t);
	ck_assert_int_eq(pthread_create(&th, NULL, release_later, &h), 0);
	t = delta_tab_take(st, "m", "d", "p", false, 1);
	ck_assert_ptr_eq(t, h.t);
	pthread_join(th, NULL);
	delta_tab_release(st, t);
	delta_store_free(st);
}
END_TEST

/* One message of two parts (64 and 40 bytes, the second at offset 64). */
static const plan_part_t parts[2] = {{.bytes = 64, .off = 0}, {.bytes = 40, .off = 64}};
static const plan_msg_t msg = {.bytes = 104, .parts = parts, .nparts = 2};

/* Node a (0) sends one message to node b (1); rxok: what b was told. */
static void
unit_pair2(sdelta_t *tx, sdelta_t *rx, delta_store_t *a, delta_store_t *b, uint64_t tag,
	   uint64_t base, const bool *ok, const bool *rxok)
{
	static const char *const ids[2] = {"a", "b"};
	static const size_t none[2] = {0, 0}, out[2] = {0, 1}, in[2] = {1, 0};

	sdelta_init(tx, a, "m", "dg", ids, out, none, 2, 0, tag, base, ok, 200);
	sdelta_init(rx, b, "m", "dg", ids, none, in, 2, 1, tag, base, rxok, 200);
}

static void
unit_pair(sdelta_t *tx, sdelta_t *rx, delta_store_t *a, delta_store_t *b, uint64_t tag,
	  uint64_t base, const bool *ok)
{
	unit_pair2(tx, rx, a, b, tag, base, ok, ok);
}

/* Send msg (dense bytes d, 4 trailer bytes after) from a to b: true when it
 * went encoded; *err when b refused it. */
static refit_status_t
send_unit(sdelta_t *tx, sdelta_t *rx, const uint8_t *d, bool *enc, uint8_t *got,
	  refit_err_t *err)
{
	const uint8_t *w, *dense;
	uint64_t wl;

	refit_err_clear(err);
	sdelta_out(tx, 1, 0, &msg, 0, 2, 2, d, 108, 4, &w, &wl, enc);
	if (*enc) {
		CHECK(sdelta_in(rx, 0, "a", 0, &msg, 0, 2, 2, w, wl, 4, &dense, err));
	} else {
		ck_assert_uint_eq(wl, 108);
		dense = w;
	}
	memcpy(got, dense, 108);
	sdelta_keep_in(rx, 0, 0, &msg, 0, 2, dense, 104);
	return REFIT_OK;
}

START_TEST(unit_round_trip_and_refusals)
{
	delta_store_t *a = delta_store_new(1 << 20, 10), *b = delta_store_new(1 << 20, 10);
	bool ok[2] = {true, true}, enc;
	uint8_t v1[108], v2[108], got[108];
	sdelta_t tx, rx;
	refit_err_t e;

	for (size_t i = 0; i < sizeof(v1); i++)
		v1[i] = (uint8_t)(i * 37 + 11);
	memcpy(v2, v1, sizeof(v2));
	v2[3] ^= 0x80;      /* a bf16 0.0 turning -0.0 is a change too */
	v2[70] = 0xff;
	v2[71] = 0x7f;      /* a NaN payload */
	/* refit 1: no base, dense; both keep it */
	unit_pair(&tx, &rx, a, b, 1, 0, ok);
	ck_assert_int_eq(send_unit(&tx, &rx, v1, &enc, got, &e), REFIT_OK);
	ck_assert(!enc);
	ck_assert(tx.kept && rx.kept);
	sdelta_fini(&tx);
	sdelta_fini(&rx);
	/* refit 2 against 1: encoded, smaller, byte-exact */
	unit_pair(&tx, &rx, a, b, 2, 1, ok);
	ck_assert_int_eq(send_unit(&tx, &rx, v2, &enc, got, &e), REFIT_OK);
	ck_assert(enc);
	ck_assert(tx.delta_wire < tx.delta_dense);
	ck_assert_mem_eq(got, v2, 108);
	sdelta_fini(&tx);
	sdelta_fini(&rx);
	/* refit 3 against 2 with the receiver's base damaged: refused (CRC) */
	unit_pair(&tx, &rx, a, b, 3, 2, ok);
	rx.in[0]->ent[0].data[5] ^= 1;
	ck_assert_int_eq(send_unit(&tx, &rx, v1, &enc, got, &e), REFIT_ERR_REMOTE);
	ck_assert_msg(strstr(e.msg, "CRC-32C") != NULL, "%s", e.msg);
	sdelta_fini(&tx);
	sdelta_fini(&rx);
	/* refit 4 naming base 2 again: the sender holds 3 now: dense */
	unit_pair(&tx, &rx, a, b, 4, 2, ok);
	ck_assert_int_eq(send_unit(&tx, &rx, v2, &enc, got, &e), REFIT_OK);
	ck_assert(!enc);
	sdelta_fini(&tx);
	sdelta_fini(&rx);
	/* refit 5 against 4, the receiver not among the nodes holding it: its
	 * sender goes dense; a delta frame reaching it anyway is refused */
	ok[1] = false;
	unit_pair(&tx, &rx, a, b, 5, 4, ok);
	ck_assert_int_eq(send_unit(&tx, &rx, v1, &enc, got, &e), REFIT_OK);
	ck_assert(!enc);
	sdelta_fini(&tx);
	sdelta_fini(&rx);
	unit_pair2(&tx, &rx, a, b, 6, 5, (const bool[]){true, true},
		   (const bool[]){false, true});
	ck_assert_int_eq(send_unit(&tx, &rx, v2, &enc, got, &e), REFIT_ERR_REMOTE);
	ck_assert(enc);
	ck_assert_msg(strstr(e.msg, "does not hold") != NULL, "%s", e.msg);
	sdelta_fini(&tx);
	sdelta_fini(&rx);
	delta_store_free(a);
	delta_store_free(b);
}
END_TEST

START_TEST(no_room_goes_dense)
{
	delta_store_t *a = delta_store_new(50, 10), *b = delta_store_new(1 << 20, 10);
	bool ok[2] = {true, true}, enc;
	uint8_t v[108] = {1}, got[108];
	sdelta_t tx, rx;
	refit_err_t e;

	for (uint64_t tag = 1; tag <= 2; tag++) {
		unit_pair(&tx, &rx, a, b, tag, tag - 1, ok);
		ck_assert_int_eq(send_unit(&tx, &rx, v, &enc, got, &e), REFIT_OK);
		ck_assert(!enc);
		/* a sender without room holds no entry: it sends the message
		 * dense next time by itself, nothing to report */
		ck_assert(tx.kept);
		ck_assert_mem_eq(got, v, 108);
		sdelta_fini(&tx);
		sdelta_fini(&rx);
	}
	delta_store_free(a);
	delta_store_free(b);
}
END_TEST

/* Message pos of two (each as msg) from a to b, dense bytes d: as send_unit. */
static refit_status_t
send_pos(sdelta_t *tx, sdelta_t *rx, size_t pos, const uint8_t *d, bool *enc, uint8_t *got,
	 refit_err_t *err)
{
	const uint8_t *w, *dense;
	uint64_t wl;

	refit_err_clear(err);
	sdelta_out(tx, 1, pos, &msg, 0, 2, 2, d, 108, 4, &w, &wl, enc);
	dense = w;
	if (*enc)
		CHECK(sdelta_in(rx, 0, "a", pos, &msg, 0, 2, 2, w, wl, 4, &dense, err));
	memcpy(got, dense, 108);
	sdelta_keep_in(rx, 0, pos, &msg, 0, 2, dense, 104);
	return REFIT_OK;
}

/*
 * A receiver with room for one message's base of two: it reports the other
 * one alone (bases kept, one lack), and the next refit, told of it, sends
 * that one dense and the first encoded, both byte-exact; told of nothing,
 * the lacking one goes encoded and is refused, never decoded.
 */
START_TEST(lacks_go_dense_alone)
{
	static const char *const ids[2] = {"a", "b"};
	static const size_t none[2] = {0, 0}, out[2] = {0, 2}, in[2] = {2, 0};
	delta_store_t *a = delta_store_new(1 << 20, 10), *b = delta_store_new(150, 10);
	const bool ok[2] = {true, true};
	uint32_t skip1[1] = {1}, *skip[2] = {NULL, skip1};
	const size_t nskip[2] = {0, 1};
	uint8_t v1[108], v2[108], got[108];
	slice_stats_t st = {0};
	sdelta_t tx, rx;
	refit_err_t e;
	bool enc;

	for (size_t i = 0; i < sizeof(v1); i++)
		v1[i] = (uint8_t)(i * 37 + 11);
	memcpy(v2, v1, sizeof(v2));
	v2[9] ^= 0x40;
	/* refit 1: dense; b keeps message 0 and has no room for message 1 */
	sdelta_init(&tx, a, "m", "dg", ids, out, none, 2, 0, 1, 0, ok, 200);
	sdelta_init(&rx, b, "m", "dg", ids, none, in, 2, 1, 1, 0, ok, 200);
	for (size_t pos = 0; pos < 2; pos++) {
		ck_assert_int_eq(send_pos(&tx, &rx, pos, v1, &enc, got, &e), REFIT_OK);
		ck_assert(!enc);
	}
	sdelta_end(&rx, &st, true);
	ck_assert(st.bases_kept);
	ck_assert_uint_eq(st.nlacks, 1);
	ck_assert_uint_eq(st.lacks[0], 0);      /* from node a (index 0) */
	ck_assert_uint_eq(st.lacks[1], 1);      /* message 1 */
	free(st.lacks);
	st = (slice_stats_t){0};
	sdelta_end(&tx, &st, true);
	ck_assert(st.bases_kept && st.nlacks == 0);
	/* refit 2 against 1, told that b lacks message 1 */
	sdelta_init(&tx, a, "m", "dg", ids, out, none, 2, 0, 2, 1, ok, 200);
	sdelta_init(&rx, b, "m", "dg", ids, none, in, 2, 1, 2, 1, ok, 200);
	tx.skip = skip;
	tx.nskip = nskip;
	ck_assert_int_eq(send_pos(&tx, &rx, 0, v2, &enc, got, &e), REFIT_OK);
	ck_assert(enc);
	ck_assert_mem_eq(got, v2, 108);
	ck_assert_int_eq(send_pos(&tx, &rx, 1, v2, &enc, got, &e), REFIT_OK);
	ck_assert(!enc);
	ck_assert_mem_eq(got, v2, 108);
	sdelta_fini(&tx);
	sdelta_fini(&rx);
	/* refit 3 against 2, told nothing: message 1 encoded, refused */
	sdelta_init(&tx, a, "m", "dg", ids, out, none, 2, 0, 3, 2, ok, 200);
	sdelta_init(&rx, b, "m", "dg", ids, none, in, 2, 1, 3, 2, ok, 200);
	ck_assert_int_eq(send_pos(&tx, &rx, 1, v1, &enc, got, &e), REFIT_ERR_REMOTE);
	ck_assert(enc);
	ck_assert_msg(strstr(e.msg, "does not hold") != NULL, "%s", e.msg);
	sdelta_fini(&tx);
	sdelta_fini(&rx);
	delta_store_free(a);
	delta_store_free(b);
}
END_TEST

/* Damaged delta frames from a peer (random bytes flipped, cut short): each
 * is refused with an error or decodes into the unit's bytes, never past
 * them (ASan in the unit tests' ASan build). */
START_TEST(damaged_frames_refused_or_contained)
{
	delta_store_t *a = delta_store_new(1 << 20, 10), *b = delta_store_new(1 << 20, 10);
	bool ok[2] = {true, true}, enc;
	uint8_t v1[108], v2[108], got[108], frame[256];
	const uint8_t *w, *dense;
	uint64_t wl;
	sdelta_t tx, rx;
	refit_err_t e;
	unsigned seed = 26;

	for (size_t i = 0; i < sizeof(v1); i++)
		v1[i] = v2[i] = (uint8_t)(i * 13);
	v2[10] ^= 1;
	v2[90] ^= 0x40;
	unit_pair(&tx, &rx, a, b, 1, 0, ok);
	ck_assert_int_eq(send_unit(&tx, &rx, v1, &enc, got, &e), REFIT_OK);
	sdelta_fini(&tx);
	sdelta_fini(&rx);
	unit_pair(&tx, &rx, a, b, 2, 1, ok);
	sdelta_out(&tx, 1, 0, &msg, 0, 2, 2, v2, 108, 4, &w, &wl, &enc);
	ck_assert(enc && wl <= sizeof(frame));
	for (int it = 0; it < 5000; it++) {
		uint64_t fl = wl, dl = 0;

		memcpy(frame, w, wl);
		for (int k = rand_r(&seed) % 3; k >= 0; k--)
			frame[rand_r(&seed) % wl] ^= (uint8_t)(1 + rand_r(&seed) % 255);
		if (rand_r(&seed) % 4 == 0)
			fl = (uint64_t)rand_r(&seed) % wl;
		refit_err_clear(&e);
		if (sdelta_frame_len(frame, fl, 4, &dl, &e) != REFIT_OK || dl != 104)
			continue;  /* push refuses it, or finds no unit of that length */
		refit_err_clear(&e);
		if (sdelta_in(&rx, 0, "a", 0, &msg, 0, 2, 2, frame, fl, 4, &dense, &e) != REFIT_OK)
			ck_assert_msg(e.msg[0] != '\0', "refused without a reason");
	}
	sdelta_fini(&tx);
	sdelta_fini(&rx);
	delta_store_free(a);
	delta_store_free(b);
}
END_TEST

/* Taken, a base of bytes at position 0 made, released: model's table
 * (peer p, received when !out). */
static void
hold_base(delta_store_t *st, const char *model, bool out, uint64_t bytes, bool made)
{
	delta_tab_t *t = delta_tab_take(st, model, "d", "p", out, 1);

	ck_assert_ptr_nonnull(t);
	ck_assert(made == (delta_ent_get(st, t, 0, bytes, 1) != NULL));
	delta_tab_release(st, t);
}

/* A base without room takes the room of other models' least recently
 * used tables, never the asking model's nor a held one; received bases
 * lost are noted for the coordinator, sent ones are not. */
START_TEST(evicts_other_models_lru)
{
	delta_store_t *st = delta_store_new(1000, 10);
	delta_tab_t *t, *c;
	char **ev;
	size_t n;

	hold_base(st, "a", false, 300, true);
	hold_base(st, "b", false, 300, true);
	hold_base(st, "o", true, 300, true);   /* 924 bytes held */
	t = delta_tab_take(st, "a", "d", "p", false, 1);  /* a used again: b is oldest */
	delta_tab_release(st, t);
	hold_base(st, "c", false, 300, true);  /* b goes, a and o stay */
	ck_assert_uint_eq(delta_store_evictions(st), 1);
	ck_assert_uint_le(delta_store_used(st), 1000);
	t = delta_tab_take(st, "a", "d", "p", false, 1);
	ck_assert_ptr_nonnull(delta_ent_find(t, 0, 300, 1));
	delta_tab_release(st, t);
	ev = delta_store_take_evicted(st, &n);
	ck_assert_uint_eq(n, 1);
	ck_assert_str_eq(ev[0], "b");
	free(ev[0]);
	free(ev);
	/* o (sent, oldest now) goes next, unreported; c, held, never */
	c = delta_tab_take(st, "c", "d", "p", false, 1);
	hold_base(st, "d", false, 300, true);
	ck_assert_uint_eq(delta_store_evictions(st), 2);
	ev = delta_store_take_evicted(st, &n);
	ck_assert_uint_eq(n, 0);
	free(ev);
	/* a base that fits only without c (held) or a's own: none, bounded */
	hold_base(st, "a", false, 700, false);
	ck_assert_uint_le(delta_store_used(st), 1000);
	ck_assert_ptr_nonnull(delta_ent_find(c, 0, 300, 1));
	delta_tab_release(st, c);
	delta_store_free(st);
}
END_TEST

/* The LRU order itself: oldest first among other models' tables that no
 * slice holds and that hold a base. */
START_TEST(lru_victim_order)
{
	delta_ent_t held = {(uint8_t *)"x", 1, NULL, 0}, none = {0};
	delta_tab_t t[5] = {
		{.model = "a", .used_at = 1, .ent = &held, .nent = 1},
		{.model = "b", .used_at = 2, .ent = &held, .nent = 1, .busy = true},
		{.model = "b", .used_at = 3, .ent = &none, .nent = 1},
		{.model = "b", .used_at = 5, .ent = &held, .nent = 1},
		{.model = "c", .used_at = 4, .ent = &held, .nent = 1},
	};
	const delta_tab_t *v[5] = {&t[0], &t[1], &t[2], &t[3], &t[4]};

	ck_assert_uint_eq(delta_lru_victim(v, 5, "z"), 0);
	ck_assert_uint_eq(delta_lru_victim(v, 5, "a"), 4);  /* 1 held, 2 empty */
	ck_assert_uint_eq(delta_lru_victim(v, 5, "c"), 0);
	ck_assert_uint_eq(delta_lru_victim(v + 1, 4, "c"), 2);  /* v[3] = t[3] */
	ck_assert_uint_eq(delta_lru_victim(v + 1, 3, "b"), SIZE_MAX);
	ck_assert_uint_eq(delta_lru_victim(v, 0, "a"), SIZE_MAX);
}
END_TEST

Suite *
suite_delta_base(void)
{
	return th_suite("delta_base",
			th_tcase("delta_base", 30,
				 TH_TESTS(store_is_bounded, waits_for_a_held_table,
					  unit_round_trip_and_refusals,
					  no_room_goes_dense, lacks_go_dense_alone,
					  damaged_frames_refused_or_contained,
					  evicts_other_models_lru, lru_victim_order)),
			NULL);
}
