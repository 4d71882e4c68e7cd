/*
 * topo_json.c - topology documents and presets to plan_topo_t.
 */
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>
#include <unistd.h>

#include "codec/json_util.h"

static refit_status_t
parse_ranks(const cJSON *ranks, plan_topo_t *t, refit_err_t *err)
{
	static const char *const keys[] = {"rank", "node", "domain", NULL};
	const cJSON *it;
	size_t i = 0;

	if (!cJSON_IsArray(ranks))
		return refit_err_set(err, REFIT_ERR_INVALID_ARG,
				     "topology: \"ranks\" must be an array");
	cJSON_ArrayForEach(it, ranks) {
		char w[64];
		const char *node, *dom = NULL;
		int64_t r;

		snprintf(w, sizeof(w), "topology: ranks[%zu]", i++);
		if (!cJSON_IsObject(it))
			return refit_err_set(err, REFIT_ERR_INVALID_ARG,
					     "%s: expected an object", w);
		CHECK(json_check_keys(it, keys, w, err));
		CHECK(json_int(cJSON_GetObjectItemCaseSensitive(it, "rank"), 0,
			       PLAN_MAX_RANK_ID - 1, &r, w, err));
		CHECK(json_str(cJSON_GetObjectItemCaseSensitive(it, "node"), &node, w, err));
		if (cJSON_HasObjectItem(it, "domain"))
			CHECK(json_str(cJSON_GetObjectItemCaseSensitive(it, "domain"),
				       &dom, w, err));
		CHECK(plan_topo_add_rank(t, (int32_t)r, node, dom, err));
	}
	return REFIT_OK;
}

static refit_status_t
parse_topo(const cJSON *root, plan_topo_t *t, refit_err_t *err)
{
	static const char *const keys[] = {"ranks", "network_gbps", "nvlink_gbps",
					   "latency_us", "nic", "pack_gbps", "unpack_gbps",
					   "connection_us", NULL};
	static const struct {
		const char *key, *what;
		size_t off;
	} host[] = { /* calibrated host costs (plan/topo.h) */
		{"pack_gbps", "topology: pack_gbps", offsetof(plan_topo_t, pack_gbps)},
		{"unpack_gbps", "topology: unpack_gbps", offsetof(plan_topo_t, unpack_gbps)},
		{"connection_us", "topology: connection_us",
		 offsetof(plan_topo_t, connection_us)}};
	static const char *const lat_keys[] = {"network", "nvlink", NULL};
	const cJSON *v;

	if (!cJSON_IsObject(root))
		return refit_err_set(err, REFIT_ERR_INVALID_ARG,
				     "topology: expected an object");
	CHECK(json_check_keys(root, keys, "topology", err));
	CHECK(parse_ranks(cJSON_GetObjectItemCaseSensitive(root, "ranks"), t, err));
	if ((v = cJSON_GetObjectItemCaseSensitive(root, "network_gbps")) != NULL)
		CHECK(json_num(v, &t->network_gbps, "topology: network_gbps", err));
	if ((v = cJSON_GetObjectItemCaseSensitive(root, "nic")) != NULL) {
		if (!cJSON_IsString(v) || (strcmp(v->valuestring, "rank") != 0 &&
					   strcmp(v->valuestring, "node") != 0))
			return refit_err_set(err, REFIT_ERR_INVALID_ARG, "topology: \"nic\" must "
					     "be \"rank\" (one NIC per rank) or \"node\" (one "
					     "per node, shared)");
		t->nic_per_node = strcmp(v->valuestring, "node") == 0;
	}
	if ((v = cJSON_GetObjectItemCaseSensitive(root, "nvlink_gbps")) != NULL)
		CHECK(json_num(v, &t->nvlink_gbps, "topology: nvlink_gbps", err));
	if ((v = cJSON_GetObjectItemCaseSensitive(root, "latency_us")) != NULL) {
		const cJSON *n = cJSON_GetObjectItemCaseSensitive(v, "network");
		const cJSON *l = cJSON_GetObjectItemCaseSensitive(v, "nvlink");

		if (!cJSON_IsObject(v))
			return refit_err_set(err, REFIT_ERR_INVALID_ARG,
					     "topology: latency_us must be an object");
		CHECK(json_check_keys(v, lat_keys, "topology: latency_us", err));
		if (n != NULL)
			CHECK(json_num(n, &t->latency_network_us,
				       "topology: latency_us.network", err));
		if (l != NULL)
			CHECK(json_num(l, &t->latency_nvlink_us,
				       "topology: latency_us.nvlink", err));
	}
	for (size_t i = 0; i < sizeof(host) / sizeof(host[0]); i++)
		if ((v = cJSON_GetObjectItemCaseSensitive(root, host[i].key)) != NULL)
			CHECK(json_num(v, (double *)((char *)t + host[i].off), host[i].what,
				       err));
	return plan_topo_check(t, err);
}

refit_status_t
codec_topo_parse(const char *text, size_t len, plan_topo_t *t, refit_err_t *err)
{
	cJSON *root;
	refit_status_t rc;

	plan_topo_init(t);
	CHECK(json_parse(text, len, &root, "topology", err));
	rc = parse_topo(root, t, err);
	cJSON_Delete(root);
	if (rc != REFIT_OK)
		plan_topo_fini(t);
	return rc;
}

refit_status_t
codec_topo_load(const char *spec, plan_topo_t *t, refit_err_t *err)
{
	char *buf;
	size_t len;
	refit_status_t rc;

	if (access(spec, F_OK) != 0) {
		if (strchr(spec, '/') == NULL && strstr(spec, ".json") == NULL)
			return plan_topo_preset(t, spec, 0, err);
		plan_topo_init(t);
	}
	CHECK(codec_read_file(spec, &buf, &len, err));
	rc = codec_topo_parse(buf, len, t, err);
	free(buf);
	if (rc != REFIT_OK)
		refit_err_prefix(err, "%s", spec);
	return rc;
}
