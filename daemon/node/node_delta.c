/*
 * node_delta.c - a node's part in delta refits (docs/delta.md): the base
 * the coordinator named for a slice and the nodes holding it, the slice's
 * delta configuration, its figures in /metrics, the bases held.
 */
#include <string.h>

#include "daemon/metrics.h"
#include "daemon/node/node_internal.h"

void
node_delta_job(slice_job_t *j, const Refit__V1__RunSliceRequest *rq)
{
	j->delta_tag = rq->delta_tag;
	j->delta_base = rq->delta_base;
	j->delta_ok = xcalloc(j->nnodes + 1, sizeof(*j->delta_ok));
	for (size_t i = 0; i < j->nnodes; i++)
		for (size_t k = 0; k < rq->n_delta_nodes; k++)
			j->delta_ok[i] |= strcmp(j->nodes[i].node_id, rq->delta_nodes[k]) == 0;
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
node_delta_base_bytes(const node_t *n, bool limit)
{
	if (n->delta == NULL)
		return 0;
	return limit ? delta_store_limit(n->delta) : delta_store_used(n->delta);
}
