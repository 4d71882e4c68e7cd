/*
 * coord.c - the coordinator: membership (leases, epochs), ListMembers and
 * DrainMember, and the setup that registers every Coordinator method (the
 * layout registry and model views are in coord_register.c, the refit
 * methods in coord_refit_api.c).
 *
 * Epoch: bumped on every join, leave and lease expiry.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "codec/json.h"
#include "common/alloc.h"
#include "common/log.h"
#include "plan/convert.h"
#include "daemon/coord/coord.h"
#include "rpc/proto_conv.h"
#include "rpc/rpc_auth.h"

#include "daemon/coord/coord_backend.h"
#include "daemon/coord/coord_internal.h"
#include "rpc/etcd.h"
#include "daemon/coord/coord_rules.h"
#include "daemon/metrics.h"

/* ---- helpers ------------------------------------------------------------- */

static const char *
nz(const char *s)
{
	return s ? s : "";
}

/* leases, retries and catch-ups are checked this often */
#define TICK_MS(ttl) ((ttl) / 4 + 1 < 100 ? (ttl) / 4 + 1 : 100)

static void
remove_member(coord_t *c, size_t i, const char *why)
{
	char what[256];

	snprintf(what, sizeof(what), "%s: member %" PRIu64 " (%s)", why, c->members.v[i].id,
		 c->members.v[i].node_id);
	if (c->members.v[i].poisoned != NULL)
		coord_refits_on_poisoned_leave(c, &c->members.v[i]);
	rpc_async_forget(c->rpc, c->members.v[i].rpc_ep);
	if (c->members.v[i].session)
		rpc_async_set_session(c->rpc, c->members.v[i].rpc_ep, NULL);
	coord_member_fini(&c->members.v[i]);
	c->members.v[i] = c->members.v[--c->members.n];
	coord_bump_epoch(c, what);
}

/*
 * Instance leases: an instance whose nodes all left (no member that
 * registered it is left) is dropped after instance_grace_ms, unless a node
 * comes back and its clients register again first.  A stale replica cannot
 * block the others.
 */
static void
instances_tick(coord_t *c, uint64_t now)
{
	uint64_t grace = c->o.instance_grace_ms ? c->o.instance_grace_ms : 60000;
	bool changed = false;

	for (size_t i = 0; i < c->models.n; i++) {
		model_t *m = &c->models.v[i];

		for (size_t k = 0; k < m->inst.n;) {
			instance_t *in = &m->inst.v[k];

			if (coord_instance_prune(c, in)) {
				in->orphan_since_ms = 0;
			} else if (in->orphan_since_ms == 0) {
				in->orphan_since_ms = now ? now : 1;
			} else if (now - in->orphan_since_ms > grace) {
				log_warnx("coordinator: model \"%s\": %s \"%s\" dropped: its node "
					  "(member %" PRIu64 ") has been gone for %" PRIu64 " ms",
					  m->name, in->role == REFIT__V1__ROLE__TRAIN ? "trainer" :
					  "instance", in->name, in->member_id,
					  now - in->orphan_since_ms);
				coord_instance_fini(in);
				*in = m->inst.v[--m->inst.n];
				changed = true;
				continue;
			}
			k++;
		}
	}
	if (changed)
		coord_save(c);
}

/*
 * The coordinator's own stalls.  The lease tick is due TICK_MS after the
 * last one (libuv's monotonic loop time); when it runs later than that by
 * more than the tolerance (lease_ttl_ms / 10, within [TICK_MS, 1000 ms]),
 * the coordinator was not running: stopped (SIGSTOP, a VM pause), swapped
 * out, starved of CPU, or its loop blocked.  It could not process the
 * heartbeats that came meanwhile (they wait in gRPC's queue and may reach
 * the loop only after this tick), so that time is not counted against the
 * members: every member's last beat moves forward by it (never past now),
 * before the sweep.  A member then expires after lease_ttl_ms in which the
 * coordinator ran; a dead node still does.
 * Returns the stall in ms (0: none).
 */
static uint64_t
lease_stall_ms(coord_t *c, uint64_t now)
{
	uint64_t tick = TICK_MS(c->o.lease_ttl_ms), tol = c->o.lease_ttl_ms / 10;
	uint64_t late = now - c->lease_tick_ms > tick ? now - c->lease_tick_ms - tick : 0;

	c->lease_tick_ms = now;
	tol = tol < tick ? tick : tol > 1000 ? 1000 : tol;
	if (late <= tol)
		return 0;
	metrics_add(M_COORD_STALLS_TOTAL, NULL, 1);
	metrics_add(M_COORD_STALLED_SECONDS_TOTAL, NULL, (double)late / 1000);
	log_warnx("coordinator: stalled for %" PRIu64 " ms (its %" PRIu64 " ms lease tick ran "
		  "that late: stopped, paused, swapped out or starved of CPU); that time is "
		  "not counted against the leases of its %zu members", late, tick,
		  c->members.n);
	return late;
}

static void
on_lease_timer(uv_timer_t *t)
{
	coord_t *c = t->data;
	uint64_t now = uv_now(c->loop);
	uint64_t stall = lease_stall_ms(c, now);

	for (size_t i = 0; i < c->members.n;) {
		member_t *m = &c->members.v[i];

		if (stall != 0)
			m->last_beat_ms = m->last_beat_ms + stall < now ?
					  m->last_beat_ms + stall : now;
		if (now - m->last_beat_ms > c->o.lease_ttl_ms) {
			metrics_add(M_LEASE_EXPIRIES_TOTAL, NULL, 1);
			remove_member(c, i, "lease expired");
		} else {
			i++;
		}
	}
	instances_tick(c, now);
	coord_refits_tick(c);
	coord_publish_tick(c);
}

/* (Re)start the lease tick; stalls are measured from now. */
static void
lease_timer_start(coord_t *c)
{
	uint64_t tick = TICK_MS(c->o.lease_ttl_ms);

	uv_update_time(c->loop);
	c->lease_tick_ms = uv_now(c->loop);
	uv_timer_start(&c->lease_timer, on_lease_timer, tick, tick);
}

/* ---- membership ----------------------------------------------------------- */

/* With a join token: may the caller join as rq->node_id with its session?
 * A live member's name is taken only by that member's own session. */
static bool
join_session_ok(coord_t *c, rpc_call_t *call, const Refit__V1__JoinRequest *rq)
{
	size_t len;
	const char *s = rpc_call_session(call, &len);

	if (!coord_binds(c))
		return true;
	if (s == NULL || len < 16) {
		rpc_call_refuse(call, REFIT_ERR_UNAUTHENTICATED, "session", "Join \"%s\": no "
				"session secret (metadata \"%s\", 16 characters or more): the "
				"member's later calls are bound to it", nz(rq->node_id),
				RPC_MD_SESSION);
		return false;
	}
	for (size_t k = 0; k < c->members.n; k++) {
		const member_t *m = &c->members.v[k];

		if (m->session == NULL || rpc_auth_eq(s, len, m->session))
			continue;
		if (strcmp(m->node_id, nz(rq->node_id)) != 0) {
			/* its endpoints would be called, and sent secrets, as it */
			const char *ep = NULL;

			if (m->rpc_ep[0] && strcmp(m->rpc_ep, nz(rq->rpc_endpoint)) == 0)
				ep = m->rpc_ep;
			else if (m->data_ep[0] && strcmp(m->data_ep, nz(rq->data_endpoint)) == 0)
				ep = m->data_ep;
			if (ep == NULL)
				continue;
			rpc_call_refuse(call, REFIT_ERR_PERMISSION_DENIED, "identity", "Join \"%s\": "
					"endpoint %s is live member %" PRIu64 "'s (node \"%s\") of "
					"another session", nz(rq->node_id), ep, m->id, m->node_id);
			return false;
		}
		rpc_call_refuse(call, REFIT_ERR_PERMISSION_DENIED, "identity", "Join \"%s\": "
				"node \"%s\" is live member %" PRIu64 " of another session: "
				"only that session joins again under its name (a restarted node "
				"can once the member left or its lease lapsed)", m->node_id,
				m->node_id, m->id);
		return false;
	}
	return true;
}

/* May rq's node join now (coord_rules_join)? */
static refit_status_t
join_check(coord_t *c, const Refit__V1__JoinRequest *rq, refit_err_t *err)
{
	int32_t *ranks = xcalloc(rq->n_ranks + 1, sizeof(*ranks));
	refit_status_t rc;

	for (size_t i = 0; i < rq->n_ranks; i++)
		ranks[i] = rq->ranks[i]->rank;
	refit_err_clear(err);
	rc = coord_rules_join(c->members.v, c->members.n, rq->node_id, ranks, rq->n_ranks, err);
	free(ranks);
	return rc;
}

static void
h_join(void *ctx, rpc_call_t *call, const ProtobufCMessage *msg)
{
	coord_t *c = ctx;
	const Refit__V1__JoinRequest *rq = (const void *)msg;
	Refit__V1__JoinResponse rsp = REFIT__V1__JOIN_RESPONSE__INIT;
	refit_err_t err;
	size_t slen;
	const char *sess = rpc_call_session(call, &slen);
	member_t m;

	if (!coord_cert_is(c, call, "Join", nz(rq->node_id)) || !join_session_ok(c, call, rq))
		return;
	if (join_check(c, rq, &err) != REFIT_OK) {
		if (err.status == REFIT_ERR_EXISTS && coord_binds(c)) /* another's ranks */
			return rpc_call_refuse(call, REFIT_ERR_PERMISSION_DENIED, "identity",
					       "%s", err.msg);
		return rpc_call_fail(call, err.status, "%s", err.msg);
	}
	for (size_t k = 0; k < c->members.n; k++)
		if (strcmp(c->members.v[k].node_id, rq->node_id) == 0) {
			remove_member(c, k, "rejoin");
			break;
		}
	memset(&m, 0, sizeof(m));
	m.id = ++c->next_member;
	m.node_id = xstrdup(rq->node_id);
	m.host = xstrdup(nz(rq->host));
	m.rpc_ep = xstrdup(nz(rq->rpc_endpoint));
	m.data_ep = xstrdup(nz(rq->data_endpoint));
	m.transport = xstrdup(rq->transport && rq->transport[0] ? rq->transport : "tcp");
	m.nranks = rq->n_ranks;
	m.ranks = xcalloc(m.nranks, sizeof(*m.ranks));
	for (size_t i = 0; i < m.nranks; i++) {
		const char *d = rq->ranks[i]->domain;

		m.ranks[i].rank = rq->ranks[i]->rank;
		m.ranks[i].domain = xstrdup(d && d[0] ? d : rq->node_id);
	}
	m.last_beat_ms = uv_now(c->loop);
	if (sess != NULL && slen > 0) {
		m.session = xstrdup(sess);
		rpc_async_set_session(c->rpc, m.rpc_ep, m.session); /* its Node calls */
	}
	if (c->srv && rpc_server_mtls(c->srv)) { /* its Node service is the node it named */
		char name[512];

		snprintf(name, sizeof(name), "%s%s", m.node_id, RPC_TLS_NODE_SUFFIX);
		rpc_async_set_server_name(c->rpc, m.rpc_ep, name);
	}
	coord_member_poisoned(c, &m, rq->poisoned);
	if (rq->prepared_epoch >= c->epoch) {
		/* this coordinator lost its state (or never had a state file):
		 * epochs continue above what the node prepared, never go back */
		uint64_t was = c->epoch;

		c->epoch = rq->prepared_epoch;
		log_info("coordinator: node %s prepared epoch %" PRIu64 " before this "
			 "coordinator's epoch %" PRIu64 ": epochs continue above it",
			 rq->node_id, rq->prepared_epoch, was);
		coord_refits_on_epoch(c, was, "a node prepared a newer epoch");
	}
	coord_bump_epoch(c, "join");
	m.joined_epoch = c->epoch;
	VEC_PUSH(&c->members, m);
	rsp.member_id = m.id;
	rsp.lease_ttl_ms = c->o.lease_ttl_ms;
	rsp.heartbeat_ms = c->o.heartbeat_ms;
	rsp.epoch = c->epoch;
	rpc_call_reply(call, &rsp.base);
}

static void
h_heartbeat(void *ctx, rpc_call_t *call, const ProtobufCMessage *msg)
{
	coord_t *c = ctx;
	const Refit__V1__HeartbeatRequest *rq = (const void *)msg;
	Refit__V1__HeartbeatResponse rsp = REFIT__V1__HEARTBEAT_RESPONSE__INIT;
	member_t *m = coord_find_member(c, rq->member_id);

	if (m == NULL)
		return rpc_call_fail(call, REFIT_ERR_NOT_FOUND, "Heartbeat: member %" PRIu64
				     " is not a member (lease expired or never joined): "
				     "join again", rq->member_id);
	if (!coord_member_acts(c, call, "Heartbeat", m))
		return;
	m->last_beat_ms = uv_now(c->loop);
	coord_member_poisoned(c, m, rq->poisoned);
	coord_engines_note(c, m, rq);
	rsp.epoch = c->epoch;
	rsp.epoch_changed = rq->epoch != c->epoch;
	rsp.lease_ttl_ms = c->o.lease_ttl_ms;
	rsp.drain = m->draining;
	rpc_call_reply(call, &rsp.base);
}

/*
 * An operator drains a node: refits in flight that use it are aborted now;
 * the node is told at its next heartbeat to leave and stay out, and leaves
 * (its lease lapses if it does not).
 */
static void
h_drain(void *ctx, rpc_call_t *call, const ProtobufCMessage *msg)
{
	coord_t *c = ctx;
	const Refit__V1__DrainMemberRequest *rq = (const void *)msg;
	Refit__V1__DrainMemberResponse rsp = REFIT__V1__DRAIN_MEMBER_RESPONSE__INIT;
	uint64_t ids[64];
	char why[256];

	for (size_t i = 0; i < c->members.n; i++) {
		member_t *m = &c->members.v[i];

		if (strcmp(m->node_id, nz(rq->node_id)) != 0)
			continue;
		snprintf(why, sizeof(why), "node %s drained: %s", m->node_id,
			 rq->reason && rq->reason[0] ? rq->reason : "by request");
		m->draining = true;
		rsp.member_id = m->id;
		rsp.aborted_refits = ids;
		rsp.n_aborted_refits = coord_refits_abort_member(c, m->id, why, ids, 64);
		log_info("coordinator: %s (%zu refits aborted)", why, rsp.n_aborted_refits);
		return rpc_call_reply(call, &rsp.base);
	}
	rpc_call_fail(call, REFIT_ERR_NOT_FOUND, "DrainMember: no member node \"%s\"",
		      nz(rq->node_id));
}

static void
h_leave(void *ctx, rpc_call_t *call, const ProtobufCMessage *msg)
{
	coord_t *c = ctx;
	const Refit__V1__LeaveRequest *rq = (const void *)msg;
	Refit__V1__LeaveResponse rsp = REFIT__V1__LEAVE_RESPONSE__INIT;

	for (size_t i = 0; i < c->members.n; i++) {
		if (c->members.v[i].id == rq->member_id) {
			if (!coord_member_acts(c, call, "Leave", &c->members.v[i]))
				return;
			remove_member(c, i, "leave");
			rsp.epoch = c->epoch;
			return rpc_call_reply(call, &rsp.base);
		}
	}
	rpc_call_fail(call, REFIT_ERR_NOT_FOUND, "Leave: member %" PRIu64 " is not a member",
		      rq->member_id);
}

/* ---- operator views -------------------------------------------------------- */

static void
h_list_members(void *ctx, rpc_call_t *call, const ProtobufCMessage *msg)
{
	coord_t *c = ctx;
	Refit__V1__ListMembersResponse rsp = REFIT__V1__LIST_MEMBERS_RESPONSE__INIT;
	size_t n = c->members.n, nr = 0;
	Refit__V1__Member *mv = xcalloc(n ? n : 1, sizeof(*mv));
	Refit__V1__Member **mp = xcalloc(n ? n : 1, sizeof(*mp));
	Refit__V1__RankInfo *rv, **rp;
	uint64_t now = uv_now(c->loop);

	(void)msg;
	for (size_t i = 0; i < n; i++)
		nr += c->members.v[i].nranks;
	rv = xcalloc(nr ? nr : 1, sizeof(*rv));
	rp = xcalloc(nr ? nr : 1, sizeof(*rp));
	nr = 0;
	for (size_t i = 0; i < n; i++) {
		const member_t *m = &c->members.v[i];

		refit__v1__member__init(&mv[i]);
		mv[i].member_id = m->id;
		mv[i].node_id = m->node_id;
		mv[i].host = m->host;
		mv[i].rpc_endpoint = m->rpc_ep;
		mv[i].data_endpoint = m->data_ep;
		mv[i].transport = m->transport;
		mv[i].connection = (char *)rpc_conn_name(rpc_async_conn(c->rpc, m->rpc_ep));
		mv[i].joined_epoch = m->joined_epoch;
		mv[i].lease_age_ms = now - m->last_beat_ms;
		mv[i].lease_ttl_ms = c->o.lease_ttl_ms;
		mv[i].poisoned = m->poisoned ? m->poisoned : "";
		mv[i].ranks = rp + nr;
		mv[i].n_ranks = m->nranks;
		for (size_t k = 0; k < m->nranks; k++, nr++) {
			refit__v1__rank_info__init(&rv[nr]);
			rv[nr].rank = m->ranks[k].rank;
			rv[nr].domain = m->ranks[k].domain;
			rp[nr] = &rv[nr];
		}
		mp[i] = &mv[i];
	}
	rsp.epoch = c->epoch;
	rsp.members = mp;
	rsp.n_members = n;
	rsp.node_calls_cancelled = rpc_async_cancelled(c->rpc);
	rsp.node_calls_outstanding = rpc_async_outstanding(c->rpc);
	rpc_call_reply(call, &rsp.base);
	free(mv);
	free(mp);
	free(rv);
	free(rp);
}

/* ---- setup ------------------------------------------------------------------ */

static const rpc_method_cfg_t methods[] = {
	{"Join", h_join},
	{"Heartbeat", h_heartbeat},
	{"Leave", h_leave},
	{"ListMembers", h_list_members},
	{"DrainMember", h_drain},
};

/*
 * Member ids are never reused, not even by a coordinator restarted without
 * its state file: a node still heartbeating with an id of the last
 * incarnation must not be taken for the node that got that id now (it would
 * stay "alive" under another node's name and never join again).  So ids go
 * on from the wall clock in microseconds when that is ahead (below 2^53: the
 * state file keeps them as JSON numbers).
 */
static void
coord_member_ids_from_clock(coord_t *c)
{
	struct timespec ts;
	uint64_t us;

	clock_gettime(CLOCK_REALTIME, &ts);
	us = (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
	if (c->next_member < us)
		c->next_member = us;
}

/*
 * The connectivity watch saw a channel change (rpc_async.c).  A member's
 * channel that starts failing (TRANSIENT_FAILURE) or comes back is logged
 * once per outage with the node's name; refitctl members shows the state.
 * It does not by itself fail a refit: under load a live node's channel can
 * fail for a moment, and SliceDone, deadlines and leases decide.
 */
static void
on_conn(void *arg, const char *target, rpc_conn_t old, rpc_conn_t now, int outage)
{
	coord_t *c = arg;
	const char *node = "(not a member)";

	(void)old;
	if (outage == 0 || c->closing)
		return;
	for (size_t i = 0; i < c->members.n; i++)
		if (strcmp(c->members.v[i].rpc_ep, target) == 0)
			node = c->members.v[i].node_id;
	if (outage > 0)
		log_warnx("coordinator: node %s: channel to %s %s (connection lost or refused; "
			  "reconnecting with back-off; its refits go on until SliceDone, a "
			  "deadline or its lease decides)", node, target, rpc_conn_name(now));
	else
		log_info("coordinator: node %s: channel to %s READY again", node, target);
}

/*
 * Every Coordinator method is registered through a gate (one per method,
 * c->gates): a standby answers UNAVAILABLE "not the leader: ADDR", which
 * nodes and refitctl follow at once (docs/ha.md); the leader (and a
 * coordinator with a state file, always) runs the handler.
 */
typedef struct coord_gate {
	coord_t *c;
	rpc_handler_fn fn;
	const char *method;
} coord_gate_t;

static void
gated(void *ctx, rpc_call_t *call, const ProtobufCMessage *req)
{
	const coord_gate_t *g = ctx;
	char who[256];

	if (g->c->leading)
		return g->fn(g->c, call, req);
	coord_leader_addr(g->c->leader, who, sizeof(who));
	rpc_call_fail(call, REFIT_ERR_UNAVAILABLE, "%s: not the leader: %s", g->method, who);
}

/* Register methods[0..n) of the Coordinator service, each behind its gate. */
static refit_status_t
add_gated(coord_t *c, const rpc_method_cfg_t *methods, size_t n, refit_err_t *err)
{
	coord_gate_t *g = xcalloc(n, sizeof(*g));
	refit_status_t rc = REFIT_OK;

	c->gates = xreallocarray(c->gates, c->ngates + 1, sizeof(*c->gates));
	c->gates[c->ngates++] = g;
	for (size_t i = 0; i < n && rc == REFIT_OK; i++) {
		rpc_method_cfg_t one = {methods[i].name, gated};

		g[i] = (coord_gate_t){c, methods[i].fn, methods[i].name};
		rc = rpc_server_add_service(c->srv, &refit__v1__coordinator__descriptor, &one, 1,
					    &g[i], err);
	}
	return rc;
}

/* The state store of o: the file (or none), read now; or etcd, read once
 * this coordinator is elected. */
static refit_status_t
store_open(coord_t *c, const coord_opts_t *o, refit_err_t *err)
{
	etcd_t *e;
	size_t n = o->etcd_prefix ? strlen(o->etcd_prefix) : 0;

	if (o->state_store == NULL || strcmp(o->state_store, "file") == 0) {
		if (o->state_file) {
			c->store = &coord_backend_file;
			c->store_impl = coord_backend_file_new(o->state_file);
		}
		c->leading = true;
		return coord_state_load(c, err);
	}
	if (strcmp(o->state_store, "etcd") != 0)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "coordinator: state_store "
				     "\"%s\" is neither file nor etcd", o->state_store);
	if (n == 0 || o->etcd_prefix[0] != '/' || o->etcd_prefix[n - 1] == '/')
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "coordinator: etcd_prefix "
				     "\"%s\" must start with / and not end with one",
				     o->etcd_prefix ? o->etcd_prefix : "");
	if ((e = etcd_new(o->etcd_endpoints, 2000, &o->etcd_tls, err)) == NULL)
		return err->status;
	c->store = &coord_backend_etcd;
	c->store_impl = coord_backend_etcd_new(e, o->etcd_prefix, o->etcd_chunk_bytes);
	c->leader = coord_leader_start(c, o, c->store_impl, err);
	if (c->leader == NULL)
		return err->status;
	log_info("coordinator: state in etcd (%s, prefix %s): a standby until elected",
		 o->etcd_endpoints, o->etcd_prefix);
	return REFIT_OK;
}

coord_t *
coord_new(uv_loop_t *loop, rpc_server_t *srv, const coord_opts_t *o, refit_err_t *err)
{
	coord_t *c = xcalloc(1, sizeof(*c));

	c->loop = loop;
	c->o = *o;
	c->rpc = o->rpc;
	c->srv = srv;
	if (store_open(c, o, err) != REFIT_OK) {
		if (c->leader != NULL) {  /* closed on the loop, then c is freed */
			c->closing = c->timer_closed = true;
			coord_leader_stop(c->leader);
		} else {
			coord_free(c);
		}
		return NULL;
	}
	coord_leader_changed(c);
	coord_member_ids_from_clock(c);
	if (add_gated(c, methods, sizeof(methods) / sizeof(methods[0]), err) != REFIT_OK ||
	    add_gated(c, coord_refit_methods, coord_refit_nmethods, err) != REFIT_OK ||
	    add_gated(c, coord_register_methods, coord_register_nmethods, err) != REFIT_OK) {
		coord_free(c);
		return NULL;
	}
	uv_timer_init(loop, &c->lease_timer);
	c->lease_timer.data = c;
	lease_timer_start(c);
	rpc_async_on_conn(c->rpc, on_conn, c);
	return c;
}

static void
on_timer_closed(uv_handle_t *h)
{
	coord_t *c = h->data;

	c->timer_closed = true;
	coord_maybe_free(c);
}

void
coord_close(coord_t *c, void (*done)(void *arg), void *arg)
{
	if (c == NULL) {
		if (done)
			done(arg);
		return;
	}
	c->closing = true;
	rpc_async_on_conn(c->rpc, NULL, NULL);
	rpc_async_cancel(c->rpc, RPC_GROUP_ALL); /* nodes' answers are not awaited */
	c->closed_cb = done;
	c->closed_arg = arg;
	if (c->leader != NULL)
		coord_leader_stop(c->leader);
	uv_timer_stop(&c->lease_timer);
	uv_close((uv_handle_t *)&c->lease_timer, on_timer_closed);
}

void
coord_set_timing(coord_t *c, uint32_t lease_ttl_ms, uint32_t heartbeat_ms)
{
	c->o.lease_ttl_ms = lease_ttl_ms;
	c->o.heartbeat_ms = heartbeat_ms;
	uv_timer_stop(&c->lease_timer);
	lease_timer_start(c);
}
