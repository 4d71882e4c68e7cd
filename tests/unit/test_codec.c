/*
 * test_codec.c - layout documents in both forms, boxes and plan JSON.
 */
#include <stdio.h>
#include <string.h>
#include <cjson/cJSON.h>

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

/*
 * The state file's layouts: a tree built directly, in the text form's
 * keys and order (explicit shards, convert before shards), read back to
 * the same layouts; its reader is as strict as the text parser.
 */
START_TEST(layouts_tree_round_trip)
{
	plan_layout_set_t s, back;
	cJSON *t, *t2;
	char *p, *p2;
	refit_err_t e;
	const char *j = "{\"tensors\":["
			"{\"name\":\"a \\\"q\\\"\",\"dtype\":\"fp8e4m3\",\"shape\":[4,3],"
			"\"mesh\":[0,1],\"placements\":[\"Shard(0)\"],\"convert\":{\"from\":"
			"\"bf16\",\"block\":[2,2],\"scale_tensor\":\"s\"}},"
			"{\"name\":\"s\",\"dtype\":\"fp32\",\"shape\":[2,2],\"mesh\":[0],"
			"\"placements\":[\"Replicate()\"]},"
			"{\"name\":\"c\",\"dtype\":\"fp16\",\"shape\":[],\"shards\":["
			"{\"rank\":3,\"offset\":[],\"size\":[]}],\"convert\":{\"from\":\"fp32\"}}]}";

	plan_layout_set_init(&s);
	plan_layout_set_init(&back);
	ck_assert_int_eq(codec_layouts_parse(j, strlen(j), &s, NULL, NULL), REFIT_OK);
	t = codec_layouts_tree(&s);
	p = cJSON_PrintUnformatted(t);
	ck_assert_str_eq(p, "[{\"name\":\"a \\\"q\\\"\",\"dtype\":\"fp8e4m3\",\"shape\":[4,3],"
			 "\"convert\":{\"from\":\"bf16\",\"scale\":\"block\",\"block\":[2,2],"
			 "\"scale_tensor\":\"s\"},\"shards\":["
			 "{\"rank\":0,\"offset\":[0,0],\"size\":[2,3]},"
			 "{\"rank\":1,\"offset\":[2,0],\"size\":[2,3]}]},"
			 "{\"name\":\"s\",\"dtype\":\"fp32\",\"shape\":[2,2],\"shards\":["
			 "{\"rank\":0,\"offset\":[0,0],\"size\":[2,2]}]},"
			 "{\"name\":\"c\",\"dtype\":\"fp16\",\"shape\":[],"
			 "\"convert\":{\"from\":\"fp32\",\"scale\":\"none\"},\"shards\":["
			 "{\"rank\":3,\"offset\":[],\"size\":[]}]}]");
	ck_assert_int_eq(codec_layouts_from_tree(t, &back, NULL), REFIT_OK);
	ck_assert_uint_eq(back.n, 3);
	t2 = codec_layouts_tree(&back);
	p2 = cJSON_PrintUnformatted(t2);
	ck_assert_str_eq(p2, p);
	/* as strict as text: a duplicate name, an unknown key, not an array */
	cJSON_AddItemToArray(t, cJSON_Duplicate(cJSON_GetArrayItem(t, 1), 1));
	refit_err_clear(&e);
	ck_assert_int_eq(codec_layouts_from_tree(t, &back, &e), REFIT_ERR_INVALID_ARG);
	ck_assert_ptr_nonnull(strstr(e.msg, "\"s\""));
	cJSON_AddNumberToObject(cJSON_GetArrayItem(t2, 0), "x", 1);
	refit_err_clear(&e);
	ck_assert_int_eq(codec_layouts_from_tree(t2, &back, &e), REFIT_ERR_INVALID_ARG);
	ck_assert_ptr_nonnull(strstr(e.msg, "unknown key \"x\""));
	refit_err_clear(&e);
	ck_assert_int_eq(codec_layouts_from_tree(cJSON_GetArrayItem(t2, 0), &back, &e),
			 REFIT_ERR_INVALID_ARG);
	ck_assert_str_eq(e.msg, "layout: \"tensors\" must be an array");
	ck_assert_uint_eq(back.n, 3); /* nothing appended on error */
	cJSON_free(p);
	cJSON_free(p2);
	cJSON_Delete(t);
	cJSON_Delete(t2);
	plan_layout_set_fini(&s);
	plan_layout_set_fini(&back);
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
			layouts_tree_round_trip, bad_documents, plan_json_shape)), NULL);
}
