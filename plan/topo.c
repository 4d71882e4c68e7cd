/*
 * topo.c - topology tables and presets.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "plan/layout.h"
#include "plan/topo.h"

struct preset {
	const char *name;
	int per_node, per_domain;
	double net_gbps, nvl_gbps, lat_net, lat_nvl;
	const char *what;
};

static const struct preset presets[] = {
	/* DGX H100: 8 GPUs, NVLink4 450 GB/s per direction, 8x400G CX-7 */
	{"dgx-h100", 8, 8, 400, 3600, 5, 2, "8 GPUs per node and domain"},
	{"hgx-h200", 8, 8, 400, 3600, 5, 2, "8 GPUs per node and domain"},
	/* GB200 NVL72: 4 GPUs per tray, 72 per rack, NVLink5 900 GB/s per
	 * direction, one 400G NIC per GPU */
	{"gb200-nvl72", 4, 72, 400, 7200, 5, 2, "4 GPUs per node, 72 per domain"},
	/* one slot per node, as the tcp backend's emulated testbed */
	{"host", 1, 1, 10, 100, 20, 5, "1 slot per node and domain"},
};

typedef VEC(int32_t) slotvec_t;

static const struct preset *
find_preset(const char *name, size_t nlen)
{
	for (size_t i = 0; i < sizeof(presets) / sizeof(presets[0]); i++)
		if (strlen(presets[i].name) == nlen &&
		    strncmp(presets[i].name, name, nlen) == 0)
			return &presets[i];
	return NULL;
}

static void
preset_links(plan_topo_t *t, const struct preset *p)
{
	t->network_gbps = p->net_gbps;
	t->nvlink_gbps = p->nvl_gbps;
	t->latency_network_us = p->lat_net;
	t->latency_nvlink_us = p->lat_nvl;
}

/* Rank `rank` at machine slot `slot`: node slot / per_node, domain slot /
 * per_domain. */
static refit_status_t
add_slot(plan_topo_t *t, const struct preset *p, int32_t rank, int32_t slot,
	 refit_err_t *err)
{
	char node[32], dom[32];

	snprintf(node, sizeof(node), "node%d", slot / p->per_node);
	snprintf(dom, sizeof(dom), "domain%d", slot / p->per_domain);
	return plan_topo_add_rank(t, rank, node, p->per_node == p->per_domain ? node : dom,
				  err);
}

static const char *const preset_names[] = {"dgx-h100", "hgx-h200",
					   "gb200-nvl72", "host", NULL};

void
plan_topo_init(plan_topo_t *t)
{
	memset(t, 0, sizeof(*t));
	t->network_gbps = 400;
	t->nvlink_gbps = 3600;
	t->latency_network_us = 5;
	t->latency_nvlink_us = 2;
}

static void
free_names(char **v, int32_t n)
{
	for (int32_t i = 0; i < n; i++)
		free(v[i]);
	free(v);
}

void
plan_topo_fini(plan_topo_t *t)
{
	if (t == NULL)
		return;
	free(t->rank_node);
	free(t->rank_domain);
	free_names(t->nodes, t->nnodes);
	free_names(t->domains, t->ndomains);
	free(t->domain_size);
	strmap_fini(&t->node_ix);
	strmap_fini(&t->domain_ix);
	memset(t, 0, sizeof(*t));
}

/* Index of name in names, appending it when new. */
static int32_t
intern(strmap_t *ix, char ***names, int32_t *n, const char *name)
{
	int32_t i = strmap_get(ix, name);

	if (i >= 0)
		return i;
	if (*n == 0 || (*n >= 8 && (*n & (*n - 1)) == 0)) /* grow geometrically */
		*names = xreallocarray(*names, *n ? (size_t)*n * 2 : 8, sizeof(**names));
	(*names)[*n] = xstrdup(name);
	strmap_put(ix, name, *n);
	return (*n)++;
}

refit_status_t
plan_topo_add_rank(plan_topo_t *t, int32_t rank, const char *node,
		   const char *domain, refit_err_t *err)
{
	int32_t d, old;

	if (rank < 0 || rank >= PLAN_MAX_RANK_ID)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG,
				     "topology: rank %d is out of range (0 to %d)",
				     rank, PLAN_MAX_RANK_ID - 1);
	if (node == NULL || node[0] == '\0')
		return refit_err_set(err, REFIT_ERR_INVALID_ARG,
				     "topology: rank %d has no node name", rank);
	if (rank >= t->nslots) {
		int32_t ns = t->nslots ? t->nslots : 16;

		while (ns <= rank)
			ns *= 2;
		t->rank_node = xreallocarray(t->rank_node, (size_t)ns, sizeof(int32_t));
		t->rank_domain = xreallocarray(t->rank_domain, (size_t)ns, sizeof(int32_t));
		for (int32_t i = t->nslots; i < ns; i++)
			t->rank_node[i] = t->rank_domain[i] = -1;
		t->nslots = ns;
	}
	if (t->rank_node[rank] >= 0)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG,
				     "topology: rank %d is listed twice", rank);
	t->rank_node[rank] = intern(&t->node_ix, &t->nodes, &t->nnodes, node);
	old = t->ndomains;
	d = intern(&t->domain_ix, &t->domains, &t->ndomains, domain ? domain : node);
	if (t->ndomains != old) {
		if (old == 0 || (old >= 8 && (old & (old - 1)) == 0))
			t->domain_size = xreallocarray(t->domain_size,
						       old ? (size_t)old * 2 : 8,
						       sizeof(int32_t));
		t->domain_size[d] = 0;
	}
	t->rank_domain[rank] = d;
	t->domain_size[d]++;
	t->nranks++;
	return REFIT_OK;
}

const char *const *
plan_topo_preset_names(void)
{
	return preset_names;
}

refit_status_t
plan_topo_preset(plan_topo_t *t, const char *spec, int32_t nranks,
		 refit_err_t *err)
{
	const char *colon = strchr(spec, ':');
	size_t nlen = colon ? (size_t)(colon - spec) : strlen(spec);
	const struct preset *p = find_preset(spec, nlen);

	if (p == NULL)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG,
				     "topology \"%s\": unknown preset (known: dgx-h100, "
				     "hgx-h200, gb200-nvl72, host)", spec);
	if (colon != NULL) {
		char *end;
		long v;

		errno = 0;
		v = strtol(colon + 1, &end, 10);
		if (end == colon + 1 || *end != '\0' || errno || v < 1 ||
		    v > PLAN_MAX_RANK_ID)
			return refit_err_set(err, REFIT_ERR_INVALID_ARG,
					     "topology \"%s\": rank count \"%s\" is not a "
					     "number from 1 to %d", spec, colon + 1,
					     PLAN_MAX_RANK_ID);
		if (nranks <= 0)
			nranks = (int32_t)v;
	}
	if (nranks <= 0)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG,
				     "topology \"%s\": give the rank count as %.*s:RANKS",
				     spec, (int)nlen, spec);
	plan_topo_init(t);
	preset_links(t, p);
	for (int32_t r = 0; r < nranks; r++)
		CHECK(add_slot(t, p, r, r, err));
	return REFIT_OK;
}

const char *
plan_place_name(plan_place_t p)
{
	return p == PLAN_PLACE_RACK_ALIGNED ? "rack-aligned" : "packed";
}

refit_status_t
plan_place_parse(const char *s, plan_place_t *out, refit_err_t *err)
{
	if (strcmp(s, "packed") == 0)
		*out = PLAN_PLACE_PACKED;
	else if (strcmp(s, "rack-aligned") == 0)
		*out = PLAN_PLACE_RACK_ALIGNED;
	else
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "--placement \"%s\": "
				     "expected packed or rack-aligned", s);
	return REFIT_OK;
}

plan_place_t
plan_topo_default_placement(const char *preset)
{
	const char *colon = strchr(preset, ':');
	size_t n = colon ? (size_t)(colon - preset) : strlen(preset);

	return n == strlen("gb200-nvl72") && strncmp(preset, "gb200-nvl72", n) == 0 ?
	       PLAN_PLACE_RACK_ALIGNED : PLAN_PLACE_PACKED;
}

/*
 * Ranks first .. first + units * size - 1, laid out from domain *dom on:
 * as many whole units of `size` ranks per domain as fit (a unit larger than
 * a domain takes whole domains of its own); the rest of each used domain
 * is appended to idle_slots.
 */
static refit_status_t
place_job(plan_topo_t *t, const struct preset *p, int32_t first, int32_t units,
	  int32_t size, int32_t *dom, slotvec_t *idle_slots, refit_err_t *err)
{
	int32_t D = p->per_domain, r = first;
	int32_t per = size <= D ? D / size : 1;              /* units per group */
	int32_t span = size <= D ? 1 : (size + D - 1) / D;   /* domains per group */

	for (int32_t u = 0; u < units; u += per) {
		int32_t n = units - u < per ? units - u : per, slot = 0;

		for (int32_t k = 0; k < n * size; k++, slot++)
			CHECK(add_slot(t, p, r++, *dom * D + slot, err));
		for (; slot < span * D; slot++)
			VEC_PUSH(idle_slots, *dom * D + slot);
		*dom += span;
	}
	return REFIT_OK;
}

refit_status_t
plan_topo_preset_jobs(plan_topo_t *t, const char *name, const plan_jobs_t *jobs,
		      plan_place_t pl, int32_t *idle, refit_err_t *err)
{
	const struct preset *p = find_preset(name, strlen(name));
	int64_t total = (int64_t)jobs->train_ranks +
			(int64_t)jobs->instances * jobs->instance_ranks;
	slotvec_t slots = {0};
	int32_t dom = 0;
	refit_status_t rc;

	if (idle)
		*idle = 0;
	if (p == NULL)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG,
				     "topology \"%s\": unknown preset (known: dgx-h100, "
				     "hgx-h200, gb200-nvl72, host)", name);
	if (jobs->train_ranks < 1 || jobs->instances < 1 || jobs->instance_ranks < 1 ||
	    total > PLAN_MAX_RANK_ID / 2)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG,
				     "topology \"%s\": %d training ranks and %d instances "
				     "of %d ranks are out of range (1 to %d ranks in all)",
				     name, jobs->train_ranks, jobs->instances,
				     jobs->instance_ranks, PLAN_MAX_RANK_ID / 2);
	if (pl == PLAN_PLACE_PACKED)
		return plan_topo_preset(t, name, (int32_t)total, err);
	plan_topo_init(t);
	preset_links(t, p);
	rc = place_job(t, p, 0, jobs->train_ranks, 1, &dom, &slots, err);
	if (rc == REFIT_OK)
		rc = place_job(t, p, jobs->train_ranks, jobs->instances,
			       jobs->instance_ranks, &dom, &slots, err);
	for (size_t i = 0; i < slots.n && rc == REFIT_OK; i++) {
		if (total + (int64_t)i >= PLAN_MAX_RANK_ID)
			rc = refit_err_set(err, REFIT_ERR_INVALID_ARG, "topology \"%s\": "
					   "too many idle ranks", name);
		else
			rc = add_slot(t, p, (int32_t)(total + (int64_t)i), slots.v[i], err);
	}
	if (rc == REFIT_OK && idle)
		*idle = (int32_t)slots.n;
	if (rc != REFIT_OK)
		plan_topo_fini(t);
	VEC_FREE(&slots);
	return rc;
}

refit_status_t
plan_topo_check(const plan_topo_t *t, refit_err_t *err)
{
	const struct {
		const char *key;
		double v;
		int may_be_zero;
	} f[] = {
		{"network_gbps", t->network_gbps, 0},
		{"nvlink_gbps", t->nvlink_gbps, 0},
		{"latency_us.network", t->latency_network_us, 1},
		{"latency_us.nvlink", t->latency_nvlink_us, 1},
		{"pack_gbps", t->pack_gbps, 1},
		{"unpack_gbps", t->unpack_gbps, 1},
		{"connection_us", t->connection_us, 1},
	};

	for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++)
		if (!isfinite(f[i].v) || f[i].v < 0 || (f[i].v == 0 && !f[i].may_be_zero))
			return refit_err_set(err, REFIT_ERR_INVALID_ARG,
					     "topology: %s = %g must be %s", f[i].key,
					     f[i].v, f[i].may_be_zero ? ">= 0" : "> 0");
	if (t->nranks == 0)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG,
				     "topology: no ranks");
	return REFIT_OK;
}
