/*
 * coord_publish.c - a decided Publish is durable and resent until every
 * node of the refit acknowledged it (docs/ha.md).
 *
 * When every node committed, the coordinator records the decision (refit,
 * epoch, model, version, the instances it installs on, the nodes still to
 * acknowledge) in its state before any Publish leaves.  A node that does
 * not acknowledge (it died, or is cut off) is sent Publish again on the
 * lease tick while it is a member -- by this coordinator, or by the next
 * leader or a restarted one, which loads the record.  A node answers a
 * Publish of a refit it already installed OK (installed once); one that
 * no longer holds the committed slice (it restarted, or a newer refit
 * replaced it) says so, and its instances are left to a catch-up refit.
 * Once every node acknowledged, the instances show the version (never
 * going back) and the record goes.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "daemon/coord/coord_internal.h"

#define PUB_CALL_MS 5000     /* a resent Publish's deadline */
#define PUB_RESEND_MS 500    /* after a failed one, the next */
#define PUB_FIRST_MS 31000   /* the refit's own Publish is out (its deadline) */

typedef struct {
	coord_t *c;
	uint64_t refit_id;
	char *node_id;
} pctx_t;

static pub_pending_t *
find_pub(coord_t *c, uint64_t refit_id, size_t *at)
{
	for (size_t i = 0; i < c->pubs.n; i++)
		if (c->pubs.v[i]->refit_id == refit_id) {
			if (at)
				*at = i;
			return c->pubs.v[i];
		}
	return NULL;
}

static pub_node_t *
find_node(pub_pending_t *p, const char *node_id)
{
	for (size_t i = 0; i < p->nodes.n; i++)
		if (strcmp(p->nodes.v[i].node_id, node_id) == 0)
			return &p->nodes.v[i];
	return NULL;
}

static void
drop_node(pub_pending_t *p, pub_node_t *n)
{
	free(n->node_id);
	*n = p->nodes.v[--p->nodes.n];
}

refit_status_t
coord_publish_decided(coord_t *c, refit_rec_t *r, refit_err_t *err)
{
	pub_pending_t *p = xcalloc(1, sizeof(*p));
	uint64_t first = uv_now(c->loop) + PUB_FIRST_MS;

	p->refit_id = r->id;
	p->epoch = r->epoch;
	p->version = r->version;
	p->model = xstrdup(r->model);
	p->whole = r->only == NULL;
	p->insts = xcalloc(r->ntook + 1, sizeof(*p->insts));
	for (size_t k = 0; k < r->ntook; k++)
		p->insts[p->ninsts++] = xstrdup(r->took[k]);
	for (size_t i = 0; i < r->nnodes; i++) {
		member_t *m = coord_find_member(c, r->nodes[i]);

		if (m != NULL)
			VEC_PUSH(&p->nodes, ((pub_node_t){xstrdup(m->node_id), false, first}));
	}
	VEC_PUSH(&c->pubs, p);
	if (coord_state_save(c, err) == REFIT_OK)
		return REFIT_OK;
	/* not durable: not taken (no Publish leaves; the nodes keep their
	 * commit unshown, as when the coordinator dies before deciding) */
	c->pubs.n--;
	coord_pub_free(p);
	return err->status;
}

bool
coord_publish_held(coord_t *c, refit_rec_t *r)
{
	if (c->o.test_hold_publish_ms == 0)
		return false;
	r->publish_at_ms = uv_now(c->loop) + c->o.test_hold_publish_ms;
	log_info("coordinator: refit %" PRIu64 " (%s v%" PRIu64 "): the decision to publish is "
		 "durable; Publish held %" PRIu32 " ms (test_hold_publish_ms)", r->id, r->model,
		 r->version, c->o.test_hold_publish_ms);
	return true;
}

/* Every node acknowledged p (at): its instances show the version (never
 * going back, and not when a node had lost its slice), the record goes. */
static void
pub_done(coord_t *c, pub_pending_t *p, size_t at)
{
	model_t *m = coord_find_model(c, p->model);
	refit_err_t err;

	for (size_t k = 0; m != NULL && !p->lost && k < p->ninsts; k++)
		for (size_t i = 0; i < m->inst.n; i++) {
			instance_t *in = &m->inst.v[i];

			if (in->role != REFIT__V1__ROLE__INFER || strcmp(in->name, p->insts[k]) != 0 ||
			    in->installed_version > p->version)
				continue;
			in->installed_version = p->version;
			in->invalid = false;
		}
	if (m != NULL && !p->lost && p->whole && p->version > m->installed_version)
		m->installed_version = p->version;
	log_info("coordinator: refit %" PRIu64 " (%s, version %" PRIu64 "): Publish "
		 "acknowledged by every node%s", p->refit_id, p->model, p->version,
		 p->lost ? " that still held it (the others need a catch-up refit)" : "");
	c->pubs.v[at] = c->pubs.v[--c->pubs.n];
	coord_pub_free(p);
	refit_err_clear(&err);
	if (coord_state_save(c, &err) != REFIT_OK)
		log_warnx("coordinator: state not saved: %s", err.msg);
}

void
coord_publish_acked(coord_t *c, uint64_t refit_id, const char *node_id)
{
	size_t at;
	pub_pending_t *p = find_pub(c, refit_id, &at);
	pub_node_t *n = p ? find_node(p, node_id) : NULL;

	if (n == NULL)
		return;
	drop_node(p, n);
	if (p->nodes.n == 0) {
		refit_rec_t *r = coord_find_refit(c, refit_id);

		if (r == NULL || r->fsm.state != REFIT_FSM_PUBLISHING) {
			pub_done(c, p, at);  /* a late answer after the refit ended */
			return;
		}
		/* the refit's own round: its end saves the state */
		c->pubs.v[at] = c->pubs.v[--c->pubs.n];
		coord_pub_free(p);
	}
}

void
coord_publish_failed(coord_t *c, uint64_t refit_id, const char *node_id)
{
	pub_pending_t *p = find_pub(c, refit_id, NULL);
	pub_node_t *n = p ? find_node(p, node_id) : NULL;

	if (n != NULL)
		n->next_ms = uv_now(c->loop) + PUB_RESEND_MS;
}

static void
on_resent(void *arg, refit_status_t st, const char *msg, ProtobufCMessage *resp)
{
	pctx_t *x = arg;
	coord_t *c = x->c;
	size_t at;
	pub_pending_t *p = find_pub(c, x->refit_id, &at);
	pub_node_t *n = p ? find_node(p, x->node_id) : NULL;

	(void)resp;
	c->inflight--;
	if (n != NULL && !c->closing) {
		n->busy = false;
		if (st == REFIT_OK) {
			log_info("coordinator: refit %" PRIu64 ": node %s acknowledged the "
				 "resent Publish (version %" PRIu64 ")", p->refit_id, x->node_id,
				 p->version);
			drop_node(p, n);
		} else if (st == REFIT_ERR_NOT_FOUND || st == REFIT_ERR_STALE_EPOCH) {
			log_warnx("coordinator: refit %" PRIu64 ": node %s cannot publish version %"
				  PRIu64 " any more (%s): its instances need a catch-up refit",
				  p->refit_id, x->node_id, p->version, msg);
			p->lost = true;
			drop_node(p, n);
		} else {
			n->next_ms = uv_now(c->loop) + PUB_RESEND_MS;
		}
		if (p->nodes.n == 0)
			pub_done(c, p, at);
	}
	free(x->node_id);
	free(x);
	coord_maybe_free(c);
}

static member_t *
member_named(coord_t *c, const char *node_id)
{
	for (size_t i = 0; i < c->members.n; i++)
		if (strcmp(c->members.v[i].node_id, node_id) == 0)
			return &c->members.v[i];
	return NULL;
}

static void
resend(coord_t *c, pub_pending_t *p, pub_node_t *n, const member_t *m)
{
	Refit__V1__PublishRequest pq = REFIT__V1__PUBLISH_REQUEST__INIT;
	pctx_t *x = xcalloc(1, sizeof(*x));
	refit_err_t err;

	pq.refit_id = p->refit_id;
	pq.epoch = p->epoch;
	pq.model = p->model;
	pq.version = p->version;
	*x = (pctx_t){c, p->refit_id, xstrdup(n->node_id)};
	refit_err_clear(&err);
	if (rpc_async_call(c->rpc, RPC_GROUP_NONE, m->rpc_ep, &refit__v1__node__descriptor,
			   "Publish", &pq.base, PUB_CALL_MS, on_resent, x, &err) != REFIT_OK) {
		free(x->node_id);
		free(x);
		n->next_ms = uv_now(c->loop) + PUB_RESEND_MS;
		return;
	}
	c->inflight++;
	n->busy = true;
}

/* A decision whose refit record went (refit_records keeps the newest):
 * its nodes have not come back since; they are left to a catch-up. */
static bool
pub_expired(coord_t *c, size_t at)
{
	pub_pending_t *p = c->pubs.v[at];

	if (coord_find_refit(c, p->refit_id) != NULL)
		return false;
	for (size_t k = 0; k < p->nodes.n; k++)
		if (p->nodes.v[k].busy)
			return false;  /* its answer first */
	log_warnx("coordinator: refit %" PRIu64 " (%s, version %" PRIu64 "): its record is "
		  "gone, Publish no longer resent to %zu nodes (left to a catch-up refit)",
		  p->refit_id, p->model, p->version, p->nodes.n);
	p->lost = true;
	while (p->nodes.n)
		drop_node(p, &p->nodes.v[0]);
	pub_done(c, p, at);
	return true;
}

void
coord_publish_tick(coord_t *c)
{
	uint64_t now = uv_now(c->loop);

	if (!c->leading || c->closing)
		return;
	for (size_t i = 0; i < c->pubs.n; i++) {
		pub_pending_t *p = c->pubs.v[i];

		if (pub_expired(c, i)) {
			i--;
			continue;
		}
		for (size_t k = 0; k < p->nodes.n; k++) {
			pub_node_t *n = &p->nodes.v[k];
			member_t *m = member_named(c, n->node_id);

			if (n->busy || now < n->next_ms || m == NULL || m->rpc_ep[0] == '\0')
				continue;
			resend(c, p, n, m);
		}
	}
}
