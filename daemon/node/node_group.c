/*
 * Several clients of one trainer or inference instance on this node, each
 * holding some of the node's ranks of it (a process per GPU: FSDP2's
 * trainer processes, an engine's workers).  A client that gives memory for
 * some of the node's ranks of its layouts -- every piece of those ranks,
 * none of the others -- is "partial"; the partial clients of one (model,
 * role, instance) with the same layouts form a group.  The node registers a
 * group with the coordinator once its members hold every one of the node's
 * ranks (the member completing it forwards its registration), tells the
 * coordinator a trainer's version once every member holds it, runs slices
 * over all members, and unregisters the group when a member goes.  A client
 * holding all of the node's ranks is the group of one it always was.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "daemon/node/node_internal.h"

static bool
has_rank(const client_t *c, int32_t r)
{
	for (size_t i = 0; i < c->mem.n; i++)
		if (c->mem.v[i].rank == r)
			return true;
	return false;
}

/* a is another live client of b's trainer or instance (b may be one
 * going away: its group is what is left) */
bool
node_group_same(const client_t *a, const client_t *b)
{
	return a != b && !a->dead && a->role == b->role &&
	       strcmp(a->model, b->model) == 0 &&
	       (a->role == REFIT__V1__ROLE__TRAIN || strcmp(a->instance, b->instance) == 0);
}

refit_status_t
node_group_check(node_t *n, const client_t *c, refit_err_t *err)
{
	for (size_t i = 0; i < n->clients.n; i++) {
		const client_t *o = n->clients.v[i];

		if (!node_group_same(o, c) || (!c->partial && !o->partial))
			continue;   /* two whole registrations: the coordinator's to judge */
		if (!c->partial || !o->partial)
			return refit_err_set(err, REFIT_ERR_EXISTS, "%s \"%s\" is registered on "
					     "this node already by client %" PRIu64 " (pid %d)%s",
					     c->role == REFIT__V1__ROLE__TRAIN ? "the trainer of" :
					     "instance", c->role == REFIT__V1__ROLE__TRAIN ? c->model :
					     c->instance, o->id, o->pid, o->partial ?
					     " with some of its ranks: give the others" : "");
		if (strcmp(o->ldigest, c->ldigest) != 0)
			return refit_err_set(err, REFIT_ERR_INVALID_ARG, "the layouts differ from "
					     "those client %" PRIu64 " (pid %d) registered for the "
					     "same %s", o->id, o->pid,
					     c->role == REFIT__V1__ROLE__TRAIN ? "trainer" :
					     "instance");
		for (size_t k = 0; k < c->mem.n; k++)
			if (has_rank(o, c->mem.v[k].rank))
				return refit_err_set(err, REFIT_ERR_EXISTS, "rank %d is registered "
						     "on this node already by client %" PRIu64
						     " (pid %d)", c->mem.v[k].rank, o->id, o->pid);
	}
	return REFIT_OK;
}

/* Every rank of this node that the layouts place is held by c or its group. */
bool
node_group_complete(node_t *n, const client_t *c)
{
	for (uint32_t t = 0; t < c->layouts.n; t++) {
		const plan_layout_t *l = &c->layouts.v[t];

		for (size_t k = 0; k < l->nshards; k++) {
			int32_t r = l->shards[k].rank;
			bool held = false;

			if (!node_serves(n, r) || has_rank(c, r))
				continue;
			for (size_t i = 0; i < n->clients.n && !held; i++)
				held = node_group_same(n->clients.v[i], c) &&
				       n->clients.v[i]->partial && has_rank(n->clients.v[i], r);
			if (!held)
				return false;
		}
	}
	return true;
}

void
node_group_forwarded(node_t *n, client_t *c, const char *digest, bool on)
{
	c->forwarded = on;
	if (digest)
		snprintf(c->digest, sizeof(c->digest), "%s", digest);
	for (size_t i = 0; i < n->clients.n; i++) {
		client_t *o = n->clients.v[i];

		if (!node_group_same(o, c) || !o->partial)
			continue;
		o->forwarded = on;
		if (digest)
			snprintf(o->digest, sizeof(o->digest), "%s", digest);
	}
}

/* Trainer: every member of c's group holds `version` (c included). */
bool
node_group_ready(node_t *n, const client_t *c, uint64_t version)
{
	if (!c->readable || c->version != version)
		return false;
	for (size_t i = 0; i < n->clients.n; i++) {
		const client_t *o = n->clients.v[i];

		if (node_group_same(o, c) && o->partial && (!o->readable || o->version != version))
			return false;
	}
	return true;
}

/* c is the first of its group in the node's list (who registers it again). */
bool
node_group_first(node_t *n, const client_t *c)
{
	for (size_t i = 0; i < n->clients.n; i++) {
		if (n->clients.v[i] == c)
			return true;
		if (node_group_same(n->clients.v[i], c) && n->clients.v[i]->partial)
			return false;
	}
	return true;
}
