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

Suite *
suite_topo(void)
{
	Suite *s = suite_create("topo");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, presets);
	tcase_add_test(tc, topo_json);
	suite_add_tcase(s, tc);
	return s;
}
