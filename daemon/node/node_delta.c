/*
 * node_delta.c - a node's part in delta refits (docs/delta.md): the base
 * the coordinator named for a slice and the nodes holding it, the slice's
 * delta configuration, its figures in /metrics, the bases held.
 */
#include <stdlib.h>
#include <string.h>

#include "daemon/metrics.h"
#include "daemon/node/node_internal.h"

static int
cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : x > y;
}

void
node_delta_job(slice_job_t *j, const Refit__V1__RunSliceRequest *rq)
{
	j->delta_tag = rq->delta_tag;
	j->delta_base = rq->delta_base;
	j->delta_ok = xcalloc(j->nnodes + 1, sizeof(*j->delta_ok));
	j->delta_skip = xcalloc(j->nnodes + 1, sizeof(*j->delta_skip));
	j->delta_nskip = xcalloc(j->nnodes + 1, sizeof(*j->delta_nskip));
	for (size_t i = 0; i < j->nnodes; i++)
		for (size_t k = 0; k < rq->n_delta_nodes; k++)
			j->delta_ok[i] |= strcmp(j->nodes[i].node_id, rq->delta_nodes[k]) == 0;
	if (j->self >= j->nnodes)
		return;
	/* the messages from this node that a receiver keeps no base of */
	for (size_t k = 0; k < rq->n_delta_lacks; k++) {
		const Refit__V1__DeltaLack *l = rq->delta_lacks[k];

		if (strcmp(l->from_node, j->nodes[j->self].node_id) != 0)
			continue;
		for (size_t i = 0; i < j->nnodes; i++) {
			size_t n = j->delta_nskip[i];

			if (strcmp(l->to_node, j->nodes[i].node_id) != 0 || l->n_msgs == 0)
				continue;
			j->delta_skip[i] = xrealloc(j->delta_skip[i], (n + l->n_msgs) *
						    sizeof(**j->delta_skip));
			memcpy(j->delta_skip[i] + n, l->msgs, l->n_msgs * sizeof(*l->msgs));
			j->delta_nskip[i] = n + l->n_msgs;
			qsort(j->delta_skip[i], j->delta_nskip[i], sizeof(**j->delta_skip),
			      cmp_u32);
		}
	}
}

void
node_delta_job_free(slice_job_t *j)
{
	for (size_t i = 0; j->delta_skip && i < j->nnodes; i++)
		free(j->delta_skip[i]);
	free(j->delta_skip);
	free(j->delta_nskip);
	free(j->delta_ok);
	free(j->st.lacks);
}

Refit__V1__DeltaLack **
node_delta_lacks(const slice_job_t *j, const char *self, size_t *n)
{
	Refit__V1__DeltaLack **v = NULL;

	*n = 0;
	for (size_t k = 0; k < j->st.nlacks; k++) {
		uint32_t peer = j->st.lacks[2 * k], pos = j->st.lacks[2 * k + 1];
		Refit__V1__DeltaLack *l = *n ? v[*n - 1] : NULL;

		if (peer >= j->nnodes)
			continue;
		if (l == NULL || strcmp(l->from_node, j->nodes[peer].node_id) != 0) {
			v = xrealloc(v, (*n + 1) * sizeof(*v));
			l = v[(*n)++] = xcalloc(1, sizeof(*l));
			refit__v1__delta_lack__init(l);
			l->from_node = (char *)j->nodes[peer].node_id;
			l->to_node = (char *)self;
		}
		l->msgs = xrealloc(l->msgs, (l->n_msgs + 1) * sizeof(*l->msgs));
		l->msgs[l->n_msgs++] = pos;
	}
	return v;
}

void
node_delta_lacks_free(Refit__V1__DeltaLack **v, size_t n)
{
	for (size_t k = 0; k < n; k++) {
		free(v[k]->msgs);
		free(v[k]);
	}
	free(v);
}

void
node_delta_cfg(const slice_job_t *j, slice_cfg_t *sc)
{
	/* no tag: the model's delta is off, no bases kept */
	sc->delta = j->delta_tag ? j->n->delta : NULL;
	sc->model = j->model;
	sc->digest = j->plan.digest_hex;
	sc->delta_tag = j->delta_tag;
	sc->delta_base = j->delta_base;
	sc->delta_ok = j->delta_ok;
	sc->delta_skip = j->delta_skip;
	sc->delta_nskip = j->delta_nskip;
	sc->gdelta = j->n->gdelta;  /* a failed slice drops them, delta on or off */
}

void
node_delta_metrics(const slice_job_t *j)
{
	metrics_add(M_DELTA_SENT_BYTES_TOTAL, (const char *[]){"kind", "dense", NULL},
		    (double)j->st.dense_wire);
	metrics_add(M_DELTA_SENT_BYTES_TOTAL, (const char *[]){"kind", "delta", NULL},
		    (double)j->st.delta_wire);
	metrics_add(M_DELTA_DENSE_BYTES_TOTAL, NULL, (double)j->st.delta_dense);
}

struct gdelta_store *
node_gdelta_store(const node_opts_t *o)
{
	uint64_t budget = o->gpu_staging_budget ? o->gpu_staging_budget : 1ull << 30;

	if (o->delta_base_bytes == 0)
		return NULL;
	return gdelta_store_new(o->delta_base_bytes < budget / 4 ? o->delta_base_bytes
								: budget / 4);
}

uint64_t
node_delta_base_bytes(const node_t *n, bool limit, bool gpu)
{
	if (gpu)
		return n->gdelta == NULL ? 0 : limit ? gdelta_store_limit(n->gdelta)
						     : gdelta_store_used(n->gdelta);
	if (n->delta == NULL)
		return 0;
	return limit ? delta_store_limit(n->delta) : delta_store_used(n->delta);
}

uint64_t
node_delta_evictions(const node_t *n, bool gpu)
{
	if (gpu)
		return n->gdelta ? gdelta_store_evictions(n->gdelta) : 0;
	return n->delta ? delta_store_evictions(n->delta) : 0;
}

char **
node_delta_evicted(node_t *n, size_t *count)
{
	size_t nh = 0, ng = 0;
	char **h = n->delta ? delta_store_take_evicted(n->delta, &nh) : NULL;
	char **g = n->gdelta ? gdelta_store_take_evicted(n->gdelta, &ng) : NULL;

	h = xrealloc(h, (nh + ng + 1) * sizeof(*h));
	if (ng)
		memcpy(h + nh, g, ng * sizeof(*g));
	free(g);
	*count = nh + ng;
	return h;
}

void
node_delta_evicted_free(char **v, size_t count)
{
	for (size_t i = 0; i < count; i++)
		free(v[i]);
	free(v);
}
