/*
 * coord_store.c - the coordinator's records and their lifetime: lookups of
 * members, models and refits' inputs, the members' topology and the
 * composed destination layout, whether a caller acts for a member, the
 * clock, persisting a change
 * (coord_state.c writes the file), and freeing it all once nothing is in
 * flight.  Below coord.c, coord_refit.c, coord_plan.c and coord_metrics.c;
 * calls none of them.  Loop thread only.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <inttypes.h>

#include "common/log.h"
#include "daemon/coord/coord_backend.h"
#include "daemon/coord/coord_internal.h"
#include "rpc/rpc_auth.h"

void
coord_member_fini(member_t *m)
{
	free(m->node_id);
	free(m->host);
	free(m->rpc_ep);
	free(m->data_ep);
	free(m->transport);
	free(m->session);
	free(m->poisoned);
	for (size_t i = 0; i < m->nranks; i++)
		free(m->ranks[i].domain);
	free(m->ranks);
}

void
coord_instance_fini(instance_t *in)
{
	free(in->name);
	free(in->holders);
	plan_layout_set_fini(&in->layouts);
}

bool
coord_instance_holds(const instance_t *in, uint64_t member_id)
{
	for (size_t i = 0; i < in->nholders; i++)
		if (in->holders[i] == member_id)
			return true;
	return false;
}

void
coord_instance_hold(instance_t *in, uint64_t member_id)
{
	if (coord_instance_holds(in, member_id))
		return;
	in->holders = xreallocarray(in->holders, in->nholders + 1, sizeof(*in->holders));
	in->holders[in->nholders++] = member_id;
}

bool
coord_instance_prune(coord_t *c, instance_t *in)
{
	size_t n = 0;

	for (size_t i = 0; i < in->nholders; i++)
		if (coord_find_member(c, in->holders[i]) != NULL)
			in->holders[n++] = in->holders[i];
	in->nholders = n;
	if (n > 0 && !coord_instance_holds(in, in->member_id))
		in->member_id = in->holders[0];
	return n > 0;
}

int32_t
coord_instance_unheld(coord_t *c, const instance_t *in)
{
	for (size_t t = 0; t < in->layouts.n; t++) {
		const plan_layout_t *l = &in->layouts.v[t];

		for (size_t k = 0; k < l->nshards; k++) {
			int32_t rk = l->shards[k].rank;
			bool held = false;

			for (size_t i = 0; i < c->members.n && !held; i++) {
				const member_t *m = &c->members.v[i];

				for (size_t j = 0; j < m->nranks && !held; j++)
					held = m->ranks[j].rank == rk &&
					       coord_instance_holds(in, m->id);
			}
			if (!held)
				return rk;
		}
	}
	return -1;
}

bool
coord_instance_behind(const model_t *m, const instance_t *in)
{
	return in->role == REFIT__V1__ROLE__INFER &&
	       (in->installed_version < m->installed_version || in->invalid);
}

member_t *
coord_find_member(coord_t *c, uint64_t id)
{
	for (size_t i = 0; i < c->members.n; i++)
		if (c->members.v[i].id == id)
			return &c->members.v[i];
	return NULL;
}

bool
coord_binds(const coord_t *c)
{
	return c->srv != NULL && (rpc_server_join_required(c->srv) || rpc_server_mtls(c->srv));
}

bool
coord_cert_is(coord_t *c, rpc_call_t *call, const char *method, const char *node_id)
{
	const char *cn = rpc_call_cert_node(call);

	if (c->srv == NULL || !rpc_server_mtls(c->srv) || (cn && strcmp(cn, node_id) == 0))
		return true;
	rpc_call_refuse(call, REFIT_ERR_PERMISSION_DENIED, "identity", "%s: node \"%s\" is not "
			"the caller: its certificate names node \"%s\", and a member acts only "
			"for itself", method, node_id, cn ? cn : "?");
	return false;
}

bool
coord_member_acts(coord_t *c, rpc_call_t *call, const char *method, const member_t *m)
{
	size_t len;
	const char *s = rpc_call_session(call, &len);

	if (!coord_cert_is(c, call, method, m->node_id))
		return false;
	if (!coord_binds(c) || m->session == NULL || rpc_auth_eq(s, len, m->session))
		return true;
	rpc_call_refuse(call, REFIT_ERR_PERMISSION_DENIED, "identity", "%s: member %" PRIu64
			" is node \"%s\", and the caller is not (its session secret, metadata "
			"\"%s\", is %s): a member acts only for itself", method, m->id, m->node_id,
			RPC_MD_SESSION, s ? "another's" : "missing");
	return false;
}

model_t *
coord_find_model(coord_t *c, const char *name)
{
	for (size_t i = 0; i < c->models.n; i++)
		if (strcmp(c->models.v[i].name, name) == 0)
			return &c->models.v[i];
	return NULL;
}

instance_t *
coord_train_instance(model_t *m)
{
	for (size_t i = 0; i < m->inst.n; i++)
		if (m->inst.v[i].role == REFIT__V1__ROLE__TRAIN)
			return &m->inst.v[i];
	return NULL;
}

/* ---- derived from the records ---- */

/* The topology of the current members. */
refit_status_t
coord_members_topo(coord_t *c, plan_topo_t *t, refit_err_t *err)
{
	plan_topo_init(t);
	t->nic_per_node = c->o.nic_per_node;
	for (size_t i = 0; i < c->members.n; i++)
		for (size_t k = 0; k < c->members.v[i].nranks; k++)
			CHECK(plan_topo_add_rank(t, c->members.v[i].ranks[k].rank,
						 c->members.v[i].node_id,
						 c->members.v[i].ranks[k].domain, err));
	return REFIT_OK;
}

/*
 * Inference instances are replicas: compose them into one destination
 * layout, tensor by tensor, as explicit layouts holding every instance's
 * shards.
 */
refit_status_t
coord_compose_dst(const model_t *m, const char *only, plan_layout_set_t *out,
		  refit_err_t *err)
{
	const plan_layout_set_t **sets = xcalloc(m->inst.n + 1, sizeof(*sets));
	size_t n = 0;
	refit_status_t rc;

	for (size_t i = 0; i < m->inst.n; i++)
		if (m->inst.v[i].role == REFIT__V1__ROLE__INFER && !m->inst.v[i].skip &&
		    (only == NULL || strcmp(only, m->inst.v[i].name) == 0))
			sets[n++] = &m->inst.v[i].layouts;
	if (n == 0) {
		free(sets);
		plan_layout_set_init(out);
		return refit_err_set(err, REFIT_ERR_NOT_FOUND, "model \"%s\" has no inference "
				     "instance", m->name);
	}
	rc = plan_layout_compose(sets, n, out, err);
	free(sets);
	if (rc != REFIT_OK)
		refit_err_prefix(err, "model \"%s\"", m->name);
	return rc;
}

uint64_t
coord_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* ---- persisting ---- */

/* Persist after a change; a failed write is logged, the change stands. */
void
coord_save(coord_t *c)
{
	refit_err_t err;

	refit_err_clear(&err);
	if (coord_state_save(c, &err) != REFIT_OK)
		log_warnx("coordinator: %s", err.msg);
}

refit_status_t
coord_save_durable(coord_t *c, const char *what, refit_err_t *err)
{
	if (coord_state_save(c, err) == REFIT_OK)
		return REFIT_OK;
	log_warnx("coordinator: %s refused: %s", what, err->msg);
	refit_err_prefix(err, "%s: the change cannot be made durable, so it was not made",
			 what);
	err->status = REFIT_ERR_UNAVAILABLE;
	return err->status;
}

/* ---- freeing ---- */

static size_t
str_bytes(const char *s)
{
	return s ? strlen(s) + 1 : 0;
}

/* an array of n strings */
static size_t
strs_bytes(char *const *v, size_t n)
{
	size_t b = n * sizeof(*v);

	for (size_t i = 0; i < n; i++)
		b += str_bytes(v[i]);
	return b;
}

size_t
coord_refit_bytes(const refit_rec_t *r)
{
	size_t b = sizeof(*r) + r->nnodes * sizeof(*r->nodes);

	b += str_bytes(r->model) + str_bytes(r->key) + str_bytes(r->failure) + str_bytes(r->only);
	b += strs_bytes(r->attempts, r->nattempts) + strs_bytes(r->skipped, r->nskipped);
	b += strs_bytes(r->took, r->ntook) + r->ntook * sizeof(*r->took_gen);
	if (r->nstate)
		b += (r->nnodes + 1) * (sizeof(*r->nstate) + sizeof(*r->ntime));
	return b;
}

/* Free a refit record. */
/* Delta lacks (coord_records.h), emptied. */
void
coord_lacks_free(coord_lack_t **v, size_t *n)
{
	for (size_t i = 0; i < *n; i++) {
		free((*v)[i].from);
		free((*v)[i].to);
		free((*v)[i].msgs);
	}
	free(*v);
	*v = NULL;
	*n = 0;
}

void
coord_refit_free(refit_rec_t *r)
{
	coord_refit_uncount();
	for (size_t i = 0; i < r->nattempts; i++)
		free(r->attempts[i]);
	free(r->attempts);
	free(r->only);
	for (size_t i = 0; i < r->nskipped; i++)
		free(r->skipped[i]);
	free(r->skipped);
	for (size_t i = 0; i < r->ntook; i++)
		free(r->took[i]);
	free(r->took);
	free(r->took_gen);
	free(r->model);
	free(r->key);
	free(r->failure);
	free(r->nodes);
	free(r->nstate);
	free(r->ntime);
	coord_lacks_free(&r->delta_lacks, &r->ndelta_lacks);
	coord_slices_free(r);
	free(r);
}

/* The refit records, plans and nccl members of c. */
static void
refits_free(coord_t *c)
{
	free(c->nccl_members);
	c->nccl_members = NULL;
	for (size_t i = 0; i < c->refits.n; i++)
		coord_refit_free(c->refits.v[i]);
	VEC_FREE(&c->refits);
	for (size_t i = 0; i < c->plans.n; i++) {
		free(c->plans.v[i].model);
		plan_fini(&c->plans.v[i].plan);
	}
	VEC_FREE(&c->plans);
}

void
coord_free(coord_t *c)
{
	for (size_t i = 0; i < c->members.n; i++)
		coord_member_fini(&c->members.v[i]);
	VEC_FREE(&c->members);
	for (size_t i = 0; i < c->pubs.n; i++)
		coord_pub_free(c->pubs.v[i]);
	VEC_FREE(&c->pubs);
	for (size_t i = 0; i < c->models.n; i++) {
		for (size_t k = 0; k < c->models.v[i].inst.n; k++)
			coord_instance_fini(&c->models.v[i].inst.v[k]);
		VEC_FREE(&c->models.v[i].inst);
		free(c->models.v[i].name);
		free(c->models.v[i].delta_members);
		coord_lacks_free(&c->models.v[i].delta_lacks, &c->models.v[i].ndelta_lacks);
	}
	VEC_FREE(&c->models);
	refits_free(c);
	if (c->store)
		c->store->free(c->store_impl);
	for (size_t i = 0; i < c->ngates; i++)
		free(c->gates[i]);
	free(c->gates);
	free(c);
}

void
coord_maybe_free(coord_t *c)
{
	void (*cb)(void *) = c->closed_cb;
	void *arg = c->closed_arg;

	if (!c->closing || !c->timer_closed || c->inflight != 0 || c->leader != NULL)
		return;
	coord_free(c);
	if (cb)
		cb(arg);
}
