/*
 * test_blame.c - naming the broken data link of a failed refit from every
 * node's report (daemon/coord/coord_blame.h): a concrete dial failure over
 * bystanders' deadlines, agreement between reports, a silent node, a
 * chain of waits, reports that name nothing, and the bounds of a report
 * and of the line.
 */
#include <string.h>

#include "daemon/coord/coord_blame.h"
#include "tests/unit/helpers.h"

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

static const char *const names[] = {"nf0", "nf1", "nf2", "nf3"};
static const char *const eps[] = {"10.0.0.1:7072", "10.0.0.2:7072", "10.0.0.3:7072",
				  "10.0.0.4:7072"};

/* Name the link from the four reports r; the line into out. */
static bool
name4(coord_blame_report_t *r, char *out, size_t len)
{
	const coord_blame_report_t *p[4] = {&r[0], &r[1], &r[2], &r[3]};

	return coord_blame_name(p, 4, names, eps, out, len);
}

/* Issue 28's case: nf0 cannot reach nf3's data port; nf0 stalled, so every
 * other node ran out of time waiting for it.  The dial failure wins over
 * three nodes' deadlines naming nf0. */
START_TEST(dial_over_deadlines)
{
	coord_blame_report_t r[4] = {{.how = COORD_BLAME_FAILED}, {.how = COORD_BLAME_DEADLINE},
				     {.how = COORD_BLAME_DEADLINE},
				     {.how = COORD_BLAME_DEADLINE}};
	char out[512];

	coord_blame_add(&r[0], COORD_BLAME_CONNECT, 3, 0, "Connection timed out");
	coord_blame_add(&r[1], COORD_BLAME_OWES, 0, 7, NULL);
	coord_blame_add(&r[2], COORD_BLAME_OWES, 0, 7, NULL);
	coord_blame_add(&r[3], COORD_BLAME_NEVER_CONNECTED, 0, 0, "never connected");
	ck_assert(name4(r, out, sizeof(out)));
	ck_assert_str_eq(out, "data link nf0 -> nf3: nf0 cannot connect to nf3's data port "
			      "10.0.0.4:7072: Connection timed out");
}
END_TEST

/* A node stopped mid-refit: the two it sends to ran out of time, it never
 * answered the coordinator; a bystander's own debts say nothing. */
START_TEST(stopped_sender)
{
	coord_blame_report_t r[4] = {{.how = COORD_BLAME_SILENT}, {.how = COORD_BLAME_DEADLINE},
				     {.how = COORD_BLAME_DEADLINE}, {.how = COORD_BLAME_NONE}};
	char out[512];

	coord_blame_add(&r[1], COORD_BLAME_OWES, 0, 12, NULL);
	coord_blame_add(&r[1], COORD_BLAME_OWED, 2, 3, NULL);
	coord_blame_add(&r[2], COORD_BLAME_OWES, 0, 10, NULL);
	ck_assert(name4(r, out, sizeof(out)));
	ck_assert_str_eq(out, "data link nf0 -> nf1: nf0 stopped sending: nf1 was still owed "
			      "12 messages at its slice deadline; also nf0 -> nf2 (10 messages) "
			      "(2 nodes' reports agree); node nf0 did not answer the "
			      "coordinator either");
}
END_TEST

/* nf0 -> nf1 -> nf2 relays; nf0 stopped: nf1 waited for nf0, nf2 for nf1.
 * Each is named once; nf1 was itself waiting, so nf0 is the cause. */
START_TEST(chain)
{
	coord_blame_report_t r[4] = {{.how = COORD_BLAME_DEADLINE}, {.how = COORD_BLAME_DEADLINE},
				     {.how = COORD_BLAME_DEADLINE}, {0}};
	char out[512];

	coord_blame_add(&r[0], COORD_BLAME_OWED, 1, 4, NULL);
	coord_blame_add(&r[2], COORD_BLAME_OWES, 1, 2, NULL);  /* the lower index first */
	coord_blame_add(&r[1], COORD_BLAME_OWES, 0, 4, NULL);
	coord_blame_add(&r[1], COORD_BLAME_OWED, 2, 2, NULL);
	ck_assert(name4(r, out, sizeof(out)));
	ck_assert_msg(strncmp(out, "data link nf0 -> nf1: nf0 stopped sending", 41) == 0, "%s",
		      out);
}
END_TEST

/* More nodes that cannot reach nf2 than nf1: nf2 is named, both dials. */
START_TEST(agreement)
{
	coord_blame_report_t r[4] = {{.how = COORD_BLAME_FAILED}, {.how = COORD_BLAME_FAILED},
				     {.how = COORD_BLAME_ABORTED}, {.how = COORD_BLAME_FAILED}};
	char out[512];

	coord_blame_add(&r[0], COORD_BLAME_CONNECT, 1, 0, "Connection refused");
	coord_blame_add(&r[0], COORD_BLAME_CONNECT, 2, 0, "Connection refused");
	coord_blame_add(&r[3], COORD_BLAME_HANDSHAKE, 2, 0, "no answer to the handshake");
	ck_assert(name4(r, out, sizeof(out)));
	ck_assert_str_eq(out, "data link nf0 -> nf2: nf0 cannot connect to nf2's data port "
			      "10.0.0.3:7072: Connection refused; also nf3 -> nf2 (no answer to "
			      "the handshake) (2 nodes' reports agree)");
}
END_TEST

/* A connection that broke counts from a node that failed by itself only:
 * an abort closes connections too. */
START_TEST(broken)
{
	coord_blame_report_t r[4] = {{.how = COORD_BLAME_ABORTED}, {.how = COORD_BLAME_FAILED},
				     {.how = COORD_BLAME_ABORTED}, {0}};
	char out[512];

	coord_blame_add(&r[0], COORD_BLAME_BROKEN, 1, 0, "the peer closed the connection");
	coord_blame_add(&r[1], COORD_BLAME_BROKEN, 2, 0, "Connection reset by peer");
	coord_blame_add(&r[2], COORD_BLAME_OWES, 1, 5, NULL);
	ck_assert(name4(r, out, sizeof(out)));
	ck_assert_str_eq(out, "data link nf1 -> nf2: the tcp connection broke: Connection "
			      "reset by peer");
	/* seen by the receiving end: the data went the other way */
	memset(r, 0, sizeof(r));
	r[3].how = COORD_BLAME_FAILED;
	coord_blame_add(&r[3], COORD_BLAME_BROKEN_IN, 0, 0, "the peer closed the connection");
	ck_assert(name4(r, out, sizeof(out)));
	ck_assert_str_eq(out, "data link nf0 -> nf3: the tcp connection broke: the peer "
			      "closed the connection (as nf3 saw it)");
}
END_TEST

/* Reports that point nowhere: successes, aborted nodes' debts, own debts. */
START_TEST(names_nothing)
{
	coord_blame_report_t r[4] = {{.how = COORD_BLAME_ABORTED}, {.how = COORD_BLAME_NONE},
				     {.how = COORD_BLAME_DEADLINE}, {.how = COORD_BLAME_SILENT}};
	char out[64] = "x";

	coord_blame_add(&r[0], COORD_BLAME_OWES, 1, 5, NULL);
	coord_blame_add(&r[0], COORD_BLAME_NEVER_CONNECTED, 2, 0, NULL);
	coord_blame_add(&r[2], COORD_BLAME_OWED, 1, 5, NULL);
	ck_assert(!name4(r, out, sizeof(out)));
	ck_assert_str_eq(out, "");
}
END_TEST

/* A report keeps COORD_BLAME_ISSUES issues, known kinds only, the first
 * link fault's words; the line is cut to its buffer. */
START_TEST(bounds)
{
	coord_blame_report_t r[4] = {{.how = COORD_BLAME_FAILED}, {0}, {0}, {0}};
	char out[40];

	coord_blame_add(&r[0], 0, 1, 0, "no kind");
	coord_blame_add(&r[0], 8, 1, 0, "no kind");
	ck_assert_uint_eq(r[0].nissues, 0);
	coord_blame_add(&r[0], COORD_BLAME_OWES, 2, 1ull << 40, NULL);
	ck_assert_uint_eq(r[0].issue[0].msgs, UINT32_MAX);
	for (int i = 0; i < 20; i++)
		coord_blame_add(&r[0], COORD_BLAME_CONNECT, 1, 0, i ? "second" : "first");
	ck_assert_uint_eq(r[0].nissues, COORD_BLAME_ISSUES);
	ck_assert_str_eq(r[0].detail, "first");
	ck_assert(name4(r, out, sizeof(out)));
	ck_assert_uint_eq(strlen(out), sizeof(out) - 1);
	ck_assert(strncmp(out, "data link nf0 -> nf1: ", 22) == 0);
}
END_TEST

Suite *
suite_blame(void)
{
	return th_suite("blame",
			th_tcase("core", 0,
				 TH_TESTS(dial_over_deadlines, stopped_sender, chain, agreement,
					  broken, names_nothing, bounds)),
			NULL);
}
