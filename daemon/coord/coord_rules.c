/*
 * coord_rules.c - the membership's and the registry's rules
 * (coord_rules.h).  Pure.
 */
#include <string.h>

#include "daemon/coord/coord_rules.h"

static const member_t *
holder(const member_t *members, size_t nmembers, int32_t rank)
{
	for (size_t i = 0; i < nmembers; i++)
		for (size_t k = 0; k < members[i].nranks; k++)
			if (members[i].ranks[k].rank == rank)
				return &members[i];
	return NULL;
}

refit_status_t
coord_rules_join(const member_t *members, size_t nmembers, const char *node,
		 const int32_t *ranks, size_t n, refit_err_t *err)
{
	if (node == NULL || node[0] == '\0')
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "Join: node_id is empty");
	if (n == 0)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "Join \"%s\": no ranks", node);
	for (size_t i = 0; i < n; i++) {
		int32_t r = ranks[i];

		if (r < 0 || r >= PLAN_MAX_RANK_ID)
			return refit_err_set(err, REFIT_ERR_INVALID_ARG, "Join \"%s\": rank %d is "
					     "out of range", node, r);
		for (size_t k = 0; k < nmembers; k++) {
			const member_t *o = &members[k];

			if (strcmp(o->node_id, node) == 0)
				continue; /* a rejoin replaces it */
			if (holder(o, 1, r) != NULL)
				return refit_err_set(err, REFIT_ERR_EXISTS, "Join \"%s\": rank %d "
						     "already belongs to node \"%s\"", node, r,
						     o->node_id);
		}
		for (size_t j = 0; j < i; j++)
			if (ranks[j] == r)
				return refit_err_set(err, REFIT_ERR_INVALID_ARG, "Join \"%s\": "
						     "rank %d listed twice", node, r);
	}
	return REFIT_OK;
}

int32_t
coord_rules_unheld_rank(const member_t *members, size_t nmembers,
			const plan_layout_set_t *set, size_t *tensor)
{
	for (size_t t = 0; t < set->n; t++)
		for (size_t k = 0; k < set->v[t].nshards; k++) {
			int32_t rk = set->v[t].shards[k].rank;

			if (holder(members, nmembers, rk) == NULL) {
				*tensor = t;
				return rk;
			}
		}
	return -1;
}

int32_t
coord_rules_shared_rank(const plan_layout_set_t *a, const plan_layout_set_t *b)
{
	for (size_t i = 0; i < a->n; i++)
		for (size_t k = 0; k < a->v[i].nshards; k++)
			for (size_t j = 0; j < b->n; j++)
				for (size_t q = 0; q < b->v[j].nshards; q++)
					if (b->v[j].shards[q].rank == a->v[i].shards[k].rank)
						return a->v[i].shards[k].rank;
	return -1;
}

refit_status_t
coord_rules_own_ranks(const model_t *m, const char *iname, const plan_layout_set_t *set,
		      refit_err_t *err)
{
	for (size_t i = 0; i < m->inst.n; i++) {
		const instance_t *o = &m->inst.v[i];
		int32_t r;

		if (o->role != COORD_ROLE_INFER || strcmp(o->name, iname) == 0)
			continue;
		if ((r = coord_rules_shared_rank(set, &o->layouts)) >= 0)
			return refit_err_set(err, REFIT_ERR_INVALID_ARG, "RegisterLayout \"%s\": "
					     "instance \"%s\" uses rank %d, which instance \"%s\" "
					     "uses too: instances need ranks of their own (a stale "
					     "one goes with `refitctl unregister %s %s`)", m->name,
					     iname, r, o->name, m->name, o->name);
	}
	return REFIT_OK;
}

bool
coord_rules_is_symptom(const char *msg)
{
	static const char *const seen[] = {
		"tcp: ",                        /* the tcp transport lost its peer */
		"remote process exited",        /* NCCL's remote error: a peer died */
		"aborted by the coordinator",   /* stopped after another's failure */
	};

	for (size_t i = 0; i < sizeof(seen) / sizeof(seen[0]); i++)
		if (strstr(msg, seen[i]) != NULL)
			return true;
	return false;
}

coord_trigger_wait_t
coord_rules_trigger(const model_t *m, bool busy, uint64_t now)
{
	if (!m->on_ready || m->pending_version == 0)
		return COORD_TRIGGER_NONE;
	if (m->pending_version <= m->installed_version)
		return COORD_TRIGGER_STALE;
	if (busy)
		return COORD_TRIGGER_BUSY;
	if (m->policy_start_ms != 0 && now < m->policy_start_ms + m->min_interval_ms)
		return COORD_TRIGGER_INTERVAL;
	return COORD_TRIGGER_GO;
}

bool
coord_rules_trigger_note(model_t *m, uint64_t version)
{
	bool replaced = false;

	if (!m->on_ready || version <= m->pending_version)
		return false;
	if (m->pending_version != 0) {
		m->skipped_versions++;
		replaced = true;
	}
	m->pending_version = version;
	return replaced;
}
