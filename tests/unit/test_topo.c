/*
 * test_topo.c - presets, topology JSON and its errors.
 */
#include <stdio.h>
#include <string.h>

#include "tests/unit/helpers.h"

START_TEST(presets)
{
	plan_topo_t t;
	refit_err_t e;

	th_topo("dgx-h100:20", &t);
	ck_assert_int_eq(t.nranks, 20);
	ck_assert_int_eq(t.nnodes, 3);
	ck_assert_int_eq(t.ndomains, 3);
	ck_assert_int_eq(plan_topo_domain(&t, 7), plan_topo_domain(&t, 0));
	ck_assert_int_ne(plan_topo_domain(&t, 8), plan_topo_domain(&t, 7));
	ck_assert_int_eq(t.domain_size[2], 4);
	ck_assert(t.network_gbps == 400 && t.nvlink_gbps == 3600);
	plan_topo_fini(&t);
	th_topo("gb200-nvl72:144", &t);
	ck_assert_int_eq(t.nnodes, 36);
	ck_assert_int_eq(t.ndomains, 2);
	ck_assert_int_eq(plan_topo_domain(&t, 71), 0);
	ck_assert_int_eq(plan_topo_domain(&t, 72), 1);
	ck_assert_int_ne(plan_topo_node(&t, 3), plan_topo_node(&t, 4));
	ck_assert_int_eq(plan_topo_domain(&t, 144), -1);
	ck_assert_int_eq(plan_topo_domain(&t, -1), -1);
	plan_topo_fini(&t);
	refit_err_clear(&e);
	ck_assert_int_eq(plan_topo_preset(&t, "dgx-a100:8", 0, &e), REFIT_ERR_INVALID_ARG);
	ck_assert_str_eq(e.msg, "topology \"dgx-a100:8\": unknown preset (known: dgx-h100, "
			 "hgx-h200, gb200-nvl72, host)");
	refit_err_clear(&e);
	ck_assert_int_eq(plan_topo_preset(&t, "dgx-h100:x", 0, &e), REFIT_ERR_INVALID_ARG);
	refit_err_clear(&e);
	ck_assert_int_eq(plan_topo_preset(&t, "dgx-h100", 0, &e), REFIT_ERR_INVALID_ARG);
	ck_assert_str_eq(e.msg, "topology \"dgx-h100\": give the rank count as dgx-h100:RANKS");
	ck_assert_int_eq(plan_topo_preset(&t, "dgx-h100", 16, NULL), REFIT_OK);
	ck_assert_int_eq(t.nranks, 16);
	plan_topo_fini(&t);
}
END_TEST

static const char *
topo_err(const char *json)
{
	static refit_err_t e;
	plan_topo_t t;

	refit_err_clear(&e);
	ck_assert_int_ne(codec_topo_parse(json, strlen(json), &t, &e), REFIT_OK);
	return e.msg;
}

START_TEST(topo_json)
{
	const char *j = "{\"ranks\":[{\"rank\":0,\"node\":\"train0\"},"
			"{\"rank\":1,\"node\":\"train0\"},{\"rank\":5,\"node\":\"inf0\","
			"\"domain\":\"rack1\"},{\"rank\":6,\"node\":\"inf1\",\"domain\":\"rack1\"}],"
			"\"network_gbps\":200,\"nvlink_gbps\":900,"
			"\"latency_us\":{\"network\":8,\"nvlink\":1}}";
	plan_topo_t t;

	ck_assert_int_eq(codec_topo_parse(j, strlen(j), &t, NULL), REFIT_OK);
	ck_assert_int_eq(t.nranks, 4);
	ck_assert_int_eq(t.nnodes, 3);
	ck_assert_int_eq(t.ndomains, 2);
	ck_assert_int_eq(plan_topo_domain(&t, 0), plan_topo_domain(&t, 1));
	ck_assert_int_eq(plan_topo_domain(&t, 5), plan_topo_domain(&t, 6));
	ck_assert_int_eq(plan_topo_domain(&t, 3), -1);
	ck_assert(t.network_gbps == 200 && t.latency_network_us == 8);
	plan_topo_fini(&t);
	ck_assert_str_eq(topo_err("{\"ranks\":[{\"rank\":0,\"node\":\"a\"},"
				  "{\"rank\":0,\"node\":\"b\"}]}"),
			 "topology: rank 0 is listed twice");
	ck_assert_str_eq(topo_err("{\"ranks\":[{\"rank\":0,\"nod\":\"a\"}]}"),
			 "topology: ranks[0]: unknown key \"nod\" (known: rank, node, domain)");
	ck_assert_str_eq(topo_err("{\"ranks\":[{\"rank\":0,\"node\":\"a\"}],"
				  "\"network_gbps\":0}"),
			 "topology: network_gbps = 0 must be > 0");
	ck_assert_str_eq(topo_err("{\"ranks\":[]}"), "topology: no ranks");
	ck_assert_str_eq(topo_err("{\"ranks\":[{\"rank\":-1,\"node\":\"a\"}]}"),
			 "topology: ranks[0]: -1 is not an integer from 0 to 16777215");
	ck_assert_str_eq(topo_err("{\"ranks\":[],\"latency_us\":{\"net\":1}}"),
			 "topology: latency_us: unknown key \"net\" (known: network, nvlink)");
	ck_assert_str_eq(topo_err("[1]"), "topology: expected an object");
}
END_TEST

/* No domain holds ranks of both jobs; no instance straddles two domains. */
static void
check_aligned(const plan_topo_t *t, const plan_jobs_t *j)
{
	int32_t total = j->train_ranks + j->instances * j->instance_ranks;

	for (int32_t r = 0; r < j->train_ranks; r++)
		for (int32_t q = j->train_ranks; q < total; q++)
			ck_assert_int_ne(plan_topo_domain(t, r), plan_topo_domain(t, q));
	for (int32_t i = 0; i < j->instances; i++) {
		int32_t first = j->train_ranks + i * j->instance_ranks;

		for (int32_t k = 1; k < j->instance_ranks && j->instance_ranks <= 72; k++)
			ck_assert_int_eq(plan_topo_domain(t, first + k), plan_topo_domain(t, first));
	}
	/* every used domain is whole: idle ranks fill the rest */
	for (int32_t d = 0; d < t->ndomains; d++)
		ck_assert_int_eq(t->domain_size[d], 72);
}

START_TEST(placements)
{
	plan_jobs_t j = {100, 3, 32};
	plan_topo_t t, old;
	plan_place_t pl;
	refit_err_t e;
	int32_t idle;

	ck_assert_int_eq(plan_topo_preset_jobs(&t, "gb200-nvl72", &j, PLAN_PLACE_RACK_ALIGNED,
					       &idle, &e), REFIT_OK);
	/* training: racks 0-1 (44 idle); inference: 2 x tp32 in rack 2 (8 idle),
	 * 1 in rack 3 (40 idle) */
	ck_assert_int_eq(idle, 44 + 8 + 40);
	ck_assert_int_eq(t.nranks, 4 * 72);
	ck_assert_int_eq(t.ndomains, 4);
	ck_assert_int_eq(plan_topo_domain(&t, 99), 1);
	ck_assert_int_eq(plan_topo_domain(&t, 100), 2);
	ck_assert_int_eq(plan_topo_domain(&t, 163), 2);
	ck_assert_int_eq(plan_topo_domain(&t, 164), 3);
	ck_assert_int_eq(plan_topo_domain(&t, 196), 1);      /* first idle: rack 1 */
	ck_assert_str_eq(t.nodes[plan_topo_node(&t, 100)], "node36"); /* slot 144 / 4 */
	ck_assert_int_eq(plan_topo_domain(&t, 196 + 92), -1);
	check_aligned(&t, &j);
	plan_topo_fini(&t);

	/* tp8 fills racks exactly: 9 instances per rack, nothing idle there */
	j = (plan_jobs_t){144, 18, 8};
	ck_assert_int_eq(plan_topo_preset_jobs(&t, "gb200-nvl72", &j, PLAN_PLACE_RACK_ALIGNED,
					       &idle, &e), REFIT_OK);
	ck_assert_int_eq(idle, 0);
	check_aligned(&t, &j);
	plan_topo_fini(&t);

	/* an instance larger than a rack takes whole racks of its own */
	j = (plan_jobs_t){72, 2, 128};
	ck_assert_int_eq(plan_topo_preset_jobs(&t, "gb200-nvl72", &j, PLAN_PLACE_RACK_ALIGNED,
					       &idle, &e), REFIT_OK);
	ck_assert_int_eq(idle, 2 * 16);
	ck_assert_int_eq(plan_topo_domain(&t, 72 + 127), 2);
	ck_assert_int_eq(plan_topo_domain(&t, 72 + 128), 3);
	check_aligned(&t, &j);
	plan_topo_fini(&t);

	/* packed is the old NAME:RANKS preset, rank for rank */
	j = (plan_jobs_t){100, 3, 32};
	ck_assert_int_eq(plan_topo_preset_jobs(&t, "gb200-nvl72", &j, PLAN_PLACE_PACKED,
					       &idle, &e), REFIT_OK);
	th_topo("gb200-nvl72:196", &old);
	ck_assert_int_eq(idle, 0);
	ck_assert_int_eq(t.nranks, old.nranks);
	for (int32_t r = 0; r < 196; r++) {
		ck_assert_int_eq(plan_topo_domain(&t, r), plan_topo_domain(&old, r));
		ck_assert_int_eq(plan_topo_node(&t, r), plan_topo_node(&old, r));
	}
	ck_assert_int_eq(plan_topo_domain(&t, 99), plan_topo_domain(&t, 100)); /* mixed */
	plan_topo_fini(&t);
	plan_topo_fini(&old);

	ck_assert_int_eq(plan_topo_default_placement("gb200-nvl72"), PLAN_PLACE_RACK_ALIGNED);
	ck_assert_int_eq(plan_topo_default_placement("dgx-h100"), PLAN_PLACE_PACKED);
	ck_assert_int_eq(plan_place_parse("rack-aligned", &pl, &e), REFIT_OK);
	ck_assert_int_eq(pl, PLAN_PLACE_RACK_ALIGNED);
	ck_assert_int_eq(plan_place_parse("scattered", &pl, &e), REFIT_ERR_INVALID_ARG);
	ck_assert_str_eq(e.msg, "--placement \"scattered\": expected packed or rack-aligned");
	j = (plan_jobs_t){0, 3, 32};
	refit_err_clear(&e);
	ck_assert_int_eq(plan_topo_preset_jobs(&t, "gb200-nvl72", &j, PLAN_PLACE_RACK_ALIGNED,
					       &idle, &e), REFIT_ERR_INVALID_ARG);
	ck_assert_msg(strstr(e.msg, "out of range") != NULL, "%s", e.msg);
	j = (plan_jobs_t){8, 1, 8};
	refit_err_clear(&e);
	ck_assert_int_eq(plan_topo_preset_jobs(&t, "dgx-a100", &j, PLAN_PLACE_RACK_ALIGNED,
					       &idle, &e), REFIT_ERR_INVALID_ARG);
	ck_assert_ptr_nonnull(strstr(e.msg, "unknown preset"));
}
END_TEST

Suite *
suite_topo(void)
{
	return th_suite("topo", th_tcase("core", 0, TH_TESTS(presets, topo_json, placements)),
			NULL);
}
