/*
 * test_coord_rules.c - the coordinator's membership and registry rules
 * (daemon/coord/coord_rules.h) as pure functions: who may join with which
 * ranks, ranks no member holds, ranks two replicas share.  Each case is a
 * row: the records, the input, the status and the words the error must
 * quote.
 */
#include <string.h>

#include "daemon/coord/coord_rules.h"
#include "tests/unit/helpers.h"

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

static rank_info_t ranks_a[] = {{0, "d0"}, {1, "d0"}};
static rank_info_t ranks_b[] = {{4, "d1"}};
static member_t members[] = {
	{.id = 1, .node_id = "a", .ranks = ranks_a, .nranks = 2},
	{.id = 2, .node_id = "b", .ranks = ranks_b, .nranks = 1},
};

START_TEST(join)
{
	static const struct {
		const char *node;
		int32_t ranks[4];
		size_t n;
		refit_status_t want;
		const char *says;
	} rows[] = {
		{"c", {7, 8}, 2, REFIT_OK, NULL},
		{"a", {0, 1, 2}, 3, REFIT_OK, NULL},          /* a rejoin keeps its ranks */
		{"", {7}, 1, REFIT_ERR_INVALID_ARG, "node_id is empty"},
		{NULL, {7}, 1, REFIT_ERR_INVALID_ARG, "node_id is empty"},
		{"c", {0}, 0, REFIT_ERR_INVALID_ARG, "Join \"c\": no ranks"},
		{"c", {7, -1}, 2, REFIT_ERR_INVALID_ARG, "rank -1 is out of range"},
		{"c", {PLAN_MAX_RANK_ID}, 1, REFIT_ERR_INVALID_ARG, "is out of range"},
		{"c", {PLAN_MAX_RANK_ID - 1}, 1, REFIT_OK, NULL},
		{"c", {7, 4}, 2, REFIT_ERR_EXISTS, "rank 4 already belongs to node \"b\""},
		{"b", {1}, 1, REFIT_ERR_EXISTS, "rank 1 already belongs to node \"a\""},
		{"c", {7, 9, 7}, 3, REFIT_ERR_INVALID_ARG, "rank 7 listed twice"},
	};

	for (size_t i = 0; i < NELEM(rows); i++) {
		refit_err_t err;

		refit_err_clear(&err);
		ck_assert_msg(coord_rules_join(members, NELEM(members), rows[i].node,
					       rows[i].ranks, rows[i].n, &err) == rows[i].want,
			      "row %zu: %s", i, err.msg);
		if (rows[i].says != NULL)
			ck_assert_msg(strstr(err.msg, rows[i].says) != NULL, "row %zu: \"%s\"", i,
				      err.msg);
	}
	/* nobody a member yet */
	{
		refit_err_t err;

		refit_err_clear(&err);
		ck_assert_int_eq(coord_rules_join(NULL, 0, "x", (int32_t[]){0}, 1, &err), REFIT_OK);
	}
}
END_TEST

#define T(name, mesh) "{\"name\":\"" name "\",\"dtype\":\"fp32\",\"shape\":[8]," \
		      "\"mesh\":" mesh ",\"placements\":[\"Shard(0)\"]}"

START_TEST(unheld_rank)
{
	static const struct {
		const char *json;
		int32_t want;
		size_t tensor;
	} rows[] = {
		{"{\"tensors\":[" T("w", "[0,1]") "," T("b", "[4]") "]}", -1, 0},
		{"{\"tensors\":[" T("w", "[0,1]") "," T("b", "[4,5]") "]}", 5, 1},
		{"{\"tensors\":[" T("w", "[3]") "]}", 3, 0},
	};

	for (size_t i = 0; i < NELEM(rows); i++) {
		plan_layout_set_t s;
		size_t t = 99;

		th_layouts(rows[i].json, &s);
		ck_assert_int_eq(coord_rules_unheld_rank(members, NELEM(members), &s, &t),
				 rows[i].want);
		if (rows[i].want >= 0)
			ck_assert_uint_eq(t, rows[i].tensor);
		ck_assert_int_eq(coord_rules_unheld_rank(NULL, 0, &s, &t),
				 s.v[0].shards[0].rank);
		plan_layout_set_fini(&s);
	}
}
END_TEST

START_TEST(own_ranks)
{
	static const struct {
		const char *iname, *json;
		refit_status_t want;
		const char *says;
	} rows[] = {
		{"i2", "{\"tensors\":[" T("w", "[6,7]") "]}", REFIT_OK, NULL},
		{"i2", "{\"tensors\":[" T("w", "[7,3]") "]}", REFIT_ERR_INVALID_ARG,
		 "instance \"i2\" uses rank 3, which instance \"i1\" uses too"},
		{"i1", "{\"tensors\":[" T("w", "[2,3]") "]}", REFIT_OK, NULL},   /* itself, again */
		{"i2", "{\"tensors\":[" T("w", "[0]") "]}", REFIT_OK, NULL},     /* the trainer's rank */
	};
	model_t m = {.name = "mod"};
	instance_t tr = {.name = "t", .role = COORD_ROLE_TRAIN};
	instance_t i1 = {.name = "i1", .role = COORD_ROLE_INFER};

	th_layouts("{\"tensors\":[" T("w", "[0,1]") "]}", &tr.layouts);
	th_layouts("{\"tensors\":[" T("w", "[2,3]") "]}", &i1.layouts);
	VEC_PUSH(&m.inst, tr);
	VEC_PUSH(&m.inst, i1);
	for (size_t i = 0; i < NELEM(rows); i++) {
		plan_layout_set_t s;
		refit_err_t err;

		th_layouts(rows[i].json, &s);
		refit_err_clear(&err);
		ck_assert_msg(coord_rules_own_ranks(&m, rows[i].iname, &s, &err) == rows[i].want,
			      "row %zu: %s", i, err.msg);
		if (rows[i].says != NULL) {
			ck_assert_msg(strstr(err.msg, rows[i].says) != NULL, "row %zu: \"%s\"", i,
				      err.msg);
			ck_assert_ptr_nonnull(strstr(err.msg, "refitctl unregister mod i1"));
		}
		plan_layout_set_fini(&s);
	}
	for (size_t i = 0; i < m.inst.n; i++)
		plan_layout_set_fini(&m.inst.v[i].layouts);
	VEC_FREE(&m.inst);
}
END_TEST

START_TEST(shared_rank)
{
	plan_layout_set_t a, b, e;

	th_layouts("{\"tensors\":[" T("w", "[0,1]") "," T("b", "[5]") "]}", &a);
	th_layouts("{\"tensors\":[" T("w", "[5,6]") "]}", &b);
	plan_layout_set_init(&e);
	ck_assert_int_eq(coord_rules_shared_rank(&a, &b), 5);
	ck_assert_int_eq(coord_rules_shared_rank(&b, &a), 5);
	ck_assert_int_eq(coord_rules_shared_rank(&a, &e), -1);
	ck_assert_int_eq(coord_rules_shared_rank(&e, &a), -1);
	plan_layout_set_fini(&a);
	plan_layout_set_fini(&b);
}
END_TEST

/* A peer's view of a failure is a symptom; a failure of its own is a cause
 * (a killed nccl node's peers report NCCL's remote error: before, that
 * named a survivor as the cause). */
START_TEST(symptoms)
{
	static const struct {
		const char *msg;
		bool symptom;
	} rows[] = {
		{"tcp: recv from rank 4: connection reset by peer", true},
		{"nccl transport: point-to-point group (rank 5): remote process exited or there "
		 "was a network error", true},
		{"aborted by the coordinator: node f2 failed", true},
		{"unreachable during its slice (UNAVAILABLE)", false},
		{"127.0.0.1:4000 RunSlice: UNAVAILABLE: Socket closed", false},
		{"nccl transport: cudaMemcpy: out of memory (cudaError 2)", false},
		{"", false},
	};

	for (size_t i = 0; i < NELEM(rows); i++)
		ck_assert_msg(coord_rules_is_symptom(rows[i].msg) == rows[i].symptom, "row %zu: %s",
			      i, rows[i].msg);
}
END_TEST

/* The trigger policy: manual starts nothing, on_ready starts the pending
 * version when nothing of the model is in flight and the interval passed;
 * a pending version not newer than the installed one is dropped. */
START_TEST(trigger)
{
	model_t m = {.on_ready = false, .pending_version = 5};

	ck_assert_int_eq(coord_rules_trigger(&m, false, 1000), COORD_TRIGGER_NONE);
	m.on_ready = true;
	m.pending_version = 0;
	ck_assert_int_eq(coord_rules_trigger(&m, false, 1000), COORD_TRIGGER_NONE);
	m.pending_version = 5;
	ck_assert_int_eq(coord_rules_trigger(&m, false, 1000), COORD_TRIGGER_GO);
	ck_assert_int_eq(coord_rules_trigger(&m, true, 1000), COORD_TRIGGER_BUSY);
	m.min_interval_ms = 500;
	m.policy_start_ms = 800;
	ck_assert_int_eq(coord_rules_trigger(&m, false, 1299), COORD_TRIGGER_INTERVAL);
	ck_assert_int_eq(coord_rules_trigger(&m, false, 1300), COORD_TRIGGER_GO);
	m.installed_version = 5;
	ck_assert_int_eq(coord_rules_trigger(&m, true, 1300), COORD_TRIGGER_STALE);
	m.installed_version = 4;
	ck_assert_int_eq(coord_rules_trigger(&m, true, 1300), COORD_TRIGGER_BUSY);
}
END_TEST

/* Only the newest ready version waits; each one it replaces is counted;
 * manual notes nothing; an older or equal version changes nothing. */
START_TEST(trigger_note)
{
	model_t m = {.on_ready = false};

	ck_assert(!coord_rules_trigger_note(&m, 2));
	ck_assert_uint_eq(m.pending_version, 0);
	m.on_ready = true;
	ck_assert(!coord_rules_trigger_note(&m, 2));
	ck_assert_uint_eq(m.pending_version, 2);
	for (uint64_t v = 3; v <= 6; v++)
		ck_assert(coord_rules_trigger_note(&m, v));
	ck_assert_uint_eq(m.pending_version, 6);
	ck_assert_uint_eq(m.skipped_versions, 4);
	ck_assert(!coord_rules_trigger_note(&m, 6));
	ck_assert(!coord_rules_trigger_note(&m, 4));
	ck_assert_uint_eq(m.pending_version, 6);
	ck_assert_uint_eq(m.skipped_versions, 4);
}
END_TEST

Suite *
suite_coord_rules(void)
{
	return th_suite("coord_rules",
			th_tcase("core", 0,
				 TH_TESTS(join, unheld_rank, own_ranks, shared_rank, symptoms, trigger,
					  trigger_note)),
			NULL);
}
