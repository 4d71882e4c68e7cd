/*
 * node_install.c - the Node service's Commit and Publish: the two phases
 * of the install that follows a refit's slices (node_run.c runs them).
 *
 * Commit (every slice of the refit ran) only marks the finished slice
 * committed, showing clients nothing; Publish (every node committed)
 * flips double buffers (or marks in-place weights valid) and moves the
 * installed version.  Publish is idempotent: the coordinator resends a
 * decided Publish until it is acknowledged (docs/ha.md), and one for a
 * refit published here already (the last NODE_PUBLISHED_MAX) is answered
 * OK without installing again; one for a refit whose committed slice is
 * not here (the node restarted, or a newer refit replaced it) is refused
 * NOT_FOUND, and the coordinator leaves that instance to a catch-up.
 */
#include <inttypes.h>
#include <stdlib.h>

#include "common/log.h"
#include "daemon/node/node_internal.h"

/* A call for a refit of another epoch than the one prepared here fails
 * (STALE_EPOCH); true when it did. */
bool
node_epoch_refused(node_t *n, rpc_call_t *call, const char *method, uint64_t refit_id,
	      uint64_t epoch)
{
	if (epoch == n->prepared_epoch)
		return false;
	rpc_call_fail(call, REFIT_ERR_STALE_EPOCH, "node %s: %s for refit %" PRIu64 " carries "
		      "epoch %" PRIu64 ", this node prepared epoch %" PRIu64, n->node_id, method,
		      refit_id, epoch, n->prepared_epoch);
	return true;
}

prepared_t *
node_find_prepared(node_t *n, uint64_t id)
{
	for (size_t i = 0; i < n->prepared.n; i++)
		if (n->prepared.v[i].refit_id == id)
			return &n->prepared.v[i];
	return NULL;
}

void
node_drop_prepared(node_t *n, prepared_t *p)
{
	free(p->model);
	free(p->clients);
	*p = n->prepared.v[--n->prepared.n];
}

void
node_h_commit(void *ctx, rpc_call_t *call, const ProtobufCMessage *msg)
{
	node_t *n = ctx;
	const Refit__V1__CommitRequest *rq = (const void *)msg;
	Refit__V1__CommitResponse rsp = REFIT__V1__COMMIT_RESPONSE__INIT;
	prepared_t *p = node_find_prepared(n, rq->refit_id);

	if (node_epoch_refused(n, call, "Commit", rq->refit_id, rq->epoch))
		return;
	if (p == NULL)
		return rpc_call_fail(call, REFIT_ERR_NOT_FOUND, "node %s: refit %" PRIu64 " has "
				     "no finished slice here to commit", n->node_id,
				     rq->refit_id);
	if (n->test_fail_commit && ++n->ncommits == n->test_fail_commit)
		return rpc_call_fail(call, REFIT_ERR_SYS, "node %s: refit %" PRIu64 ": Commit "
				     "refused (test_fail_commit %" PRIu64 ")", n->node_id,
				     rq->refit_id, n->test_fail_commit);
	/* first phase: nothing is shown to clients until Publish */
	p->committed = true;
	if (n->test_lose_publish && ++n->npublishes % n->test_lose_publish == 0)
		n->lose_refit = p->refit_id;
	log_info("node %s: refit %" PRIu64 ": model \"%s\" version %" PRIu64 " committed, "
		 "waiting for Publish", n->node_id, p->refit_id, p->model, p->version);
	rpc_call_reply(call, &rsp.base);
}

/* test_lose_publish N: the Publish of every Nth refit committed here,
 * and every resend of it until the node joins a coordinator again, is
 * lost (as on a cut link). */
static bool
publish_lost(node_t *n, rpc_call_t *call, uint64_t refit_id)
{
	if (n->lose_refit == 0 || n->lose_refit != refit_id)
		return false;
	log_info("node %s: refit %" PRIu64 ": Publish lost (test_lose_publish %" PRIu64 ")",
		 n->node_id, refit_id, n->test_lose_publish);
	rpc_call_fail(call, REFIT_ERR_UNAVAILABLE, "node %s: refit %" PRIu64 ": Publish lost "
		      "(test_lose_publish %" PRIu64 ")", n->node_id, refit_id,
		      n->test_lose_publish);
	return true;
}

void
node_h_publish(void *ctx, rpc_call_t *call, const ProtobufCMessage *msg)
{
	node_t *n = ctx;
	const Refit__V1__PublishRequest *rq = (const void *)msg;
	Refit__V1__PublishResponse rsp = REFIT__V1__PUBLISH_RESPONSE__INIT;
	prepared_t *p = node_find_prepared(n, rq->refit_id);

	if (publish_lost(n, call, rq->refit_id))
		return;
	/* a resend (the coordinator, or the next leader, did not see the
	 * answer): acknowledged again, installed once */
	for (size_t i = 0; i < NODE_PUBLISHED_MAX && i < n->npublished; i++)
		if (n->published[i].refit_id == rq->refit_id &&
		    n->published[i].epoch == rq->epoch) {
			log_info("node %s: refit %" PRIu64 ": Publish again: version %" PRIu64
				 " is installed here already", n->node_id, rq->refit_id,
				 rq->version);
			return rpc_call_reply(call, &rsp.base);
		}
	if (node_epoch_refused(n, call, "Publish", rq->refit_id, rq->epoch))
		return;
	if (p == NULL || !p->committed)
		return rpc_call_fail(call, p ? REFIT_ERR_STALE_EPOCH : REFIT_ERR_NOT_FOUND,
				     "node %s: refit %" PRIu64 " has %s here to publish",
				     n->node_id, rq->refit_id, p ? "a slice not committed" :
				     "no committed slice");
	for (size_t i = 0; i < p->nclients; i++) {
		client_t *c = node_client(n, p->clients[i]);

		if (c == NULL)
			continue;
		if (c->install == REFIT__V1__INSTALL_MODE__DOUBLE_BUFFER)
			c->active ^= 1;
		c->valid = true;
		c->version = p->version;
		free(c->failure);
		c->failure = NULL;
	}
	log_info("node %s: refit %" PRIu64 ": model \"%s\" version %" PRIu64 " installed",
		 n->node_id, p->refit_id, p->model, p->version);
	n->published[n->npublished % NODE_PUBLISHED_MAX].refit_id = p->refit_id;
	n->published[n->npublished++ % NODE_PUBLISHED_MAX].epoch = rq->epoch;
	node_drop_prepared(n, p);
	node_waiters_sweep(n);
	rpc_call_reply(call, &rsp.base);
}
