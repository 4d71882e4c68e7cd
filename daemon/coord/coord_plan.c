/*
 * coord_plan.c - the coordinator's plans: the key of a plan's inputs, the
 * last plan of each model (reused while its key stays the same), and plans
 * built off the loop (uv_queue_work) for refits and ExplainPlan.  Loop
 * thread, but for planjob_work.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/sha256.h"
#include "common/strbuf.h"
#include "plan/convert.h"
#include "daemon/coord/coord_internal.h"

/* The options of a refit's plan: the same when planning and in RunSlice. */
void
coord_plan_opts(const coord_t *c, int mode, plan_opts_t *o)
{
	plan_opts_default(o);
	o->mode = mode == REFIT__V1__MODE__BROADCAST ? PLAN_MODE_BROADCAST : PLAN_MODE_RESHARD;
	if (c->o.staging_bytes)
		o->staging_bytes = c->o.staging_bytes;
}

/* ---- plans ----------------------------------------------------------------- */

/* Digest of everything a plan depends on (coord_internal.h). */
void
coord_plan_key(coord_t *c, const model_t *m, const char *only, const plan_opts_t *o,
	       char hex[SHA256_HEX_LEN])
{
	strbuf_t sb;

	strbuf_init(&sb);
	if (only)
		strbuf_printf(&sb, "only %s\n", only);
	strbuf_printf(&sb, "mode %d chunk %" PRIu64 " staging %" PRIu64 " nic %d\n", (int)o->mode,
		      o->chunk_bytes, o->staging_bytes, (int)c->o.nic_per_node);
	for (size_t i = 0; i < m->inst.n; i++)
		strbuf_printf(&sb, "inst %d %s %s%s\n", m->inst.v[i].role, m->inst.v[i].name,
			      m->inst.v[i].digest, m->inst.v[i].skip ? " skipped" : "");
	for (size_t i = 0; i < c->members.n; i++) {
		strbuf_printf(&sb, "node %s", c->members.v[i].node_id);
		for (size_t k = 0; k < c->members.v[i].nranks; k++)
			strbuf_printf(&sb, " %d@%s", c->members.v[i].ranks[k].rank,
				      c->members.v[i].ranks[k].domain);
		strbuf_puts(&sb, "\n");
	}
	sha256_hex(sb.s, sb.len, hex);
	strbuf_fini(&sb);
}

/* ---- planning off the loop ---------------------------------------------- */

/* The most bytes one node of p sends, or receives, over the network. */
static uint64_t
busiest_node_bytes(const plan_t *p, const plan_topo_t *topo)
{
	uint64_t *in, *out, most = 0;
	size_t n = topo->nnodes > 0 ? (size_t)topo->nnodes : 1;

	in = xcalloc(n, sizeof(*in));
	out = xcalloc(n, sizeof(*out));
	for (size_t i = 0; i < p->nxfers; i++) {
		const plan_xfer_t *x = &p->xfers[i];
		int32_t a = plan_topo_node(topo, x->from), b = plan_topo_node(topo, x->to);

		if (a < 0 || b < 0 || a == b || (size_t)a >= n || (size_t)b >= n)
			continue;
		out[a] += plan_xfer_bytes(p, x);
		in[b] += plan_xfer_bytes(p, x);
	}
	for (size_t k = 0; k < n; k++) {
		if (out[k] > most)
			most = out[k];
		if (in[k] > most)
			most = in[k];
	}
	free(in);
	free(out);
	return most;
}

static void
planjob_work(uv_work_t *w)
{
	planjob_t *j = w->data;

	refit_err_clear(&j->err);
	/* conversions (docs/conversion.md): plan the pair as it crosses the wire */
	j->rc = plan_convert_rewrite(&j->src, &j->dst, &j->err);
	if (j->rc == REFIT_OK) {
		uint64_t t0 = uv_hrtime();

		j->rc = plan_build(&j->src, &j->dst, &j->topo, &j->opts, &j->plan, &j->err);
		j->plan_us = (uv_hrtime() - t0) / 1000;
	}
	if (j->rc != REFIT_OK)
		return;
	if (!j->explain) {
		/* a refit's: the modelled time bounds its slices (coord_refit.c); a
		 * plan the model cannot price gets the floor, it still runs */
		refit_err_t ce;

		refit_err_clear(&ce);
		if (plan_cost(&j->plan, &j->src, &j->dst, &j->topo, &j->cost, &ce) != REFIT_OK)
			j->cost.time_s = 0;
		j->node_bytes = busiest_node_bytes(&j->plan, &j->topo);
		return;
	}
	j->rc = plan_cost(&j->plan, &j->src, &j->dst, &j->topo, &j->cost, &j->err);
	if (j->rc != REFIT_OK)
		return;
	j->opts.mode = PLAN_MODE_BROADCAST;
	j->rc = plan_build(&j->src, &j->dst, &j->topo, &j->opts, &j->bplan, &j->err);
	if (j->rc == REFIT_OK)
		j->rc = plan_cost(&j->bplan, &j->src, &j->dst, &j->topo, &j->bcost, &j->err);
}

static void
planjob_free(planjob_t *j)
{
	plan_fini(&j->plan);
	plan_fini(&j->bplan);
	plan_layout_set_fini(&j->src);
	plan_layout_set_fini(&j->dst);
	plan_topo_fini(&j->topo);
	free(j->model);
	free(j->only);
	free(j);
}

static void
planjob_after(uv_work_t *w, int status)
{
	planjob_t *j = w->data;
	coord_t *c = j->c;

	(void)status;
	c->inflight--;
	if (!c->closing)
		j->done(j);
	else if (j->call != NULL)
		rpc_call_fail(j->call, REFIT_ERR_UNAVAILABLE, "coordinator is shutting down");
	planjob_free(j);
	coord_maybe_free(c);
}

refit_status_t
coord_plan_async(coord_t *c, model_t *m, const char *only, const plan_opts_t *o,
		 bool explain,
		 void (*done)(planjob_t *j), uint64_t refit_id, rpc_call_t *call,
		 refit_err_t *err)
{
	planjob_t *j = xcalloc(1, sizeof(*j));
	instance_t *t = coord_train_instance(m);
	refit_status_t rc;

	if (t == NULL) {
		free(j);
		return refit_err_set(err, REFIT_ERR_NOT_FOUND, "model \"%s\" has no registered "
				     "trainer", m->name);
	}
	rc = coord_compose_dst(m, only, &j->dst, err);
	if (rc == REFIT_OK)
		rc = coord_members_topo(c, &j->topo, err);
	if (rc != REFIT_OK) {
		planjob_free(j);
		return rc;
	}
	plan_layout_set_copy(&j->src, &t->layouts);
	coord_plan_key(c, m, only, o, j->key);
	j->only = only ? xstrdup(only) : NULL;
	j->c = c;
	j->model = xstrdup(m->name);
	j->opts = *o;
	j->explain = explain;
	j->done = done;
	j->refit_id = refit_id;
	j->call = call;
	j->w.data = j;
	if (uv_queue_work(c->loop, &j->w, planjob_work, planjob_after) != 0) {
		planjob_free(j);
		return refit_err_set(err, REFIT_ERR_SYS, "cannot queue planning work");
	}
	c->inflight++;
	return REFIT_OK;
}

plan_cache_t *
coord_plan_cached(coord_t *c, const char *model)
{
	for (size_t i = 0; i < c->plans.n; i++)
		if (strcmp(c->plans.v[i].model, model) == 0)
			return &c->plans.v[i];
	return NULL;
}

/* Keep j's plan as the model's cached plan (the job gives it up). */
const plan_t *
coord_plan_keep(coord_t *c, planjob_t *j)
{
	plan_cache_t *pc = coord_plan_cached(c, j->model);

	if (pc == NULL) {
		plan_cache_t n = {.model = xstrdup(j->model)};

		VEC_PUSH(&c->plans, n);
		pc = &c->plans.v[c->plans.n - 1];
	} else {
		plan_fini(&pc->plan);
	}
	memcpy(pc->key, j->key, sizeof(pc->key));
	pc->plan = j->plan;
	pc->time_s = j->cost.time_s;
	pc->node_bytes = j->node_bytes;
	memset(&j->plan, 0, sizeof(j->plan));
	log_info("coordinator: model \"%s\": plan %.12s built (%zu transfers)", j->model,
		 pc->plan.digest_hex, pc->plan.nxfers);
	return &pc->plan;
}
