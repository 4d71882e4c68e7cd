/*
 * node_run.c - the Node service's RunSlice and Abort: a node's slice of a
 * refit, run off the loop (Commit and Publish, the install that follows:
 * node_install.c).
 *
 * RunSlice checks on the loop that this node holds what the plan needs:
 * the epoch prepared, a trainer client with memory for every training
 * piece on its ranks (holding the refit's version, not being written), an
 * inference client for every inference piece, and that the layouts the
 * coordinator sent are the ones registered here (digests).  In-place
 * clients are marked invalid before the first byte is written, and the
 * slice of the plan the coordinator sent is decoded and checked
 * (node_slice.c): the node does not plan.  The slice then runs on libuv's
 * pool (slice_run moves the data).  RunSlice is answered as soon as the
 * slice is queued; its end goes to the coordinator as SliceDone (with the
 * time the slice took to decode and its size; node_report.c), resent with
 * back-off until the coordinator acknowledges it (or says the refit is
 * gone, the epoch moves on, or REPORT_GIVE_UP_MS pass).
 * Double-buffered clients are written in their inactive copy.
 * The install has two phases, so that an instance spanning nodes switches
 * on all of them or on none: Commit (every slice of the refit ran) only
 * marks the finished slice committed, showing clients nothing; Publish
 * (every node committed) flips double buffers (or marks in-place weights
 * valid) and moves the installed version.  A slice that fails or is
 * aborted, or a commit never published, installs nothing; the next
 * RunSlice writing the same clients drops it.  An Abort is remembered (per
 * epoch and attempt, the last NODE_ABORTED_MAX), so a RunSlice arriving
 * after its Abort is refused at once instead of waiting for peers that
 * stopped.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "dataplane/conv_exec.h"
#include "plan/convert.h"
#include "plan/gpu_staging.h"
#include "daemon/node/node_internal.h"
#include "rpc/proto_conv.h"
#include "daemon/node/slice.h"

#define NODE_SLICE_TIMEOUT_MS 600000  /* neither this node nor the coordinator set one */

static const char *
nz(const char *s)
{
	return s ? s : "";
}

/* ---- memory for the executor -------------------------------------------------- */

static refit_status_t
job_view(void *ctx, int32_t rank, uint32_t tensor, bool dst, int32_t piece, dp_view_t *out,
	 refit_err_t *err)
{
	slice_job_t *j = ctx;

	for (size_t i = 0; i < j->cl[dst].n; i++) {
		const jclient_t *jc = &j->cl[dst].v[i];
		const piece_mem_t *m;

		if (jc->tmap[tensor] < 0)
			continue;
		m = node_client_piece(jc->c, (uint32_t)jc->tmap[tensor], rank, piece);
		if (m == NULL)
			continue;
		memset(out, 0, sizeof(*out));
		out->base = m->base[jc->copy];
		out->ndim = m->ndim;
		out->elem = m->elem;
		memcpy(out->shape, m->shape, sizeof(out->shape));
		memcpy(out->stride, m->stride, sizeof(out->stride));
		return REFIT_OK;
	}
	return refit_err_set(err, REFIT_ERR_NOT_FOUND, "no %s memory for tensor \"%s\" rank %d "
			     "piece %d on this node", dst ? "inference" : "training",
			     j->dst.v[tensor].name, rank, piece);
}

/* ---- the job -------------------------------------------------------------------- */

static void
job_free(slice_job_t *j)
{
	for (int s = 0; s < 2; s++) {
		for (size_t i = 0; i < j->cl[s].n; i++)
			free(j->cl[s].v[i].tmap);
		VEC_FREE(&j->cl[s]);
	}
	VEC_FREE(&j->events);
	for (size_t i = 0; i < j->nnodes; i++) {
		free((void *)j->nodes[i].ranks);
		free((void *)j->nodes[i].node_id);
		free((void *)j->nodes[i].endpoint);
	}
	free(j->nodes);
	free(j->peers);
	node_delta_job_free(j);
	plan_layout_set_fini(&j->src);
	plan_layout_set_fini(&j->dst);
	plan_topo_fini(&j->topo);
	plan_fini(&j->plan);
	if (j->cx != NULL)
		dp_conv_free(j->cx);
	if (j->converts)
		plan_convert_fini(&j->cv);
	free(j->model);
	free(j);
}

/* The slice's session is open: conversion on its device (NULL: host). */
static refit_status_t
job_open(void *ctx, const dp_dev_ops_t *dev, refit_err_t *err)
{
	slice_job_t *j = ctx;

	j->dev = dev;
	return j->cx ? dp_conv_set_dev(j->cx, dev, err) : REFIT_OK;
}

/* Before the session closes: everything this node receives has arrived
 * (ok): quantize into its ranks, and wait for it on a device; then free
 * the scratch, on the device while it is open. */
static refit_status_t
job_close(void *ctx, bool ok, refit_err_t *err)
{
	slice_job_t *j = ctx;
	refit_status_t rc = REFIT_OK;

	if (j->cx == NULL)
		return REFIT_OK;
	for (size_t r = 0; ok && rc == REFIT_OK && r < j->nodes[j->self].nranks; r++)
		rc = dp_conv_finish(j->cx, j->nodes[j->self].ranks[r], err);
	if (ok && rc == REFIT_OK && j->dev)
		rc = j->dev->sync(j->dev->ctx, err);
	dp_conv_release(j->cx);
	return rc;
}

static void
job_work(uv_work_t *w)
{
	slice_job_t *j = w->data;
	dp_mem_ops_t mem = {job_view, j, NULL};
	uint64_t *fixed = NULL;
	slice_cfg_t sc;

	refit_err_clear(&j->err);
	log_set_refit(j->refit_id); /* this pool thread's log lines name the refit */
	memset(&sc, 0, sizeof(sc));
	sc.plan = &j->plan;   /* no planning here: the slice came checked (node_slice.c) */
	sc.src = j->converts ? &j->cv.src : &j->src;
	sc.dst = j->converts ? &j->cv.dst : &j->dst;
	/* conversions (docs/conversion.md): the plan moves the rewritten pair,
	 * the wrapper converts between it and the clients' memory */
	if (j->converts)
		j->rc = dp_conv_new(&j->cv, &j->src, &j->dst, &mem, &j->cx, &j->err);
	if (j->rc != REFIT_OK)
		goto out;
	sc.mem = j->cx ? dp_conv_mem(j->cx) : &mem;
	sc.verify = j->verify;
	sc.corrupt = j->corrupt;
	sc.nodes = j->nodes;
	sc.nnodes = j->nnodes;
	sc.self = j->self;
	sc.xo = j->n->xo;
	sc.x = j->n->x;
	sc.refit_id = j->refit_id;
	sc.attempt = j->attempt;
	sc.epoch = j->epoch;
	sc.deadline_ms = j->deadline_ms;
	sc.abort = &j->abort;
	sc.test_delay_ms = (uint32_t)j->n->test_msg_delay_ms;
	sc.pool = j->n->pool;
	sc.connect_ms = j->n->connect_timeout_ms;
	sc.events = j->events.v;
	sc.nevents = j->events.n;
	sc.peers = j->peers;
	sc.on_open = job_open;
	sc.on_close = job_close;
	sc.hook_ctx = j;
	node_delta_cfg(j, &sc);
	if (j->cx) {   /* the conversion scratch, counted in the staging estimate */
		size_t nr = (size_t)plan_max_rank(&j->plan) + 1;

		fixed = xcalloc(nr, sizeof(*fixed));
		for (size_t i = 0; i < j->nodes[j->self].nranks; i++) {
			int32_t r = j->nodes[j->self].ranks[i];

			if (r >= 0 && (size_t)r < nr)
				fixed[r] = dp_conv_scratch_need(j->cx, r);
		}
		sc.staging_fixed = fixed;
		sc.nstaging_fixed = nr;
	}
	j->rc = slice_run(&sc, &j->st, &j->err);
	free(fixed);
out:
	log_set_refit(0);
}

static void
set_failure(client_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void
set_failure(client_t *c, const char *fmt, ...)
{
	char buf[REFIT_ERR_MSG_MAX];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	free(c->failure);
	c->failure = xstrdup(buf);
}

static void
job_after(uv_work_t *w, int status)
{
	slice_job_t *j = w->data;
	node_t *n = j->n;
	bool ok = j->rc == REFIT_OK && status == 0;

	for (size_t i = 0; i < n->jobs.n; i++)
		if (n->jobs.v[i] == j) {
			n->jobs.v[i] = n->jobs.v[--n->jobs.n];
			break;
		}
	if (ok && atomic_load(&j->abort)) {
		ok = false;
		j->rc = refit_err_set(&j->err, REFIT_ERR_ABORTED, "aborted: %s", j->abort_why);
	} else if (!ok && atomic_load(&j->abort) && j->abort_why[0] &&
		   (j->err.status == REFIT_ERR_ABORTED || strncmp(j->err.msg, "tcp: ", 5) == 0)) {
		/* failed because of the abort; a failure of its own (a CRC
		 * mismatch found before the abort came) keeps its own words,
		 * so the coordinator names it as the cause */
		refit_err_prefix(&j->err, "%s", j->abort_why);
	}
	if (ok) {
		prepared_t pr = {j->refit_id, j->version, xstrdup(j->model), NULL, 0, false};

		pr.clients = xcalloc(j->cl[1].n + 1, sizeof(*pr.clients));
		for (size_t i = 0; i < j->cl[1].n; i++)
			pr.clients[pr.nclients++] = j->cl[1].v[i].c->id;
		VEC_PUSH(&n->prepared, pr);
	}
	for (int s = 0; s < 2; s++)
		for (size_t i = 0; i < j->cl[s].n; i++) {
			client_t *c = j->cl[s].v[i].c;

			if (s == 0 && c->reading)
				c->reading--;
			if (!ok && !c->dead)
				set_failure(c, "refit %" PRIu64 " (version %" PRIu64 "): %s",
					    j->refit_id, j->version, j->err.msg);
			node_client_release(n, c);
		}
	if (ok)
		node_delta_metrics(j);
	if (ok)
		log_info("node %s: refit %" PRIu64 ": slice done in %.3f ms (%zu of the %" PRIu64
			 " transfers of plan %.12s, decoded in %.3f ms): %" PRIu64 " bytes sent in %"
			 PRIu64 " messages, %" PRIu64 " received, %" PRIu64 " copied locally, relay "
			 "staging peak %" PRIu64 " bytes", n->node_id, j->refit_id,
			 j->st.total_us / 1e3, j->plan.nxfers, j->plan_xfers, j->plan.digest_hex,
			 j->slice_us / 1e3,
			 j->st.bytes_out, j->st.msgs_out, j->st.bytes_in,
			 j->st.bytes_local, j->st.staged_max);
	else
		log_warnx("node %s: refit %" PRIu64 ": slice failed: %s", n->node_id,
			  j->refit_id, j->err.msg);
	if (!n->closing)
		node_report_queue(n, j, ok);
	job_free(j);
	node_waiters_sweep(n);
	node_maybe_free(n);
}

/* ---- RunSlice --------------------------------------------------------------- */

/* The client registered here for (model, role, instance), if any. */
static client_t *
find_client(node_t *n, const char *model, int role, const char *instance)
{
	for (size_t i = 0; i < n->clients.n; i++) {
		client_t *c = n->clients.v[i];

		if (strcmp(c->model, model) == 0 && c->role == role &&
		    (role == REFIT__V1__ROLE__TRAIN || strcmp(c->instance, instance) == 0))
			return c;
	}
	return NULL;
}

/* One client of the instance (or trainer) into the job, checked. */
static refit_status_t
take_client(slice_job_t *j, client_t *c, const char *iname, int role, const char *dg,
	    uint64_t version, refit_err_t *err)
{
	jclient_t jc;

	conv_layouts_digest(&c->layouts, c->digest);
	if (strcmp(dg, c->digest) != 0)
		return refit_err_set(err, REFIT_ERR_STALE_EPOCH, "model \"%s\" %s \"%s\": the "
				     "coordinator's layout (%.12s) is not the one registered on "
				     "this node (%.12s): register again", j->model,
				     role == REFIT__V1__ROLE__TRAIN ? "trainer" : "instance", iname,
				     dg, c->digest);
	if (role == REFIT__V1__ROLE__TRAIN && (!c->readable || c->version != version))
		return refit_err_set(err, REFIT_ERR_STALE_EPOCH, "model \"%s\": the trainer's "
				     "buffers on this node hold %s %" PRIu64 ", not version %"
				     PRIu64, j->model, c->readable ? "version" :
				     "(being written) version", c->version, version);
	jc.c = c;
	jc.copy = role == REFIT__V1__ROLE__INFER &&
		  c->install == REFIT__V1__INSTALL_MODE__DOUBLE_BUFFER ? c->active ^ 1 : 0;
	if (role == REFIT__V1__ROLE__INFER && c->serving >= 0 && (uint32_t)c->serving == jc.copy)
		return refit_err_set(err, REFIT_ERR_STALE_EPOCH, "model \"%s\" instance \"%s\": its "
				     "engine still serves copy %u (version %" PRIu64 " is in the "
				     "other; the engine has not switched to it yet): version %"
				     PRIu64 " would overwrite what it serves", j->model, iname,
				     jc.copy, c->version, version);
	jc.tmap = xmalloc((j->dst.n ? j->dst.n : 1) * sizeof(*jc.tmap));
	for (size_t t = 0; t < j->dst.n; t++) {
		jc.tmap[t] = -1;
		for (size_t k = 0; k < c->layouts.n; k++)
			if (strcmp(c->layouts.v[k].name, j->dst.v[t].name) == 0)
				jc.tmap[t] = (int32_t)k;
	}
	VEC_PUSH(&j->cl[role == REFIT__V1__ROLE__INFER], jc);
	for (size_t k = 0; role == REFIT__V1__ROLE__TRAIN && k < c->nevents; k++)
		VEC_PUSH(&j->events, c->events[k]);
	return REFIT_OK;
}

/* Take instance set s of role into the job: its client here (or the clients
 * of its group, each with some of this node's ranks), if it has ranks here. */
static refit_status_t
take_instance(slice_job_t *j, const char *iname, int role, const plan_layout_set_t *s,
	      uint64_t version, refit_err_t *err)
{
	node_t *n = j->n;
	bool here = false;
	client_t *c;
	char dg[SHA256_HEX_LEN];

	for (size_t t = 0; t < s->n && !here; t++)
		for (size_t k = 0; k < s->v[t].nshards && !here; k++)
			here = node_serves(n, s->v[t].shards[k].rank);
	if (!here)
		return REFIT_OK;
	c = find_client(n, j->model, role, iname);
	if (c == NULL)
		return refit_err_set(err, REFIT_ERR_NOT_FOUND, "model \"%s\": %s \"%s\" has ranks "
				     "on this node but no librefit client registered its memory "
				     "here", j->model, role == REFIT__V1__ROLE__TRAIN ? "trainer" :
				     "inference instance", iname);
	if (c->partial && !c->forwarded)
		return refit_err_set(err, REFIT_ERR_NOT_FOUND, "model \"%s\": %s \"%s\": some "
				     "of this node's ranks have no client registered here yet",
				     j->model, role == REFIT__V1__ROLE__TRAIN ? "trainer" :
				     "instance", iname);
	conv_layouts_digest(s, dg);
	CHECK(take_client(j, c, iname, role, dg, version, err));
	if (!c->partial)
		return REFIT_OK;
	for (size_t i = 0; i < n->clients.n; i++)
		if (n->clients.v[i]->partial && node_group_same(n->clients.v[i], c))
			CHECK(take_client(j, n->clients.v[i], iname, role, dg, version, err));
	return REFIT_OK;
}

/* The plan's pair (converted: docs/conversion.md) and this node's slice of
 * the plan, checked once here (node_slice.c): nothing is planned. */
static refit_status_t
job_take_slice(slice_job_t *j, const Refit__V1__RunSliceRequest *rq, refit_err_t *err)
{
	uint64_t t0 = uv_hrtime();
	refit_status_t rc;

	if (plan_convert_any(&j->dst)) {
		/* on a device (nccl): the kernels convert (job_open says when not) */
		CHECK(plan_convert_apply(&j->src, &j->dst, &j->cv, err));
		j->converts = true;
	}
	rc = node_slice_take(j->n, rq, j->converts ? &j->cv.dst : &j->dst, &j->topo, &j->opts,
			     &j->plan, err);
	if (rc != REFIT_OK)
		return rc;
	j->plan_xfers = rq->plan_xfers;
	j->slice_us = (uv_hrtime() - t0) / 1000;
	return REFIT_OK;
}

static refit_status_t
job_setup(slice_job_t *j, const Refit__V1__RunSliceRequest *rq, refit_err_t *err)
{
	node_t *n = j->n;
	VEC(plan_layout_set_t) inf = {0};
	const plan_layout_set_t **ptrs = NULL;
	bool have_train = false;
	refit_status_t rc = REFIT_OK;

	plan_layout_set_init(&j->src);
	plan_layout_set_init(&j->dst);
	plan_topo_init(&j->topo);
	j->topo.nic_per_node = rq->nic_per_node;
	for (size_t i = 0; i < rq->n_instances && rc == REFIT_OK; i++) {
		const Refit__V1__InstanceLayouts *il = rq->instances[i];
		plan_layout_set_t s;

		rc = conv_layouts_from_proto(il->tensors, il->n_tensors, &s, err);
		if (rc != REFIT_OK)
			break;
		if (il->role == REFIT__V1__ROLE__TRAIN && !have_train) {
			j->src = s;
			have_train = true;
		} else if (il->role == REFIT__V1__ROLE__INFER) {
			VEC_PUSH(&inf, s);
		} else {
			plan_layout_set_fini(&s);
			rc = refit_err_set(err, REFIT_ERR_INVALID_ARG, "instance \"%s\": bad role",
					   nz(il->instance));
		}
	}
	if (rc == REFIT_OK && (!have_train || inf.n == 0))
		rc = refit_err_set(err, REFIT_ERR_INVALID_ARG, "RunSlice needs the trainer's and "
				   "at least one instance's layouts");
	if (rc == REFIT_OK) {
		ptrs = xcalloc(inf.n, sizeof(*ptrs));
		for (size_t i = 0; i < inf.n; i++)
			ptrs[i] = &inf.v[i];
		rc = plan_layout_compose(ptrs, inf.n, &j->dst, err);
	}
	/* the clients on this node, in the coordinator's instance order */
	for (size_t i = 0, k = 0; i < rq->n_instances && rc == REFIT_OK; i++) {
		const Refit__V1__InstanceLayouts *il = rq->instances[i];

		if (il->role == REFIT__V1__ROLE__TRAIN)
			rc = take_instance(j, "", REFIT__V1__ROLE__TRAIN, &j->src, rq->version,
					   err);
		else
			rc = take_instance(j, nz(il->instance), REFIT__V1__ROLE__INFER,
					   &inf.v[k++], rq->version, err);
	}
	for (size_t i = 0; i < inf.n; i++)
		plan_layout_set_fini(&inf.v[i]);
	VEC_FREE(&inf);
	free(ptrs);
	if (rc != REFIT_OK)
		return rc;
	/* the world of the epoch, in the coordinator's member order */
	j->nodes = xcalloc(n->world.n ? n->world.n : 1, sizeof(*j->nodes));
	j->self = SIZE_MAX;
	for (size_t i = 0; i < n->world.n; i++) {
		const epoch_member_t *m = &n->world.v[i];
		int32_t *r = xmalloc((m->nranks ? m->nranks : 1) * sizeof(*r));

		memcpy(r, m->ranks, m->nranks * sizeof(*r));
		/* copies: a PrepareEpoch for another refit may replace the world */
		j->nodes[i] = (slice_node_t){xstrdup(m->node_id), xstrdup(m->data_ep), r,
					     m->nranks};
		if (strcmp(m->node_id, n->node_id) == 0)
			j->self = i;
		for (size_t k = 0; k < m->nranks && rc == REFIT_OK; k++)
			rc = plan_topo_add_rank(&j->topo, m->ranks[k], m->node_id,
						m->domains[k], err);
	}
	j->nnodes = n->world.n;
	j->peers = xcalloc(j->nnodes ? j->nnodes : 1, sizeof(*j->peers));
	node_delta_job(j, rq);
	if (rc == REFIT_OK && j->self == SIZE_MAX)
		rc = refit_err_set(err, REFIT_ERR_STALE_EPOCH, "this node is not a member of "
				   "epoch %" PRIu64, j->epoch);
	return rc == REFIT_OK ? job_take_slice(j, rq, err) : rc;
}


/* Was (refit, epoch, attempt) aborted here?  An attempt of 0 in the Abort
 * (an older coordinator) covers every attempt. */
static const aborted_t *
was_aborted(const node_t *n, uint64_t id, uint64_t epoch, uint32_t attempt)
{
	size_t m = n->naborted < NODE_ABORTED_MAX ? n->naborted : NODE_ABORTED_MAX;

	for (size_t i = 0; i < m; i++) {
		const aborted_t *a = &n->aborted[i];

		if (a->refit_id == id && a->epoch == epoch &&
		    (a->attempt == 0 || a->attempt == attempt))
			return a;
	}
	return NULL;
}

/* Does the finished slice p hold a client that job j writes? */
static bool
shares_client(const prepared_t *p, const slice_job_t *j)
{
	for (size_t i = 0; i < p->nclients; i++)
		for (size_t k = 0; k < j->cl[1].n; k++)
			if (j->cl[1].v[k].c->id == p->clients[i])
				return true;
	return false;
}

static void
run_slice(node_t *n, rpc_call_t *call, const ProtobufCMessage *msg)
{
	const Refit__V1__RunSliceRequest *rq = (const void *)msg;
	Refit__V1__RunSliceResponse rsp = REFIT__V1__RUN_SLICE_RESPONSE__INIT;
	slice_job_t *j;
	refit_err_t err;

	if (n->closing)
		return rpc_call_fail(call, REFIT_ERR_UNAVAILABLE, "node %s: shutting down",
				     n->node_id);
	if (node_epoch_refused(n, call, "RunSlice", rq->refit_id, rq->epoch))
		return;
	/* refused before any client memory is touched (an in-place instance
	 * would be marked invalid); the coordinator learns why from the next
	 * Heartbeat and fails the refits needing this node from then on */
	if (node_poisoned(n) != NULL)
		return rpc_call_fail(call, REFIT_ERR_UNAVAILABLE, "node %s is poisoned: restart "
				     "refitd on it: %s", n->node_id, n->poisoned);
	if (was_aborted(n, rq->refit_id, rq->epoch, rq->attempt) != NULL) {
		/* the Abort overtook it: the peers have stopped, so the slice
		 * would only wait for them until its deadline */
		log_info("node %s: refit %" PRIu64 " (attempt %u): RunSlice refused: the refit "
			 "was aborted here before it came", n->node_id, rq->refit_id,
			 rq->attempt);
		return rpc_call_fail(call, REFIT_ERR_ABORTED, "node %s: refit %" PRIu64
				     " (attempt %u) was aborted by the coordinator before its "
				     "RunSlice came", n->node_id, rq->refit_id, rq->attempt);
	}
	for (size_t i = 0; i < n->jobs.n; i++)
		if (n->jobs.v[i]->refit_id == rq->refit_id)
			return rpc_call_fail(call, REFIT_ERR_EXISTS, "node %s: refit %" PRIu64
					     " is already running here", n->node_id, rq->refit_id);
	refit_err_clear(&err);
	j = xcalloc(1, sizeof(*j));
	j->n = n;
	j->refit_id = rq->refit_id;
	j->attempt = rq->attempt;
	j->epoch = rq->epoch;
	j->version = rq->version;
	j->model = xstrdup(nz(rq->model));
	plan_opts_default(&j->opts);
	j->opts.mode = rq->mode == REFIT__V1__MODE__BROADCAST ? PLAN_MODE_BROADCAST :
								  PLAN_MODE_RESHARD;
	if (rq->chunk_bytes)
		j->opts.chunk_bytes = rq->chunk_bytes;
	if (rq->staging_bytes)
		j->opts.staging_bytes = rq->staging_bytes;
	j->verify = rq->verify;
	j->corrupt = rq->corrupt_msg > 0 ? rq->corrupt_msg - 1 : -1;
	/* this node's own slice_timeout_ms, when set, overrides the coordinator's */
	j->deadline_ms = xport_now_ms() + (int64_t)(n->slice_timeout_ms ? n->slice_timeout_ms :
						    rq->timeout_ms ? rq->timeout_ms :
						    NODE_SLICE_TIMEOUT_MS);
	if (job_setup(j, rq, &err) != REFIT_OK) {
		log_warnx("node %s: refit %" PRIu64 ": %s", n->node_id, rq->refit_id, err.msg);
		rpc_call_fail(call, err.status, "node %s: %s", n->node_id, err.msg);
		job_free(j);
		return;
	}
	/* a commit never published (the coordinator restarted, or its Publish
	 * was lost) of memory this slice writes again is superseded: it must
	 * not flip later */
	for (size_t i = 0; i < n->prepared.n;)
		if (shares_client(&n->prepared.v[i], j)) {
			log_info("node %s: refit %" PRIu64 " (version %" PRIu64 ") was never "
				 "published here; refit %" PRIu64 " replaces it", n->node_id,
				 n->prepared.v[i].refit_id, n->prepared.v[i].version,
				 j->refit_id);
			node_drop_prepared(n, &n->prepared.v[i]);
		} else {
			i++;
		}
	for (int s = 0; s < 2; s++)
		for (size_t i = 0; i < j->cl[s].n; i++) {
			client_t *c = j->cl[s].v[i].c;

			c->busy++;
			if (s == 0)
				c->reading++;
			else if (c->install == REFIT__V1__INSTALL_MODE__IN_PLACE)
				c->valid = false; /* before the first byte lands */
		}
	j->w.data = j;
	VEC_PUSH(&n->jobs, j);
	/* while a slice runs the sweep (node.c) checks clients every 50 ms: the
	 * idle period is 500 ms, so bring the next tick forward now */
	if (uv_timer_get_repeat(&n->sweep) != 50) {
		uv_timer_set_repeat(&n->sweep, 50);
		uv_timer_again(&n->sweep);
	}
	if (uv_queue_work(n->loop, &j->w, job_work, job_after) != 0) {
		rpc_call_fail(call, REFIT_ERR_SYS, "node %s: cannot queue the slice", n->node_id);
		j->rc = refit_err_set(&j->err, REFIT_ERR_SYS, "cannot queue the slice");
		job_after(&j->w, -1);
		return;
	}
	/* the end of the slice is reported with SliceDone */
	rsp.refit_id = rq->refit_id;
	rsp.started = true;
	rpc_call_reply(call, &rsp.base);
}

static void
h_run(void *ctx, rpc_call_t *call, const ProtobufCMessage *msg)
{
	node_t *n = ctx;
	const Refit__V1__RunSliceRequest *rq = (const void *)msg;

	if (n->test_hold_run_ms > 0 && !n->closing) {
		held_run_t h = {call, msg, rq->refit_id,
				xport_now_ms() + (int64_t)n->test_hold_run_ms};

		log_info("node %s: refit %" PRIu64 ": RunSlice held (test_hold_run_ms)",
			 n->node_id, rq->refit_id);
		VEC_PUSH(&n->held, h);
		return;
	}
	run_slice(n, call, msg);
}

void
node_run_held_tick(node_t *n, uint64_t refit_id)
{
	int64_t now = xport_now_ms();

	for (size_t i = 0; i < n->held.n;) {
		held_run_t h = n->held.v[i];

		if (!n->closing && (refit_id ? h.refit_id != refit_id : now < h.until_ms)) {
			i++;
			continue;
		}
		n->held.v[i] = n->held.v[--n->held.n];
		run_slice(n, h.call, h.msg);
	}
	if (n->held.n == 0)
		VEC_FREE(&n->held);
}

static void
abort_job(slice_job_t *j, const char *why)
{
	static const char coord[] = "aborted by the coordinator";
	bool first = !atomic_load(&j->abort);

	/* the first reason stays, except that a cause found here (a librefit
	 * client gone) replaces the coordinator's abort, which only echoes
	 * what other nodes saw of it */
	if (first || (strncmp(j->abort_why, coord, sizeof(coord) - 1) == 0 &&
		      strncmp(why, coord, sizeof(coord) - 1) != 0))
		snprintf(j->abort_why, sizeof(j->abort_why), "%s", why);
	atomic_store(&j->abort, 1);
}

static void
h_abort(void *ctx, rpc_call_t *call, const ProtobufCMessage *msg)
{
	node_t *n = ctx;
	const Refit__V1__AbortRequest *rq = (const void *)msg;
	Refit__V1__AbortResponse rsp = REFIT__V1__ABORT_RESPONSE__INIT;
	prepared_t *p = node_find_prepared(n, rq->refit_id);
	aborted_t *a;
	uint64_t id;
	char why[300];

	if (node_epoch_refused(n, call, "Abort", rq->refit_id, rq->epoch))
		return;
	snprintf(why, sizeof(why), "aborted by the coordinator: %s", nz(rq->reason));
	/* remembered: a RunSlice that the Abort overtook is refused */
	a = &n->aborted[n->naborted++ % NODE_ABORTED_MAX];
	*a = (aborted_t){rq->refit_id, rq->epoch, rq->attempt};
	for (size_t i = 0; i < n->jobs.n; i++)
		if (n->jobs.v[i]->refit_id == rq->refit_id)
			abort_job(n->jobs.v[i], why);
	if (p != NULL) {
		/* never published: double buffers keep serving the old copy,
		 * in-place weights stay invalid; the clients are told why */
		for (size_t i = 0; i < p->nclients; i++) {
			client_t *c = node_client(n, p->clients[i]);

			if (c != NULL && !c->dead)
				set_failure(c, "refit %" PRIu64 " (version %" PRIu64 ") was not "
					    "installed: %s", p->refit_id, p->version, why);
		}
		node_drop_prepared(n, p);
	}
	log_info("node %s: refit %" PRIu64 " aborted: %s", n->node_id, rq->refit_id,
		 nz(rq->reason));
	id = rq->refit_id;
	rpc_call_reply(call, &rsp.base);  /* frees rq */
	node_run_held_tick(n, id);
}

void
node_run_abort_all(node_t *n, const char *why)
{
	for (size_t i = 0; i < n->jobs.n; i++)
		abort_job(n->jobs.v[i], why);
	while (n->prepared.n)
		node_drop_prepared(n, &n->prepared.v[0]);
}

void
node_run_client_gone(node_t *n, uint64_t client_id, const char *why)
{
	char buf[300];

	for (size_t i = 0; i < n->jobs.n; i++) {
		slice_job_t *j = n->jobs.v[i];

		for (int s = 0; s < 2; s++)
			for (size_t k = 0; k < j->cl[s].n; k++)
				if (j->cl[s].v[k].c->id == client_id) {
					snprintf(buf, sizeof(buf), "librefit client %" PRIu64
						 " (model \"%s\") went away: %s", client_id,
						 j->model, why);
					abort_job(j, buf);
				}
	}
}

const rpc_method_cfg_t node_run_methods[] = {
	{"RunSlice", h_run},
	{"Commit", node_h_commit},
	{"Abort", h_abort},
	{"Publish", node_h_publish},
};
const size_t node_run_nmethods = sizeof(node_run_methods) / sizeof(node_run_methods[0]);

/* Staging reserved by the slices running now: their staging_bytes budgets
 * (metrics, daemon/ops.c). */
uint64_t
node_staging_reserved(const node_t *n)
{
	uint64_t sum = 0;

	for (size_t i = 0; i < n->jobs.n; i++)
		sum += n->jobs.v[i]->opts.staging_bytes;
	return sum;
}
