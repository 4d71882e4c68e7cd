/*
 * node_report.c - a node's slice reports: the end of each slice (its
 * figures and, when it failed, what it saw of its peers: PeerIssues) sent
 * to the coordinator as SliceDone, resent with back-off until the
 * coordinator acknowledges it (or says the refit is gone, the epoch moves
 * on, or REPORT_GIVE_UP_MS pass); and node_poisoned, which every report
 * carries.  Loop thread only.  node_run.c queues a report when a slice
 * ends; node.c's sweep timer resends the due ones; this file calls nothing
 * in either.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "daemon/node/node_internal.h"
#include "rpc/proto_conv.h"

#define REPORT_CALL_MS 5000
#define NODE_PEER_ISSUES_MAX 64       /* PeerIssues in one SliceDone */
#define REPORT_GIVE_UP_MS 600000

static const char *
nz(const char *s)
{
	return s ? s : "";
}

/* ---- SliceDone ------------------------------------------------------------------ */

static void
report_drop(node_t *n, slice_report_t *r)
{
	for (size_t i = 0; i < n->reports.n; i++)
		if (n->reports.v[i] == r) {
			n->reports.v[i] = n->reports.v[--n->reports.n];
			break;
		}
	free(r->req);
	free(r);
}

static void
on_report_done(void *arg, refit_status_t st, const char *msg, ProtobufCMessage *resp)
{
	slice_report_t *r = arg;
	node_t *n = r->n;
	uint64_t wait;

	n->inflight--;
	r->sending = false;
	if (st == REFIT_OK) {
		if (!((const Refit__V1__SliceDoneResponse *)resp)->counted)
			log_debug(LOG_SUB_NODE, "node %s: refit %" PRIu64 ": SliceDone not counted (a "
				  "duplicate, or the refit moved on)", n->node_id, r->refit_id);
		report_drop(n, r);
	} else if (n->closing || st == REFIT_ERR_NOT_FOUND || st == REFIT_ERR_INVALID_ARG) {
		if (!n->closing)
			log_warnx("node %s: refit %" PRIu64 ": SliceDone: %s (not sent again)",
				  n->node_id, r->refit_id, msg);
		report_drop(n, r);
	} else {
		/* the coordinator is unreachable or restarting: again, with back-off */
		wait = 100u << (r->tries < 5 ? r->tries : 5);
		r->tries++;
		r->next_ms = xport_now_ms() + (wait < 2000 ? wait : 2000);
		log_warnx("node %s: refit %" PRIu64 ": SliceDone: %s (try %u; again in %" PRIu64
			  " ms)", n->node_id, r->refit_id, msg, r->tries, wait < 2000 ? wait : 2000);
	}
	node_maybe_free(n);
}

static void
report_send(node_t *n, slice_report_t *r)
{
	ProtobufCMessage *rq = protobuf_c_message_unpack(&refit__v1__slice_done_request__descriptor,
							 NULL, r->len, r->req);
	refit_err_t err;

	refit_err_clear(&err);
	if (rq == NULL) {
		log_warnx("node %s: refit %" PRIu64 ": cannot read a SliceDone back", n->node_id,
			  r->refit_id);
		report_drop(n, r);
		return;
	}
	if (rpc_async_call(n->rpc, RPC_GROUP_NONE, n->coordinator,
			   &refit__v1__coordinator__descriptor, "SliceDone", rq, REPORT_CALL_MS,
			   on_report_done, r, &err) == REFIT_OK) {
		r->sending = true;
		n->inflight++;
	} else {
		r->tries++;
		r->next_ms = xport_now_ms() + 1000;
		log_warnx("node %s: refit %" PRIu64 ": SliceDone: %s", n->node_id, r->refit_id,
			  err.msg);
	}
	protobuf_c_message_free_unpacked(rq, NULL);
}

void
node_reports_tick(node_t *n)
{
	uint64_t now = xport_now_ms();

	for (size_t i = 0; i < n->reports.n;) {
		slice_report_t *r = n->reports.v[i];

		if (r->sending || now < r->next_ms) {
			i++;
		} else if (now > r->give_up_ms || n->epoch > r->epoch) {
			log_warnx("node %s: refit %" PRIu64 ": SliceDone not acknowledged; %s",
				  n->node_id, r->refit_id, n->epoch > r->epoch ?
				  "the epoch moved on, the refit is gone" : "giving up");
			report_drop(n, r);
		} else {
			report_send(n, r);
			i++;
		}
	}
}

void
node_reports_drop(node_t *n)
{
	for (size_t i = 0; i < n->reports.n;) {
		if (n->reports.v[i]->sending)
			i++;
		else
			report_drop(n, n->reports.v[i]);
	}
}

const char *
node_poisoned(node_t *n)
{
	char why[REFIT_ERR_MSG_MAX];
	xport_poison_t p;

	/* asked again until the worst is known: a poisoned node's device may
	 * still fault (a sticky error) */
	if (n->poison_dead || n->x == NULL)
		return n->poisoned;
	p = n->xo->poisoned(n->x, why, sizeof(why));
	if (p == XPORT_POISON_NONE || (n->poisoned != NULL && p == XPORT_POISON_KEPT))
		return n->poisoned;
	free(n->poisoned);
	n->poisoned = xstrdup(why);
	n->poison_dead = p == XPORT_POISON_DEAD;
	log_errorx("node %s: poisoned: %s: %s", n->node_id, n->poisoned, n->poison_dead ?
		   "refitd exits for systemd to restart it" : "restart refitd on this node");
	return n->poisoned;
}

/* One PeerIssue of j's failed slice about node i, if there is room. */
static void
issue_add(slice_job_t *j, size_t i, Refit__V1__PeerIssueKind kind, const char *detail,
	  uint64_t msgs, Refit__V1__PeerIssue *iv, Refit__V1__PeerIssue **ip, size_t *n)
{
	if (*n >= NODE_PEER_ISSUES_MAX)
		return;
	refit__v1__peer_issue__init(&iv[*n]);
	iv[*n].node_id = (char *)j->nodes[i].node_id;
	iv[*n].endpoint = (char *)nz(j->nodes[i].endpoint);
	iv[*n].kind = kind;
	iv[*n].detail = (char *)nz(detail);
	iv[*n].messages = msgs;
	ip[*n] = &iv[*n];
	(*n)++;
}

/*
 * What j's failed slice saw of its peers (docs/faults.md, "Failure
 * attribution"): link faults first, then the messages owed each way.
 */
static size_t
peer_issues(slice_job_t *j, Refit__V1__PeerIssue *iv, Refit__V1__PeerIssue **ip)
{
	static const Refit__V1__PeerIssueKind kind[] = {
		[XPORT_LINK_CONNECT] = REFIT__V1__PEER_ISSUE_KIND__PEER_CONNECT,
		[XPORT_LINK_HANDSHAKE] = REFIT__V1__PEER_ISSUE_KIND__PEER_HANDSHAKE,
		[XPORT_LINK_BROKEN] = REFIT__V1__PEER_ISSUE_KIND__PEER_BROKEN,
		[XPORT_LINK_NO_DIAL] = REFIT__V1__PEER_ISSUE_KIND__PEER_NEVER_CONNECTED,
		[XPORT_LINK_BROKEN_IN] = REFIT__V1__PEER_ISSUE_KIND__PEER_BROKEN_IN,
	};
	size_t n = 0;

	for (size_t i = 0; j->peers && i < j->nnodes; i++) {
		const xport_link_t *l = &j->peers[i].link;

		if (i != j->self && l->fault > XPORT_LINK_OK && l->fault <= XPORT_LINK_BROKEN_IN)
			issue_add(j, i, kind[l->fault], l->what, 0, iv, ip, &n);
	}
	for (size_t i = 0; j->peers && i < j->nnodes; i++) {
		if (i == j->self)
			continue;
		if (j->peers[i].owes_us)
			issue_add(j, i, REFIT__V1__PEER_ISSUE_KIND__PEER_OWES, NULL,
				  j->peers[i].owes_us, iv, ip, &n);
		if (j->peers[i].we_owe)
			issue_add(j, i, REFIT__V1__PEER_ISSUE_KIND__PEER_OWED, NULL,
				  j->peers[i].we_owe, iv, ip, &n);
	}
	return n;
}

/* The slice of j ended: tell the coordinator (SliceDone). */
void
node_report_queue(node_t *n, slice_job_t *j, bool ok)
{
	Refit__V1__SliceDoneRequest rq = REFIT__V1__SLICE_DONE_REQUEST__INIT;
	Refit__V1__RunSliceResponse rs = REFIT__V1__RUN_SLICE_RESPONSE__INIT;
	Refit__V1__StageTiming tv[SLICE_MAX_STAGES], *tp[SLICE_MAX_STAGES];
	Refit__V1__PeerIssue iv[NODE_PEER_ISSUES_MAX], *ip[NODE_PEER_ISSUES_MAX];
	slice_report_t *r = xcalloc(1, sizeof(*r));

	for (uint32_t k = 0; k < j->st.nstages && k < SLICE_MAX_STAGES; k++) {
		refit__v1__stage_timing__init(&tv[k]);
		tv[k].stage = k;
		tv[k].micros = j->st.stage_us[k];
		tv[k].bytes = j->st.stage_bytes[k];
		tp[k] = &tv[k];
	}
	rs.refit_id = j->refit_id;
	rs.stages = tp;
	rs.n_stages = j->st.nstages < SLICE_MAX_STAGES ? j->st.nstages : SLICE_MAX_STAGES;
	rs.bytes = j->st.bytes_out;
	rs.local_bytes = j->st.bytes_local;
	rs.micros = j->st.total_us;
	rs.comm_micros = j->st.comm_us;
	rs.delta_units = j->st.delta_units;
	rs.delta_wire_bytes = j->st.delta_wire;
	rs.delta_dense_bytes = j->st.delta_dense;
	rs.dense_units = j->st.dense_units;
	rs.dense_wire_bytes = j->st.dense_wire;
	rs.bases_kept = j->st.bases_kept;
	if (rs.bases_kept)
		rs.delta_lacks = node_delta_lacks(j, n->node_id, &rs.n_delta_lacks);
	rs.delta_evicted = node_delta_evicted(n, &rs.n_delta_evicted);
	if (!ok) {
		rs.peer_issues = ip;
		rs.n_peer_issues = peer_issues(j, iv, ip);
	}
	rq.refit_id = j->refit_id;
	rq.epoch = j->epoch;
	rq.attempt = j->attempt;
	rq.node_id = n->node_id;
	rq.member_id = n->member_id;
	rq.code = ok ? 0 : rpc_status_to_grpc(j->err.status ? j->err.status :
					      REFIT_ERR_INTERNAL);
	rq.message = ok ? "" : j->err.msg[0] ? j->err.msg : "the slice did not run";
	rq.stats = &rs;
	rq.plan_micros = 0;   /* nodes do not plan: they decode their slice */
	rq.plan_cached = false;
	rq.slice_micros = j->slice_us;
	rq.slice_xfers = j->plan.nxfers;
	rq.poisoned = (char *)nz(node_poisoned(n));
	r->n = n;
	r->refit_id = j->refit_id;
	r->epoch = j->epoch;
	r->len = protobuf_c_message_get_packed_size(&rq.base);
	r->req = xmalloc(r->len ? r->len : 1);
	protobuf_c_message_pack(&rq.base, r->req);
	node_delta_lacks_free(rs.delta_lacks, rs.n_delta_lacks);
	node_delta_evicted_free(rs.delta_evicted, rs.n_delta_evicted);
	r->give_up_ms = xport_now_ms() + REPORT_GIVE_UP_MS;
	VEC_PUSH(&n->reports, r);
	report_send(n, r);
}
