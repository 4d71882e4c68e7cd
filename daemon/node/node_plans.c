/*
 * node_plans.c - the plans a node built, kept by a digest of their inputs
 * (source and destination layouts, the epoch's topology, plan options), so
 * a refit whose membership and layouts did not change does not plan again.
 *
 * An LRU bounded by bytes (plan_cache_bytes, the plans' own memory as
 * node_plan_bytes counts it): a new plan evicts the least recently used
 * ones until it fits; a plan larger than the whole bound is not kept.  An
 * entry is shared read-only by the slices using it (a reference each); one
 * evicted while in use is freed when its last slice releases it.  Loop thread only (slices take their
 * reference on the loop before running on the pool, and give it back on the
 * loop after).
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/log.h"
#include "common/sha256.h"
#include "common/strbuf.h"
#include "daemon/node/node_internal.h"
#include "rpc/proto_conv.h"

void
node_plan_key(const plan_layout_set_t *src, const plan_layout_set_t *dst,
	      const plan_topo_t *topo, const plan_opts_t *o, char key[SHA256_HEX_LEN])
{
	char sd[SHA256_HEX_LEN], dd[SHA256_HEX_LEN];
	strbuf_t sb;

	conv_layouts_digest(src, sd);
	conv_layouts_digest(dst, dd);
	strbuf_init(&sb);
	strbuf_printf(&sb, "src %s\ndst %s\nmode %d chunk %" PRIu64 " staging %" PRIu64
		      " nic %d\n", sd, dd, (int)o->mode, o->chunk_bytes, o->staging_bytes,
		      (int)topo->nic_per_node);
	/* indices too: the planner walks nodes and domains in their order */
	for (int32_t r = 0; r < topo->nslots; r++)
		if (topo->rank_node[r] >= 0)
			strbuf_printf(&sb, "%d %d:%s %d:%s\n", r, topo->rank_node[r],
				      topo->nodes[topo->rank_node[r]], topo->rank_domain[r],
				      topo->domains[topo->rank_domain[r]]);
	sha256_hex(sb.s, sb.len, key);
	strbuf_fini(&sb);
}

typedef struct plan_run {
	const plan_layout_set_t *src, *dst;
	const plan_topo_t *topo;
	const plan_opts_t *o;
	plan_t *out;
	refit_err_t *err;
	refit_status_t rc;
} plan_run_t;

static void *
plan_thread(void *arg)
{
	plan_run_t *r = arg;
	id_t tid = (id_t)gettid();
	int prio;

	/* this thread only (a Linux thread id); the daemon keeps its priority.
	 * Failing to lower it is harmless: the plan is the same. */
	errno = 0;
	prio = getpriority(PRIO_PROCESS, tid);
	if (errno == 0 && setpriority(PRIO_PROCESS, tid, prio + NODE_PLAN_NICE) != 0)
		log_debug(LOG_SUB_NODE, "node: cannot lower the planning thread's priority");
	r->rc = plan_build(r->src, r->dst, r->topo, r->o, r->out, r->err);
	return NULL;
}

refit_status_t
node_plan_build(const plan_layout_set_t *src, const plan_layout_set_t *dst,
		const plan_topo_t *topo, const plan_opts_t *o, plan_t *out, refit_err_t *err)
{
	plan_run_t r = {src, dst, topo, o, out, err, REFIT_OK};
	pthread_t th;

	if (pthread_create(&th, NULL, plan_thread, &r) != 0)
		return plan_build(src, dst, topo, o, out, err);  /* here, then */
	pthread_join(th, NULL);
	return r.rc;
}

uint64_t
node_plan_bytes(const plan_t *p)
{
	uint64_t b = sizeof(node_plan_t) + (uint64_t)p->ntensors * sizeof(*p->tensors) +
		     (uint64_t)p->nxfers * sizeof(*p->xfers);

	for (uint32_t i = 0; i < p->ntensors; i++)
		b += p->tensors[i].name ? strlen(p->tensors[i].name) + 1 : 0;
	return b;
}

static void
entry_free(node_plan_t *e)
{
	plan_fini(&e->plan);
	free(e);
}

node_plan_t *
node_plans_get(node_t *n, const char *key)
{
	for (size_t i = 0; i < n->plans.n; i++) {
		node_plan_t *e = n->plans.v[i];

		if (strcmp(e->key, key) == 0) {
			e->refs++;
			e->used = ++n->plan_clock;
			return e;
		}
	}
	return NULL;
}

node_plan_t *
node_plans_put(node_t *n, const char *key, plan_t *p)
{
	node_plan_t *e = node_plans_get(n, key);
	uint64_t bytes;

	if (e != NULL) {  /* another slice built the same plan meanwhile */
		plan_fini(p);
		return e;
	}
	bytes = node_plan_bytes(p);
	if (bytes > n->plan_cache_max) {
		log_info("node %s: a plan of %" PRIu64 " bytes is not kept "
			  "(plan_cache_bytes %" PRIu64 ")", n->node_id, bytes, n->plan_cache_max);
		return NULL;  /* p stays the caller's */
	}
	while (n->plans.n > 0 && n->plan_cache_used + bytes > n->plan_cache_max) {
		size_t lru = 0;

		for (size_t i = 1; i < n->plans.n; i++)
			if (n->plans.v[i]->used < n->plans.v[lru]->used)
				lru = i;
		n->plan_cache_used -= n->plans.v[lru]->bytes;
		node_plan_release(n, n->plans.v[lru]);  /* the cache's reference */
		n->plans.v[lru] = n->plans.v[--n->plans.n];
	}
	e = xcalloc(1, sizeof(*e));
	snprintf(e->key, sizeof(e->key), "%s", key);
	e->plan = *p;
	memset(p, 0, sizeof(*p));
	e->bytes = bytes;
	n->plan_cache_used += bytes;
	e->refs = 2;  /* the cache's and the caller's */
	e->used = ++n->plan_clock;
	VEC_PUSH(&n->plans, e);
	return e;
}

void
node_plan_release(node_t *n, node_plan_t *e)
{
	(void)n;
	if (e != NULL && --e->refs == 0)
		entry_free(e);
}

void
node_plans_fini(node_t *n)
{
	for (size_t i = 0; i < n->plans.n; i++)
		node_plan_release(n, n->plans.v[i]);
	VEC_FREE(&n->plans);
	n->plan_cache_used = 0;
}
