/*
 * test_codec.c - layout documents in both forms, boxes and plan JSON.
 */
#include <stdio.h>
#include <string.h>

#include "tests/unit/helpers.h"

START_TEST(tensors_list_and_boxes_json)
{
	plan_layout_set_t s;
	strbuf_t sb;
	int list = 0;
	const char *j = "{\"model\":\"m\",\"tensors\":["
			"{\"name\":\"a\",\"dtype\":\"bf16\",\"shape\":[5],\"mesh\":[0,1,2,3],"
			"\"placements\":[\"Shard(0)\"]},"
			"{\"name\":\"b\",\"dtype\":\"fp32\",\"shape\":[2,2],\"shards\":["
			"{\"rank\":4,\"offset\":[0,0],\"size\":[2,2]}]}]}";

	plan_layout_set_init(&s);
	ck_assert_int_eq(codec_layouts_parse(j, strlen(j), &s, &list, NULL), REFIT_OK);
	ck_assert_int_eq(list, 1);
	ck_assert_uint_eq(s.n, 2);
	strbuf_init(&sb);
	codec_boxes_json(&s.v[0], &sb);
	ck_assert_str_eq(sb.s, "{\"name\": \"a\", \"shards\": [\n"
			 "  {\"rank\": 0, \"offset\": [0], \"size\": [2]},\n"
			 "  {\"rank\": 1, \"offset\": [2], \"size\": [2]},\n"
			 "  {\"rank\": 2, \"offset\": [4], \"size\": [1]},\n"
			 "  {\"rank\": 3, \"offset\": [5], \"size\": [0]}\n]}");
	strbuf_fini(&sb);
	plan_layout_set_fini(&s);
}
END_TEST

START_TEST(bad_documents)
{
	ck_assert_str_eq(th_layout_error("{\"tensors\":{}}"),
			 "layout: \"tensors\" must be an array");
	ck_assert_str_eq(th_layout_error("{\"tensors\":[], \"x\":1}"),
			 "layout: unknown key \"x\" (known: tensors, model)");
	ck_assert_str_eq(th_layout_error("{\"tensors\":[7]}"),
			 "layout tensors[0]: expected an object");
	ck_assert_str_eq(th_layout_error("{\"tensors\":[{\"dtype\":\"bf16\"}]}"),
			 "layout tensors[0]: \"name\": expected a string");
	ck_assert_str_eq(th_layout_error("{\"name\":\"w\",\"dtype\":\"bf16\",\"shape\":[2]}"),
			 "layout \"w\": missing \"mesh\" + \"placements\" (DTensor form) or "
			 "\"shards\" (explicit form)");
	ck_assert_str_eq(th_layout_error("{\"name\":\"w\",\"dtype\":\"bf16\",\"shape\":[2],"
					 "\"shards\":[{\"rank\":0,\"offset\":[0],\"size\":[1,1]}]}"),
			 "layout \"w\": shards[0]: offset has 1 and size 2 entries but the "
			 "tensor has 1 dims");
	ck_assert_str_eq(th_layout_error("{\"name\":\"w\",\"dtype\":\"bf16\",\"shape\":[2],"
					 "\"mesh\":[],\"placements\":[]}"),
			 "layout \"w\": mesh has an empty array");
	ck_assert_str_eq(th_layout_error("{\"name\":\"w\",\"dtype\":\"bf16\",\"shape\":[2],"
					 "\"mesh\":[[0],[\"a\"]],\"placements\":[\"R\",\"R\"]}"),
			 "layout \"w\": mesh[1][0]: expected an integer");
	ck_assert_str_eq(th_layout_error("{\"name\":\"w\",\"dtype\":\"bf16\",\"shape\":[2],"
					 "\"mesh\":[[0],1],\"placements\":[\"R\",\"R\"]}"),
			 "layout \"w\": mesh is not rectangular: mesh[1] should be an "
			 "array of 1 entries");
	ck_assert_str_eq(th_layout_error("[]"),
			 "layout: expected a tensor object or {\"tensors\": [...]}");
}
END_TEST

START_TEST(plan_json_shape)
{
	th_plan_t x;
	strbuf_t sb;

	th_plan_build(&x, "{\"name\":\"w\",\"dtype\":\"fp32\",\"shape\":[4],\"mesh\":[0,1],"
		      "\"placements\":[\"Shard(0)\"]}",
		      "{\"name\":\"w\",\"dtype\":\"fp32\",\"shape\":[4],\"mesh\":[8],"
		      "\"placements\":[\"Replicate()\"]}", "dgx-h100:16", NULL);
	strbuf_init(&sb);
	codec_plan_json(&x.p, NULL, &sb);
	ck_assert_ptr_nonnull(strstr(sb.s, "\"digest\": \""));
	ck_assert_ptr_nonnull(strstr(sb.s, "{\"stage\": 0, \"from\": 0, \"to\": 8, \"tensor\": "
				     "\"w\", \"offset\": [0], \"size\": [2]}"));
	ck_assert_ptr_nonnull(strstr(sb.s, "{\"stage\": 0, \"from\": 1, \"to\": 8, \"tensor\": "
				     "\"w\", \"offset\": [2], \"size\": [2]}"));
	strbuf_fini(&sb);
	th_plan_fini(&x);
}
END_TEST

Suite *
suite_codec(void)
{
	return th_suite("codec", th_tcase("json", 0, TH_TESTS(tensors_list_and_boxes_json,
			bad_documents, plan_json_shape)), NULL);
}
