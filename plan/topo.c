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
	const struct preset *p = NULL;
	const char *colon = strchr(spec, ':');
	size_t nlen = colon ? (size_t)(colon - spec) : strlen(spec);

	for (size_t i = 0; i < sizeof(presets) / sizeof(presets[0]); i++)
		if (strlen(presets[i].name) == nlen &&
		    strncmp(presets[i].name, spec, nlen) == 0)
			p = &presets[i];
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
	t->network_gbps = p->net_gbps;
	t->nvlink_gbps = p->nvl_gbps;
	t->latency_network_us = p->lat_net;
	t->latency_nvlink_us = p->lat_nvl;
	for (int32_t r = 0; r < nranks; r++) {
		char node[32], dom[32];

		snprintf(node, sizeof(node), "node%d", r / p->per_node);
		snprintf(dom, sizeof(dom), "domain%d", r / p->per_domain);
		CHECK(plan_topo_add_rank(t, r, node,
					 p->per_node == p->per_domain ? node : dom, err));
	}
	return REFIT_OK;
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
