/*
 * refitctl_show.c - refitctl's output: what each command prints of the
 * coordinator's answer, as text (tables through one row helper) or, with
 * --json, as one line built with cJSON (every string escaped, 64-bit
 * numbers exact): members, models, plans, refits and the other commands'
 * responses, and emit(), which picks one for a command of the table.
 * Called by refitctl.c only; it calls nothing there (refitctl_internal.h).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include <cjson/cJSON.h>

#include "client/refitctl_internal.h"
#include "common/str.h"
#include "refit/v1/refit.pb-c.h"

/* The name protobuf gives an enum value ("FAILED", "TRAIN"), or "?". */
static const char *
enum_name(const ProtobufCEnumDescriptor *d, int v)
{
	const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value(d, v);

	return ev ? ev->name : "?";
}

static const char *
role_name(Refit__V1__Role r)
{
	return r == REFIT__V1__ROLE__TRAIN ? "train" : r == REFIT__V1__ROLE__INFER ? "infer" : "?";
}

static const char *
trigger_name(Refit__V1__TriggerMode t)
{
	return t == REFIT__V1__TRIGGER_MODE__TRIGGER_ON_READY ? "on_ready" :
	       t == REFIT__V1__TRIGGER_MODE__TRIGGER_MANUAL ? "manual" : "?";
}

static const char *
state_name(Refit__V1__RefitState s)
{
	return enum_name(&refit__v1__refit_state__descriptor, (int)s);
}

static const char *
mode_name(Refit__V1__Mode m)
{
	return m == REFIT__V1__MODE__BROADCAST ? "broadcast" : "reshard";
}

/* ---- text: one row helper for every table ------------------------------ */

/* cell[i] left-aligned in w[i] columns, one space between, the last as is */
static void
row(int indent, size_t n, const int *w, const char *const *cell)
{
	printf("%*s", indent, "");
	for (size_t i = 0; i + 1 < n; i++)
		printf("%-*s ", w[i], cell[i]);
	printf("%s\n", n ? cell[n - 1] : "");
}

/* ---- --json: built with cJSON (every string escaped; 64-bit numbers exact) */

void *
refitctl_oom(void *p)
{
	if (p == NULL) {
		fprintf(stderr, "refitctl: out of memory\n");
		exit(1);
	}
	return p;
}

static cJSON *
jnew(void)
{
	return refitctl_oom(cJSON_CreateObject());
}

static void
jstr(cJSON *o, const char *k, const char *v)
{
	cJSON_AddStringToObject(o, k, str_nz(v));
}

static cJSON *
ju64_item(uint64_t v)
{
	char b[24];

	snprintf(b, sizeof(b), "%" PRIu64, v);
	return refitctl_oom(cJSON_CreateRaw(b));
}

static void
ju64(cJSON *o, const char *k, uint64_t v)
{
	cJSON_AddItemToObject(o, k, ju64_item(v));
}

/* a JSON array of n strings */
static cJSON *
jstrings(char **v, size_t n)
{
	cJSON *a = refitctl_oom(cJSON_CreateArray());

	for (size_t k = 0; k < n; k++)
		cJSON_AddItemToArray(a, refitctl_oom(cJSON_CreateString(str_nz(v[k]))));
	return a;
}

/* Print o on one line and free it. */
static void
jemit(cJSON *o)
{
	char *t = refitctl_oom(cJSON_PrintUnformatted(o));

	puts(t);
	cJSON_free(t);
	cJSON_Delete(o);
}

/* A list response: each item's text, or `none` when there are none. */
static void
text_list(void *const *v, size_t n, void (*one)(const void *, const args_t *),
	  const char *none, const args_t *a)
{
	for (size_t i = 0; i < n; i++)
		one(v[i], a);
	if (n == 0)
		printf("%s\n", none);
}

/* A list response as {"key": [item, ...]}. */
static cJSON *
json_list(const char *key, void *const *v, size_t n,
	  cJSON *(*one)(const void *, const args_t *), const args_t *a)
{
	cJSON *o = jnew(), *arr = cJSON_AddArrayToObject(o, key);

	for (size_t i = 0; i < n; i++)
		cJSON_AddItemToArray(arr, one(v[i], a));
	return o;
}

/* ---- members ------------------------------------------------------------ */

/* "poisoned" (it runs no more refits until refitd restarts on it), else "member" */
static const char *
member_state(const Refit__V1__Member *m)
{
	return m->poisoned && m->poisoned[0] ? "poisoned" : "member";
}

void
refitctl_text_members(const void *resp, const args_t *a)
{
	static const int w[] = {6, 20, 22, 7, 12, 20, 9, 0};
	static const char *const head[] = {"ID", "NODE", "HOST", "RANKS", "JOINED@EPOCH",
					   "CONNECTION", "STATE", "LEASE AGE"};
	const Refit__V1__ListMembersResponse *r = resp;
	size_t npoisoned = 0;

	(void)a;
	printf("epoch %" PRIu64 ", %zu members\n", r->epoch, r->n_members);
	row(0, 8, w, head);
	for (size_t i = 0; i < r->n_members; i++) {
		const Refit__V1__Member *m = r->members[i];
		char id[24], nr[24], joined[24], lease[64];

		snprintf(id, sizeof(id), "%" PRIu64, m->member_id);
		snprintf(nr, sizeof(nr), "%zu", m->n_ranks);
		snprintf(joined, sizeof(joined), "%" PRIu64, m->joined_epoch);
		snprintf(lease, sizeof(lease), "%" PRIu64 " ms / %u ms", m->lease_age_ms,
			 m->lease_ttl_ms);
		row(0, 8, w, (const char *const[]){id, m->node_id, m->host, nr, joined,
						  m->connection, member_state(m), lease});
		npoisoned += m->poisoned && m->poisoned[0];
	}
	/* why, under the table: the reason is long */
	for (size_t i = 0; npoisoned && i < r->n_members; i++)
		if (r->members[i]->poisoned && r->members[i]->poisoned[0])
			printf("node %s is poisoned: restart refitd on it: %s\n",
			       r->members[i]->node_id, r->members[i]->poisoned);
	printf("node calls: %" PRIu64 " outstanding, %" PRIu64 " cancelled since start\n",
	       r->node_calls_outstanding, r->node_calls_cancelled);
}

cJSON *
refitctl_json_members(const void *resp, const args_t *a)
{
	const Refit__V1__ListMembersResponse *r = resp;
	cJSON *o = jnew(), *ms;

	(void)a;
	ju64(o, "epoch", r->epoch);
	ms = cJSON_AddArrayToObject(o, "members");
	for (size_t i = 0; i < r->n_members; i++) {
		const Refit__V1__Member *m = r->members[i];
		cJSON *j = jnew(), *rs;

		ju64(j, "member_id", m->member_id);
		jstr(j, "node_id", m->node_id);
		jstr(j, "host", m->host);
		rs = cJSON_AddArrayToObject(j, "ranks");
		for (size_t k = 0; k < m->n_ranks; k++) {
			cJSON *rk = jnew();

			cJSON_AddNumberToObject(rk, "rank", m->ranks[k]->rank);
			jstr(rk, "domain", m->ranks[k]->domain);
			cJSON_AddItemToArray(rs, rk);
		}
		ju64(j, "joined_epoch", m->joined_epoch);
		ju64(j, "lease_age_ms", m->lease_age_ms);
		jstr(j, "connection", m->connection);
		jstr(j, "state", member_state(m));
		jstr(j, "poisoned", m->poisoned ? m->poisoned : "");
		cJSON_AddItemToArray(ms, j);
	}
	ju64(o, "node_calls_outstanding", r->node_calls_outstanding);
	ju64(o, "node_calls_cancelled", r->node_calls_cancelled);
	return o;
}

/* ---- models ------------------------------------------------------------- */

cJSON *
refitctl_json_model(const void *resp, const args_t *a)
{
	const Refit__V1__Model *m = resp;
	cJSON *o = jnew(), *is;

	(void)a;
	jstr(o, "name", m->name);
	cJSON_AddNumberToObject(o, "tensors", m->tensors);
	ju64(o, "latest_version", m->latest_version);
	ju64(o, "installed_version", m->installed_version);
	is = cJSON_AddArrayToObject(o, "instances");
	for (size_t i = 0; i < m->n_instances; i++) {
		cJSON *j = jnew();

		jstr(j, "instance", m->instances[i]->instance);
		jstr(j, "role", role_name(m->instances[i]->role));
		jstr(j, "layout_digest", m->instances[i]->layout_digest);
		ju64(j, "member_id", m->instances[i]->member_id);
		if (m->instances[i]->role == REFIT__V1__ROLE__INFER) {
			ju64(j, "installed_version", m->instances[i]->installed_version);
			cJSON_AddBoolToObject(j, "invalid", m->instances[i]->invalid);
			jstr(j, "install", m->instances[i]->install ==
			     REFIT__V1__INSTALL_MODE__IN_PLACE ? "in-place" : "double-buffer");
			ju64(j, "served_version", m->instances[i]->served_version);
			if (m->instances[i]->engine) {
				const Refit__V1__EngineInfo *e = m->instances[i]->engine;
				cJSON *ej = cJSON_AddObjectToObject(j, "engine");

				jstr(ej, "framework", e->framework);
				jstr(ej, "version", e->version);
				jstr(ej, "pause_mode", e->pause_mode);
			}
		}
		cJSON_AddItemToArray(is, j);
	}
	if (m->policy) {
		cJSON *p = cJSON_AddObjectToObject(o, "policy");

		cJSON_AddNumberToObject(p, "retries", m->policy->retries);
		cJSON_AddNumberToObject(p, "retry_backoff_ms", m->policy->retry_backoff_ms);
		cJSON_AddBoolToObject(p, "catch_up", m->policy->catch_up);
		cJSON_AddBoolToObject(p, "strict_instances", m->policy->strict_instances);
		jstr(p, "trigger", trigger_name(m->policy->trigger));
		cJSON_AddNumberToObject(p, "min_interval_ms", m->policy->min_interval_ms);
		jstr(p, "delta", m->policy->delta == REFIT__V1__DELTA_MODE__DELTA_OFF ? "off" :
			 "auto");
	}
	ju64(o, "pending_version", m->pending_version);
	ju64(o, "skipped_versions", m->skipped_versions);
	ju64(o, "policy_refits", m->policy_refits);
	return o;
}

/* The trigger policy of m as text ("" under manual with nothing counted). */
static void
trigger_text(const Refit__V1__Model *m, char *out, size_t len)
{
	const Refit__V1__RefitPolicy *p = m->policy;
	int n;

	out[0] = '\0';
	if (p == NULL || (p->trigger == REFIT__V1__TRIGGER_MODE__TRIGGER_MANUAL &&
			  m->skipped_versions == 0 && m->policy_refits == 0))
		return;
	n = snprintf(out, len, ", trigger %s", trigger_name(p->trigger));
	if (n > 0 && (size_t)n < len && p->min_interval_ms)
		n += snprintf(out + n, len - (size_t)n, " (min interval %u ms)", p->min_interval_ms);
	if (n > 0 && (size_t)n < len)
		n += snprintf(out + n, len - (size_t)n, ", %" PRIu64 " by policy, %" PRIu64
			      " skipped", m->policy_refits, m->skipped_versions);
	if (n > 0 && (size_t)n < len && m->pending_version)
		snprintf(out + n, len - (size_t)n, ", v%" PRIu64 " waits", m->pending_version);
}

/* The engine reading inference instance in, as text ("" when none said):
 * "vllm 0.32.0 serves v3, pause wait". */
static void
engine_text(const Refit__V1__Instance *in, char *out, size_t len)
{
	const Refit__V1__EngineInfo *e = in->engine;
	char sv[32] = "";

	out[0] = '\0';
	if (in->served_version)
		snprintf(sv, sizeof(sv), "serves v%" PRIu64, in->served_version);
	if (e == NULL && !sv[0])
		return;
	snprintf(out, len, "  %s%s%s%s%s%s%s", e ? e->framework : "engine",
		 e && e->version[0] ? " " : "", e ? e->version : "", sv[0] ? " " : "", sv,
		 e && e->pause_mode[0] ? ", pause " : "", e ? e->pause_mode : "");
}

void
refitctl_text_model(const void *resp, const args_t *a)
{
	static const int w[] = {24, 14, 16, 0}, wi[] = {5, 16, 24, 16, 0};
	const Refit__V1__Model *m = resp;
	char t[24], latest[40], rest[400], trig[200];
	uint64_t newest = 0;  /* the newest an instance holds: others are behind */
	int n;

	(void)a;
	snprintf(t, sizeof(t), "tensors %u", m->tensors);
	snprintf(latest, sizeof(latest), "latest v%" PRIu64, m->latest_version);
	n = snprintf(rest, sizeof(rest), "installed v%" PRIu64, m->installed_version);
	trigger_text(m, trig, sizeof(trig));
	if (m->policy && n > 0 && (size_t)n < sizeof(rest))
		snprintf(rest + n, sizeof(rest) - (size_t)n, "  retries %u (backoff %u ms), "
			 "catch-up %s%s%s%s", m->policy->retries, m->policy->retry_backoff_ms,
			 m->policy->catch_up ? "on" : "off",
			 m->policy->strict_instances ? ", strict instances" : "", trig,
			 m->policy->delta == REFIT__V1__DELTA_MODE__DELTA_OFF ? ", delta off" : "");
	row(0, 4, w, (const char *const[]){m->name, t, latest, rest});
	for (size_t i = 0; i < m->n_instances; i++)
		if (m->instances[i]->installed_version > newest)
			newest = m->instances[i]->installed_version;
	for (size_t i = 0; i < m->n_instances; i++) {
		const Refit__V1__Instance *in = m->instances[i];
		char lay[40], mem[40], held[320] = "", eng[240];

		snprintf(lay, sizeof(lay), "layout %.16s", in->layout_digest);
		snprintf(mem, sizeof(mem), "member %" PRIu64, in->member_id);
		engine_text(in, eng, sizeof(eng));
		if (in->role == REFIT__V1__ROLE__INFER)   /* what it holds, who reads it */
			snprintf(held, sizeof(held), "installed v%" PRIu64 "%s%s%s",
				 in->installed_version,
				 in->invalid ? " INVALID (in place, not published)" :
				 in->installed_version < newest ? " (behind)" : "",
				 in->install == REFIT__V1__INSTALL_MODE__IN_PLACE ? " in place" : "",
				 eng);
		row(2, 5, wi, (const char *const[]){role_name(in->role),
			in->instance[0] ? in->instance : "-", lay, mem, held});
	}
}

/* ---- plan --------------------------------------------------------------- */

void
refitctl_text_plan(const void *resp, const args_t *a)
{
	const Refit__V1__ExplainPlanResponse *r = resp;

	(void)a;
	fputs(r->table, stdout);
}

cJSON *
refitctl_json_plan(const void *resp, const args_t *a)
{
	const Refit__V1__ExplainPlanResponse *r = resp;
	cJSON *o = jnew();

	(void)a;
	jstr(o, "reshard_digest", r->reshard_digest);
	cJSON_AddNumberToObject(o, "reshard_seconds", r->reshard_seconds);
	cJSON_AddNumberToObject(o, "broadcast_seconds", r->broadcast_seconds);
	cJSON_AddNumberToObject(o, "lower_bound_seconds", r->lower_bound_seconds);
	return o;
}

/* ---- refits ------------------------------------------------------------- */

/* Planning (the coordinator's) and the nodes' slices: the largest, the
 * slowest to decode, the mean decode time. */
static void
text_nodes(const Refit__V1__Refit *r)
{
	uint64_t max = 0, sum = 0, most = 0;
	size_t reported = 0, slow = 0;

	if (r->running_after_ms)
		printf("       every slice running %" PRIu64 " ms after the trigger\n",
		       r->running_after_ms);
	if (r->plan_xfers && r->plan_cached)
		printf("       plan of %" PRIu64 " transfers: from the coordinator's cache\n",
		       r->plan_xfers);
	else if (r->plan_xfers)
		printf("       plan of %" PRIu64 " transfers: built by the coordinator in %.1f "
		       "ms\n", r->plan_xfers, r->plan_micros / 1e3);
	for (size_t k = 0; k < r->n_nodes; k++) {
		if (!r->nodes[k]->reported)
			continue;
		reported++;
		sum += r->nodes[k]->decode_micros;
		if (r->nodes[k]->slice_xfers > most)
			most = r->nodes[k]->slice_xfers;
		if (r->nodes[k]->decode_micros >= max) {
			max = r->nodes[k]->decode_micros;
			slow = k;
		}
	}
	if (reported)
		printf("       slices on the nodes: %zu of %zu reported, at most %" PRIu64
		       " transfers; decoded in %.1f ms at most (%s), mean %.1f ms\n", reported,
		       r->n_nodes, most, max / 1e3, r->nodes[slow]->node_id,
		       sum / 1e3 / (double)reported);
}

/* A committed refit: bytes, end-to-end time, the stages' data time. */
static void
text_timing(const Refit__V1__Refit *r)
{
	uint64_t data_us = 0;

	for (size_t k = 0; k < r->n_stages; k++)
		if (r->stages[k]->micros > data_us)
			data_us = r->stages[k]->micros;
	printf("       %" PRIu64 " bytes over the transport; %.1f ms end to end, %.1f ms "
	       "moving data (%zu stages:", r->bytes,
	       (double)(r->finished_unix_ms - r->created_unix_ms), data_us / 1e3, r->n_stages);
	for (size_t k = 0; k < r->n_stages && k < 8; k++)
		printf(" %.1f ms", r->stages[k]->micros / 1e3);
	printf("%s)\n", r->n_stages > 8 ? " ..." : "");
	printf("       transport sessions ready in %.1f ms (slowest node)\n",
	       r->comm_micros / 1e3);
}

void
refitctl_text_refit(const void *resp, const args_t *a)
{
	static const int w[] = {6, 16, 8, 10, 9, 18, 0, 0};
	const Refit__V1__Refit *r = resp;
	char id[24], ver[24], ep[32], dig[24];

	(void)a;
	snprintf(id, sizeof(id), "%" PRIu64, r->id);
	snprintf(ver, sizeof(ver), "v%" PRIu64, r->version);
	snprintf(ep, sizeof(ep), "epoch %" PRIu64, r->epoch);
	/* the failure, last and unbounded, three spaces after the digest */
	snprintf(dig, sizeof(dig), "%.12s%s", r->plan_digest[0] ? r->plan_digest : "-",
		 r->failure[0] ? "  " : "");
	row(0, 8, w, (const char *const[]){id, r->model, ver, state_name(r->state),
		mode_name(r->mode), ep, dig, r->failure});
	if (r->instance && r->instance[0])
		printf("       catch-up of instance \"%s\"\n", r->instance);
	if (r->by_policy)
		printf("       started by the trigger policy (on_ready)\n");
	if (r->delta_wire_bytes || r->dense_wire_bytes)
		printf("       network: %" PRIu64 " bytes dense, %" PRIu64 " bytes delta for %"
		       PRIu64 " dense (base: refit %" PRIu64 ")\n", r->dense_wire_bytes,
		       r->delta_wire_bytes, r->delta_dense_bytes, r->delta_base_refit);
	for (size_t k = 0; k < r->n_skipped; k++)
		printf("       skipped instance \"%s\" (not healthy)\n", r->skipped[k]);
	for (size_t k = 0; k < r->n_attempts; k++)
		printf("       attempt %zu failed: %s\n", k + 1, r->attempts[k]);
	if (r->state == REFIT__V1__REFIT_STATE__COMMITTED && r->finished_unix_ms)
		text_timing(r);
	text_nodes(r);
}

cJSON *
refitctl_json_refit(const void *resp, const args_t *a)
{
	const Refit__V1__Refit *r = resp;
	cJSON *o = jnew(), *arr;

	(void)a;
	ju64(o, "id", r->id);
	jstr(o, "model", r->model);
	ju64(o, "version", r->version);
	ju64(o, "epoch", r->epoch);
	jstr(o, "mode", mode_name(r->mode));
	cJSON_AddBoolToObject(o, "verify", r->verify);
	jstr(o, "state", state_name(r->state));
	jstr(o, "plan_digest", r->plan_digest);
	ju64(o, "bytes", r->bytes);
	ju64(o, "created_unix_ms", r->created_unix_ms);
	ju64(o, "finished_unix_ms", r->finished_unix_ms);
	jstr(o, "failure", r->failure);
	arr = cJSON_AddArrayToObject(o, "stages");
	for (size_t k = 0; k < r->n_stages; k++) {
		cJSON *j = jnew();

		cJSON_AddNumberToObject(j, "stage", r->stages[k]->stage);
		ju64(j, "micros", r->stages[k]->micros);
		ju64(j, "bytes", r->stages[k]->bytes);
		cJSON_AddItemToArray(arr, j);
	}
	ju64(o, "comm_micros", r->comm_micros);
	cJSON_AddNumberToObject(o, "attempt", r->attempt);
	jstr(o, "instance", r->instance);
	cJSON_AddItemToObject(o, "attempts", jstrings(r->attempts, r->n_attempts));
	ju64(o, "running_after_ms", r->running_after_ms);
	ju64(o, "plan_micros", r->plan_micros);
	cJSON_AddBoolToObject(o, "plan_cached", r->plan_cached);
	ju64(o, "plan_xfers", r->plan_xfers);
	cJSON_AddBoolToObject(o, "by_policy", r->by_policy);
	ju64(o, "dense_wire_bytes", r->dense_wire_bytes);
	ju64(o, "delta_wire_bytes", r->delta_wire_bytes);
	ju64(o, "delta_dense_bytes", r->delta_dense_bytes);
	ju64(o, "delta_base_refit", r->delta_base_refit);
	arr = cJSON_AddArrayToObject(o, "nodes");
	for (size_t k = 0; k < r->n_nodes; k++) {
		cJSON *j = jnew();

		jstr(j, "node_id", r->nodes[k]->node_id);
		ju64(j, "plan_micros", r->nodes[k]->plan_micros);
		cJSON_AddBoolToObject(j, "plan_cached", r->nodes[k]->plan_cached);
		ju64(j, "decode_micros", r->nodes[k]->decode_micros);
		ju64(j, "slice_xfers", r->nodes[k]->slice_xfers);
		ju64(j, "slice_micros", r->nodes[k]->slice_micros);
		cJSON_AddBoolToObject(j, "reported", r->nodes[k]->reported);
		cJSON_AddItemToArray(arr, j);
	}
	cJSON_AddItemToObject(o, "skipped", jstrings(r->skipped, r->n_skipped));
	return o;
}

/* The repeated message field `name` of m: its items and their count. */
static void
items(const ProtobufCMessage *m, const char *name, void *const **v, size_t *n)
{
	const ProtobufCFieldDescriptor *f =
		protobuf_c_message_descriptor_get_field_by_name(m->descriptor, name);

	*v = *(void *const *const *)((const char *)m + f->offset);
	*n = *(const size_t *)((const char *)m + f->quantifier_offset);
}

/* the response as text, or as one line of JSON with --json */
void
refitctl_emit(ctl_t *c, const cmd_t *cmd, const void *resp, const args_t *a)
{
	void *const *v;
	cJSON *o;
	size_t n;

	if (cmd->list != NULL) {
		items(resp, cmd->list, &v, &n);
		if (c->json)
			jemit(json_list(cmd->list, v, n, cmd->json, a));
		else
			text_list(v, n, cmd->text, cmd->none, a);
	} else if (!c->json) {
		cmd->text(resp, a);
	} else if ((o = cmd->json(resp, a)) != NULL) {
		jemit(o);
	}
}

/* ---- the other outputs -------------------------------------------------- */

void
refitctl_text_trigger(const void *resp, const args_t *a)
{
	const Refit__V1__TriggerRefitResponse *r = resp;

	(void)a;
	printf("refit %" PRIu64 "%s\n", r->refit_id, r->existing ? " (existing, same key)" : "");
}

cJSON *
refitctl_json_trigger(const void *resp, const args_t *a)
{
	const Refit__V1__TriggerRefitResponse *r = resp;
	cJSON *o;

	if (a->wait)
		return NULL; /* the final refit is printed instead */
	o = jnew();
	ju64(o, "refit_id", r->refit_id);
	cJSON_AddBoolToObject(o, "existing", r->existing);
	return o;
}

void
refitctl_text_unregister(const void *resp, const args_t *a)
{
	(void)resp;
	printf("model %s: instance %s unregistered\n", a->pos[0], a->pos[1]);
}

cJSON *
refitctl_json_unregister(const void *resp, const args_t *a)
{
	cJSON *o = jnew();

	(void)resp;
	jstr(o, "model", a->pos[0]);
	jstr(o, "unregistered", a->pos[1]);
	return o;
}

void
refitctl_text_drain(const void *resp, const args_t *a)
{
	const Refit__V1__DrainMemberResponse *r = resp;

	printf("node %s (member %" PRIu64 ") drained; it leaves at its next heartbeat",
	       a->pos[0], r->member_id);
	for (size_t i = 0; i < r->n_aborted_refits; i++)
		printf("%s%" PRIu64, i ? ", " : "; refits aborted: ", r->aborted_refits[i]);
	printf("\n");
}

cJSON *
refitctl_json_drain(const void *resp, const args_t *a)
{
	const Refit__V1__DrainMemberResponse *r = resp;
	cJSON *o = jnew(), *arr;

	(void)a;
	ju64(o, "member_id", r->member_id);
	arr = cJSON_AddArrayToObject(o, "aborted_refits");
	for (size_t i = 0; i < r->n_aborted_refits; i++)
		cJSON_AddItemToArray(arr, ju64_item(r->aborted_refits[i]));
	return o;
}
