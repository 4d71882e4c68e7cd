/*
 * test_etcd_watch.c - what an answer on an etcd Watch stream means
 * (rpc/etcd_watch_resp.c): created, a change (events) and the revision it
 * brings, a progress answer (no events; watch id -1 as etcd v3.4 answers
 * a progress request), an answer for another watch id, and the watch lost
 * when etcd canceled it (its reason kept) or compacted its start
 * revision away (compact_revision set, canceled or not).
 */
#include <string.h>

#include "rpc/etcd_watch.h"
#include "tests/unit/helpers.h"

static etcd_watch_what_t
classify(const etcd_watch_resp_t *r, int64_t *rev, char *why)
{
	return etcd_watch_classify(r, 0, 42, rev, why, 256);
}

START_TEST(created_and_changed)
{
	etcd_watch_resp_t r = {.revision = 41, .created = true};
	char why[256];
	int64_t rev;

	ck_assert_int_eq(classify(&r, &rev, why), ETCD_WATCH_CREATED);
	ck_assert_int_eq(rev, 41);
	r = (etcd_watch_resp_t){.revision = 50, .n_events = 2, .last_mod_rev = 47};
	ck_assert_int_eq(classify(&r, &rev, why), ETCD_WATCH_CHANGED);
	ck_assert_int_eq(rev, 47);
	r.last_mod_rev = 0;  /* no kv in the event: the header's */
	ck_assert_int_eq(classify(&r, &rev, why), ETCD_WATCH_CHANGED);
	ck_assert_int_eq(rev, 50);
	ck_assert_str_eq(etcd_watch_what_name(ETCD_WATCH_CHANGED), "changed");
}
END_TEST

START_TEST(progress_answers)
{
	etcd_watch_resp_t r = {.revision = 60, .watch_id = -1};
	char why[256];
	int64_t rev;

	ck_assert_int_eq(classify(&r, &rev, why), ETCD_WATCH_PROGRESS);
	ck_assert_int_eq(rev, 60);
	r.watch_id = 0;
	ck_assert_int_eq(classify(&r, &rev, why), ETCD_WATCH_PROGRESS);
	/* another watch's events are no news of this one's keys */
	r = (etcd_watch_resp_t){.revision = 61, .watch_id = 7, .n_events = 1,
				.last_mod_rev = 61};
	ck_assert_int_eq(classify(&r, &rev, why), ETCD_WATCH_PROGRESS);
	ck_assert_ptr_nonnull(strstr(why, "watch 7, not 0"));
}
END_TEST

START_TEST(lost_when_canceled_or_compacted)
{
	etcd_watch_resp_t r = {.revision = 70, .canceled = true,
			       .cancel_reason = "etcdserver: mvcc: required revision is a future "
						"revision"};
	char why[256];
	int64_t rev;

	ck_assert_int_eq(classify(&r, &rev, why), ETCD_WATCH_LOST);
	ck_assert_int_eq(rev, 0);
	ck_assert_ptr_nonnull(strstr(why, "etcd canceled the watch: etcdserver: mvcc"));
	r.cancel_reason = NULL;
	ck_assert_int_eq(classify(&r, &rev, why), ETCD_WATCH_LOST);
	ck_assert_str_eq(why, "etcd canceled the watch");
	/* compacted: lost even with events or created in the same answer */
	r = (etcd_watch_resp_t){.revision = 90, .canceled = true, .compact_revision = 80};
	ck_assert_int_eq(classify(&r, &rev, why), ETCD_WATCH_LOST);
	ck_assert_str_eq(why, "revision 42 compacted away (etcd keeps from 80)");
	r = (etcd_watch_resp_t){.revision = 90, .created = true, .n_events = 1,
				.compact_revision = 80};
	ck_assert_int_eq(classify(&r, &rev, why), ETCD_WATCH_LOST);
}
END_TEST

Suite *
suite_etcd_watch(void)
{
	return th_suite("etcd_watch", th_tcase("etcd_watch", 0, TH_TESTS(
				created_and_changed, progress_answers,
				lost_when_canceled_or_compacted)),
			NULL);
}
