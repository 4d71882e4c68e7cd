/*
 * node.c - the node role (see node.h).
 *
 * Membership: a timer joins the coordinator, then heartbeats; a heartbeat
 * answered NOT_FOUND (lease lost, or the coordinator restarted) joins
 * again.  PrepareEpoch records the epoch and its data-plane token and
 * refuses an epoch older than the one prepared.  Setup and teardown: the
 * node's transport, services and timers; freed once closing and nothing
 * holds it.  The top of the node's files (node_internal.h): it calls
 * node_run.c and node_local.c, and fills the hooks they call up through.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "common/alloc.h"
#include "common/log.h"
#include "daemon/metrics.h"
#include "daemon/node/node_internal.h"
#include "daemon/transport/gpu.h"
#include "refit/v1/refit.pb-c.h"

#define CALL_MS 5000

/* Forget the epoch's members (the world a PrepareEpoch described). */
static void
world_clear(node_t *n)
{
	for (size_t i = 0; i < n->world.n; i++) {
		free(n->world.v[i].node_id);
		free(n->world.v[i].data_ep);
		free(n->world.v[i].ranks);
		for (size_t k = 0; k < n->world.v[i].nranks; k++)
			free(n->world.v[i].domains[k]);
		free(n->world.v[i].domains);
	}
	n->world.n = 0;
}

/* xport_cfg_t.refused, on the listener's thread: a data connection refused
 * is counted (refitd_auth_refused_total) and logged once a minute per host. */
static void
data_refused(void *ctx, const char *host, const char *reason, const char *msg)
{
	node_t *n = ctx;
	uint64_t quiet = 0;

	metrics_auth_refused("tcp data connection", reason);
	if (rpc_refusals_note(&n->data_refusals, host, uv_hrtime(), &quiet))
		log_warnx("tcp: refused a data connection from %s: %s (%" PRIu64 " more from %s "
			  "since the last line; they are logged once a minute)", host, msg, quiet,
			  host);
}

/* node_hooks_t.maybe_free */
static void
free_if_idle(node_t *n)
{
	if (!n->closing || n->handles || n->inflight || n->jobs.n)
		return;
	node_reports_drop(n);
	VEC_FREE(&n->reports);
	node_local_stop(n);
	if (n->x)
		n->xo->stop(n->x);
	rpc_refusals_fini(&n->data_refusals);
	dp_pool_free(n->pool);
	delta_store_free(n->delta);
	gdelta_store_free(n->gdelta);
	world_clear(n);
	VEC_FREE(&n->world);
	free(n->poisoned);
	for (size_t i = 0; i < n->ncoords; i++)
		free(n->coords[i]);
	free(n->coords);
	free(n->node_id);
	free(n->advertise);
	free(n->domain);
	free(n->ranks);
	free(n->data_ep);
	free(n);
}

static const node_hooks_t hooks = {
	.maybe_free = free_if_idle,
	.client_gone = node_run_client_gone,
	.follow = node_follow,
};

/* ---- membership --------------------------------------------------------- */

/* A Join or Heartbeat answered: the next may go; false when closing. */
static bool
member_call_settled(node_t *n)
{
	n->inflight--;
	n->busy = false;
	return !n->closing;
}

static void on_tick(uv_timer_t *t);

/*
 * A call to the coordinator failed with st, msg.  With several
 * coordinators (docs/ha.md): a standby's UNAVAILABLE "not the leader: ADDR"
 * is followed to ADDR at once, another unreachable one to the next in the
 * list; the next beat (now) joins there (the new leader answers NOT_FOUND
 * to an old member id, then the node joins).  True when it moved.
 */
bool
node_follow(node_t *n, refit_status_t st, const char *msg)
{
	const char *p = strstr(msg, "not the leader: ");
	size_t next = (n->coord_i + 1) % n->ncoords;

	if (n->ncoords < 2 || (st != REFIT_ERR_UNAVAILABLE && st != REFIT_ERR_TIMEOUT))
		return false;
	if (p == NULL)
		n->coord_dead = n->coord_i;
	for (size_t i = 0; p != NULL && i < n->ncoords; i++) {
		size_t len = strlen(n->coords[i]);

		if (strncmp(p + 16, n->coords[i], len) != 0 ||
		    (p[16 + len] != '\0' && p[16 + len] != ' ' && p[16 + len] != ')'))
			continue;
		/* a standby's view may lag behind a leader's death: not straight
		 * back to the one just found unreachable (once; then believed) */
		if (i == n->coord_dead)
			n->coord_dead = n->ncoords;
		else
			next = i;
	}
	if (next == n->coord_i)
		return false;
	log_info("node %s: coordinator %s %s: trying %s", n->node_id, n->coordinator,
		 p ? "is a standby" : "unreachable", n->coords[next]);
	n->coord_i = next;
	n->coordinator = n->coords[next];
	if (strstr(msg, "Heartbeat") || strstr(msg, "Join"))
		n->member_id = 0;  /* else a heartbeat there says whether it knows us */
	uv_timer_start(&n->beat, on_tick, p ? 0 : 50, uv_timer_get_repeat(&n->beat));
	return true;
}

static void
on_join(void *arg, refit_status_t st, const char *msg, ProtobufCMessage *resp)
{
	node_t *n = arg;

	if (member_call_settled(n)) {
		if (st != REFIT_OK) {
			log_warnx("node %s: Join: %s (retrying)", n->node_id, msg);
			node_follow(n, st, msg);
		} else {
			const Refit__V1__JoinResponse *r = (const void *)resp;

			n->member_id = r->member_id;
			n->lose_refit = 0;  /* test_lose_publish: reachable again */
			n->epoch = r->epoch;
			n->coord_dead = n->ncoords;
			log_info("node %s: joined as member %" PRIu64 " at epoch %" PRIu64
				 " (lease %u ms)", n->node_id, r->member_id, r->epoch,
				 r->lease_ttl_ms);
			if (r->heartbeat_ms)
				uv_timer_set_repeat(&n->beat, r->heartbeat_ms);
			node_local_rejoined(n);
		}
	}
	node_maybe_free(n);
}

static void leave(node_t *n);

static void
on_beat_done(void *arg, refit_status_t st, const char *msg, ProtobufCMessage *resp)
{
	node_t *n = arg;

	if (member_call_settled(n)) {
		if (st == REFIT_ERR_NOT_FOUND) {
			log_warnx("node %s: %s: joining again", n->node_id, msg);
			n->member_id = 0;
		} else if (st != REFIT_OK) {
			log_warnx("node %s: Heartbeat: %s", n->node_id, msg);
			node_follow(n, st, msg);
		} else if (((const Refit__V1__HeartbeatResponse *)resp)->drain) {
			log_info("node %s: drained by the operator: leaving the membership and "
				 "staying out until restarted", n->node_id);
			n->drained = true;
			leave(n);
		} else {
			const Refit__V1__HeartbeatResponse *r = (const void *)resp;

			if (r->epoch != n->epoch)
				log_info("node %s: epoch %" PRIu64 " -> %" PRIu64, n->node_id,
					 n->epoch, r->epoch);
			n->epoch = r->epoch;
		}
	}
	node_maybe_free(n);
}

static void
on_tick(uv_timer_t *t)
{
	node_t *n = t->data;
	refit_err_t err;

	if (n->busy || n->closing || n->drained)
		return;
	refit_err_clear(&err);
	if (n->member_id == 0) {
		Refit__V1__JoinRequest rq = REFIT__V1__JOIN_REQUEST__INIT;
		Refit__V1__RankInfo *rv = xcalloc(n->nranks, sizeof(*rv));
		Refit__V1__RankInfo **rp = xcalloc(n->nranks, sizeof(*rp));

		for (size_t i = 0; i < n->nranks; i++) {
			refit__v1__rank_info__init(&rv[i]);
			rv[i].rank = n->ranks[i];
			rv[i].domain = n->domain;
			rp[i] = &rv[i];
		}
		rq.node_id = n->node_id;
		rq.host = n->advertise;
		rq.rpc_endpoint = n->advertise;
		rq.data_endpoint = n->data_ep;
		rq.transport = (char *)n->xo->name;
		rq.prepared_epoch = n->prepared_epoch;
		rq.poisoned = (char *)(node_poisoned(n) ? n->poisoned : "");
		rq.ranks = rp;
		rq.n_ranks = n->nranks;
		if (rpc_async_call(n->rpc, RPC_GROUP_NONE, n->coordinator,
				   &refit__v1__coordinator__descriptor, "Join", &rq.base, CALL_MS,
				   on_join, n, &err) == REFIT_OK) {
			n->busy = true;
			n->inflight++;
		}
		free(rv);
		free(rp);
	} else {
		Refit__V1__HeartbeatRequest rq = REFIT__V1__HEARTBEAT_REQUEST__INIT;
		node_engine_beat_t keep;

		rq.member_id = n->member_id;
		rq.epoch = n->epoch;
		rq.poisoned = (char *)(node_poisoned(n) ? n->poisoned : "");
		node_engine_beat(n, &rq, &keep);
		if (rpc_async_call(n->rpc, RPC_GROUP_NONE, n->coordinator,
				   &refit__v1__coordinator__descriptor, "Heartbeat", &rq.base,
				   CALL_MS, on_beat_done, n, &err) == REFIT_OK) {
			n->busy = true;
			n->inflight++;
		}
		node_engine_beat_free(&keep);
	}
	if (err.status != REFIT_OK)
		log_warnx("node %s: %s", n->node_id, err.msg);
}

/* Every 50 ms while slices run or waits, unacknowledged reports or held runs
 * are pending, every 500 ms otherwise (clients' pids): an idle node wakes 2
 * times a second for it, not 20 (1,024 idle nodes on 2 cores spent a third of
 * a core on it), and a client that dies mid-refit is still noticed at once. */
static void
on_sweep(uv_timer_t *t)
{
	node_t *n = t->data;
	uint64_t period;

	node_waiters_sweep(n);
	node_engine_sweep(n);
	node_reports_tick(n);
	node_run_held_tick(n, 0);
	if (node_poisoned(n) && (n->exit_poisoned || n->poison_dead) && n->poisoned_exit &&
	    !n->exiting && !n->closing && n->jobs.n == 0 && n->reports.n == 0) {
		/* once every slice has ended (the transport may see the poison
		 * while a slice job still runs: its report is queued when it
		 * ends, each job is bounded by its slice deadline) and the
		 * coordinator has the reports (they say so; each is bounded by
		 * its give-up time): a node that left first would make its
		 * refit fail as a membership change, and be retried */
		n->exiting = true;
		log_errorx("node %s: %s: stopping with status %d, for systemd to restart refitd "
			   "(exiting hands the memory the GPU may still write back to the "
			   "driver)", n->node_id, n->poison_dead ? "a sticky CUDA error" :
			   "poisoned_exit", NODE_EXIT_POISONED);
		n->poisoned_exit(n->poisoned_exit_arg);
		return;
	}
	period = n->jobs.n || n->waiters.n || n->iwaiters.n || n->reports.n || n->held.n ? 50
											    : 500;
	if (uv_timer_get_repeat(t) != period)
		uv_timer_set_repeat(t, period);
}

/* ---- Node service -------------------------------------------------------- */

static int
cmp_i32(const void *a, const void *b)
{
	int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;

	return (x > y) - (x < y);
}

/*
 * NcclId: a fresh communicator id, made here (the node of the lowest rank).
 * Made on a pool thread, not the loop: the transport starts a root-holder
 * child that calls ncclGetUniqueId (bounded at 10 s), and a loop waiting
 * for it would miss heartbeats (the coordinator would expire the node).
 * The call stays alive until it is answered.
 */
typedef struct idjob {
	uv_work_t w;
	node_t *n;
	rpc_call_t *call;
	uint8_t id[256];
	size_t len;
	refit_err_t err;
} idjob_t;

static void
id_work(uv_work_t *w)
{
	idjob_t *j = w->data;

	refit_err_clear(&j->err);
	j->len = sizeof(j->id);
	(void)j->n->xo->unique_id(j->n->x, j->id, &j->len, &j->err);
}

static void
id_after(uv_work_t *w, int status)
{
	idjob_t *j = w->data;
	node_t *n = j->n;
	Refit__V1__NcclIdResponse rsp = REFIT__V1__NCCL_ID_RESPONSE__INIT;

	n->inflight--;
	if (j->err.status == REFIT_OK && (status != 0 || n->closing))
		refit_err_set(&j->err, REFIT_ERR_UNAVAILABLE, "the node daemon is shutting down");
	if (j->err.status != REFIT_OK) {
		rpc_call_fail(j->call, j->err.status, "node %s: %s", n->node_id, j->err.msg);
	} else {
		rsp.nccl_unique_id.data = j->id;
		rsp.nccl_unique_id.len = j->len;
		rpc_call_reply(j->call, &rsp.base);
	}
	free(j);
	node_maybe_free(n);
}

static void
h_nccl_id(void *ctx, rpc_call_t *call, const ProtobufCMessage *msg)
{
	node_t *n = ctx;
	idjob_t *j = xcalloc(1, sizeof(*j));

	(void)msg;
	j->n = n;
	j->call = call;
	j->w.data = j;
	if (uv_queue_work(n->loop, &j->w, id_work, id_after) != 0) {
		free(j);
		return rpc_call_fail(call, REFIT_ERR_SYS, "node %s: cannot queue the making of "
				     "an NCCL unique id", n->node_id);
	}
	n->inflight++;
}

/* Hand the epoch's world (every member's ranks, sorted, and the NCCL unique id
 * when the coordinator sent one) to the transport; tcp keeps nothing of it. */
static void
world_tell(node_t *n, const Refit__V1__PrepareEpochRequest *rq)
{
	VEC(int32_t) all = {0};
	const char **peers = xcalloc(n->world.n + 1, sizeof(*peers));
	uint8_t (*verifiers)[32] = xcalloc(n->world.n + 1, sizeof(*verifiers));
	const char **eps = xcalloc(n->world.n + 1, sizeof(*eps));
	xport_world_t w = {rq->epoch, NULL, 0, n->ranks, n->nranks,
			   rq->nccl_unique_id.data, rq->nccl_unique_id.len, peers,
			   (const uint8_t (*)[32])verifiers, eps, n->world.n};

	for (size_t i = 0; i < n->world.n; i++) {
		for (size_t k = 0; k < n->world.v[i].nranks; k++)
			VEC_PUSH(&all, n->world.v[i].ranks[k]);
		peers[i] = n->world.v[i].node_id;
		eps[i] = n->world.v[i].data_ep;
		memcpy(verifiers[i], n->world.v[i].verifier, sizeof(verifiers[i]));
	}
	xqsort(all.v, all.n, sizeof(int32_t), cmp_i32);
	w.ranks = all.v;
	w.nranks = all.n;
	n->xo->set_world(n->x, &w);
	VEC_FREE(&all);
	free(peers);
	free(eps);
	free(verifiers);
}

static void
h_prepare(void *ctx, rpc_call_t *call, const ProtobufCMessage *msg)
{
	node_t *n = ctx;
	const Refit__V1__PrepareEpochRequest *rq = (const void *)msg;
	Refit__V1__PrepareEpochResponse rsp = REFIT__V1__PREPARE_EPOCH_RESPONSE__INIT;
	uint64_t t0 = uv_hrtime();

	if (rq->epoch < n->prepared_epoch)
		return rpc_call_fail(call, REFIT_ERR_STALE_EPOCH, "node %s: PrepareEpoch: epoch %"
				     PRIu64 " is older than epoch %" PRIu64 " prepared here",
				     n->node_id, rq->epoch, n->prepared_epoch);
	if (rq->token.len > sizeof(n->token))
		return rpc_call_fail(call, REFIT_ERR_INVALID_ARG, "node %s: PrepareEpoch: token "
				     "of %zu bytes (at most %zu)", n->node_id, rq->token.len,
				     sizeof(n->token));
	for (size_t i = 0; i < rq->n_members; i++) {
		if (rq->members[i]->data_endpoint == NULL || !rq->members[i]->data_endpoint[0])
			return rpc_call_fail(call, REFIT_ERR_INVALID_ARG, "node %s: PrepareEpoch: "
					     "member \"%s\" has no data endpoint", n->node_id,
					     rq->members[i]->node_id);
		if (rq->members[i]->data_verifier.len != 32)
			return rpc_call_fail(call, REFIT_ERR_INVALID_ARG, "node %s: PrepareEpoch: "
					     "member \"%s\": data verifier of %zu bytes (32)",
					     n->node_id, rq->members[i]->node_id,
					     rq->members[i]->data_verifier.len);
	}
	if (rq->epoch != n->prepared_epoch)
		node_run_abort_all(n, "a new epoch was prepared");
	world_clear(n);
	for (size_t i = 0; i < rq->n_members; i++) {
		const Refit__V1__Member *m = rq->members[i];
		epoch_member_t em = {xstrdup(m->node_id ? m->node_id : ""),
				     xstrdup(m->data_endpoint), NULL, NULL, m->n_ranks, {0}};

		memcpy(em.verifier, m->data_verifier.data, sizeof(em.verifier));
		em.ranks = xcalloc(m->n_ranks ? m->n_ranks : 1, sizeof(int32_t));
		em.domains = xcalloc(m->n_ranks ? m->n_ranks : 1, sizeof(char *));
		for (size_t k = 0; k < m->n_ranks; k++) {
			em.ranks[k] = m->ranks[k]->rank;
			em.domains[k] = xstrdup(m->ranks[k]->domain && m->ranks[k]->domain[0] ?
						m->ranks[k]->domain : em.node_id);
		}
		VEC_PUSH(&n->world, em);
	}
	/* the same epoch again (another model's refit): the transport keeps its
	 * connections; only a change of epoch resets it */
	bool changed = rq->epoch != n->prepared_epoch || rq->token.len != n->token_len ||
		       (rq->token.len && memcmp(n->token, rq->token.data, rq->token.len) != 0);

	n->prepared_epoch = rq->epoch;
	memcpy(n->token, rq->token.data, rq->token.len);
	n->token_len = rq->token.len;
	if (changed) {
		n->xo->set_epoch(n->x, rq->epoch, n->token, n->token_len);
		dp_pool_epoch(n->pool, rq->epoch, 0); /* idle buffers go now */
	}
	world_tell(n, rq);
	rsp.epoch = rq->epoch;
	rsp.micros = (uv_hrtime() - t0) / 1000;
	log_info("node %s: epoch %" PRIu64 " prepared", n->node_id, rq->epoch);
	rpc_call_reply(call, &rsp.base);
}

static const rpc_method_cfg_t prep_methods[] = {
	{"PrepareEpoch", h_prepare},
	{"NcclId", h_nccl_id},
};

/*
 * This process's session secret (rpc_auth.h, "member"): sent with every
 * call to the coordinator, Join included, which binds the membership to it;
 * with a join token the Node service answers only calls presenting it (the
 * coordinator's, which alone has it).  A restart makes a new one.
 */
static refit_status_t
session_start(node_t *n, rpc_server_t *srv, bool bound, refit_err_t *err)
{
	uint8_t raw[(sizeof(n->session) - 1) / 2];

	if (getrandom(raw, sizeof(raw), 0) != (ssize_t)sizeof(raw))
		return refit_err_set(err, REFIT_ERR_SYS, "node: getrandom: %s", strerror(errno));
	for (size_t i = 0; i < sizeof(raw); i++)
		snprintf(n->session + 2 * i, 3, "%02x", raw[i]);
	n->srv = srv;
	for (size_t i = 0; i < n->ncoords; i++)
		rpc_async_set_session(n->rpc, n->coords[i], n->session);
	node_set_bound(n, bound);
	return REFIT_OK;
}

void
node_set_bound(node_t *n, bool bound)
{
	rpc_server_set_session(n->srv, bound ? n->session : NULL);
}

/* o->coordinator: one address or several, comma-separated; the first is
 * called first. */
static void
coords_split(node_t *n, const char *list)
{
	char *copy = xstrdup(list ? list : ""), *tok, *save = NULL;

	for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		n->coords = xreallocarray(n->coords, n->ncoords + 1, sizeof(*n->coords));
		n->coords[n->ncoords++] = xstrdup(tok);
	}
	free(copy);
	if (n->ncoords == 0) {
		n->coords = xcalloc(1, sizeof(*n->coords));
		n->coords[n->ncoords++] = xstrdup(list ? list : "");
	}
	n->coord_i = 0;
	n->coord_dead = n->ncoords;
	n->coordinator = n->coords[0];
}

node_t *
node_new(uv_loop_t *loop, rpc_server_t *srv, const node_opts_t *o, refit_err_t *err)
{
	xport_cfg_t xc = {o->data_listen ? o->data_listen : "127.0.0.1:0", o->node_id, o->ranks,
			  o->nranks, o->gpu_devices, o->gpu_staging_budget, NULL, NULL, NULL, false,
			  NULL, NULL};
	gpu_paths_t gp = {o->cuda_library, o->nccl_library, o->gpu_kernels_library};
	const char *why;
	node_t *n;

	xc.source_check = o->source_check;
	if (o->data_tls) {
		xc.tls_cert = o->client.tls.cert_file;
		xc.tls_key = o->client.tls.key_file;
		xc.tls_ca = o->client.tls.ca_file;
	}

	if (o->nranks == 0 || o->node_id == NULL || o->advertise == NULL) {
		refit_err_set(err, REFIT_ERR_INVALID_ARG, "node: needs node_id, ranks and an "
			      "address to advertise");
		return NULL;
	}
	n = xcalloc(1, sizeof(*n));
	rpc_refusals_init(&n->data_refusals);
	xc.refused = data_refused;
	xc.refused_ctx = n;
	n->hooks = &hooks;
	n->loop = loop;
	coords_split(n, o->coordinator);
	n->node_id = xstrdup(o->node_id);
	n->advertise = xstrdup(o->advertise);
	n->domain = xstrdup(o->domain ? o->domain : o->node_id);
	n->ranks = xmalloc(o->nranks * sizeof(*n->ranks));
	memcpy(n->ranks, o->ranks, o->nranks * sizeof(*n->ranks));
	n->nranks = o->nranks;
	n->client = o->client;
	n->rpc = o->rpc;
	if (session_start(n, srv, o->client.join_token != NULL, err) != REFIT_OK) {
		node_maybe_free(n);
		return NULL;
	}
	n->slice_timeout_ms = o->slice_timeout_ms;  /* 0: the coordinator says */
	n->connect_timeout_ms = o->connect_timeout_ms ? o->connect_timeout_ms : 5000;
	n->test_msg_delay_ms = o->test_msg_delay_ms;
	n->test_fail_commit = o->test_fail_commit;
	n->test_lose_publish = o->test_lose_publish;
	n->test_hold_run_ms = o->test_hold_run_ms;
	n->poisoned_exit = o->poisoned_exit;
	n->poisoned_exit_arg = o->poisoned_exit_arg;
	n->exit_poisoned = o->exit_poisoned;
	/* the data plane's buffers, kept across refits of an epoch; slices raise
	 * the bound to their staging_bytes per local rank; relay parts under
	 * 64 KiB come from the heap */
	n->pool = dp_pool_new(0, (uint64_t)64 << 10, DP_POOL_HUGE);
	n->delta = o->delta_base_bytes ? delta_store_new(o->delta_base_bytes, DELTA_TAB_WAIT_MS) : NULL;
	n->gdelta = node_gdelta_store(o);
	n->closing = true; /* until started: node_maybe_free frees */
	n->xo = xport_lookup(o->transport ? o->transport : "tcp");
	if (n->xo == NULL) {
		refit_err_set(err, REFIT_ERR_UNAVAILABLE, "node: transport \"%s\" is not built "
			      "in (this build has: %s)", o->transport, xport_names());
		node_maybe_free(n);
		return NULL;
	}
	gpu_configure(&gp);
	if ((why = n->xo->unavailable()) != NULL) {
		refit_err_set(err, REFIT_ERR_UNAVAILABLE, "node: transport \"%s\" cannot run "
			      "here: %s", n->xo->name, why);
		node_maybe_free(n);
		return NULL;
	}
	if (n->xo->start(&xc, &n->x, err) != REFIT_OK) {
		node_maybe_free(n);
		return NULL;
	}
	n->data_ep = xstrdup(o->data_advertise ? o->data_advertise : n->xo->endpoint(n->x));
	if (rpc_server_add_service(srv, &refit__v1__node__descriptor, prep_methods,
				   sizeof(prep_methods) / sizeof(prep_methods[0]), n,
				   err) != REFIT_OK ||
	    rpc_server_add_service(srv, &refit__v1__node__descriptor, node_run_methods,
				   node_run_nmethods, n, err) != REFIT_OK ||
	    node_local_start(n, o, err) != REFIT_OK) {
		node_maybe_free(n);
		return NULL;
	}
	n->closing = false;
	uv_timer_init(loop, &n->beat);
	uv_timer_init(loop, &n->sweep);
	n->beat.data = n->sweep.data = n;
	n->handles += 2; /* the memory socket counts its own */
	uv_timer_start(&n->beat, on_tick, 0, o->heartbeat_ms);
	uv_timer_start(&n->sweep, on_sweep, 50, 50);
	log_info("node %s: data plane %s on %s, librefit socket %s", n->node_id, n->xo->name,
		 n->data_ep, o->local_socket);
	return n;
}

static void
on_timer_closed(uv_handle_t *h)
{
	node_t *n = h->data;

	n->handles--;
	node_maybe_free(n);
}

static void
on_left(void *arg, refit_status_t st, const char *msg, ProtobufCMessage *resp)
{
	node_t *n = arg;

	(void)resp;
	if (st != REFIT_OK)
		log_warnx("node %s: Leave: %s", n->node_id, msg);
	else
		log_info("node %s: left the membership", n->node_id);
	n->inflight--;
	node_maybe_free(n);
}

/* Leave the membership (bounded, best effort). */
static void
leave(node_t *n)
{
	Refit__V1__LeaveRequest rq = REFIT__V1__LEAVE_REQUEST__INIT;

	if (n->member_id == 0)
		return;
	rq.member_id = n->member_id;
	rq.reason = n->drained ? "drained" : "shutdown";
	n->member_id = 0;
	if (rpc_async_call(n->rpc, RPC_GROUP_NONE, n->coordinator,
			   &refit__v1__coordinator__descriptor, "Leave", &rq.base, 2000,
			   on_left, n, NULL) == REFIT_OK)
		n->inflight++;
}

void
node_close(node_t *n)
{
	if (n == NULL)
		return;
	n->closing = true;
	rpc_async_cancel(n->rpc, RPC_GROUP_ALL);  /* before Leave, which goes last */
	leave(n);
	node_run_abort_all(n, "the node daemon is shutting down");
	node_run_held_tick(n, 0);   /* closing: refused */
	node_waiters_fail_all(n, "the node daemon is shutting down");
	node_engine_fail_all(n, "the node daemon is shutting down");
	node_local_close(n);
	uv_timer_stop(&n->beat);
	uv_timer_stop(&n->sweep);
	uv_close((uv_handle_t *)&n->beat, on_timer_closed);
	uv_close((uv_handle_t *)&n->sweep, on_timer_closed);
}

void
node_set_heartbeat(node_t *n, uint32_t heartbeat_ms)
{
	uv_timer_set_repeat(&n->beat, heartbeat_ms);
}
