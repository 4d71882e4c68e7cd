/*
 * coord_internal.h - the coordinator's records, shared by the files of
 * daemon/coord/ (the layering is below), and what each file offers the
 * others.  Loop thread only.
 */
#ifndef REFIT_DAEMON_COORD_COORD_INTERNAL_H
#define REFIT_DAEMON_COORD_COORD_INTERNAL_H

#include "common/alloc.h"
#include "common/strbuf.h"
#include "daemon/coord/coord.h"
#include "daemon/coord/coord_blame.h"
#include "daemon/coord/coord_records.h"
#include "daemon/coord/refit_fsm.h"
#include "plan/plan.h"
#include "refit/v1/refit.pb-c.h"

_Static_assert(COORD_ROLE_TRAIN == REFIT__V1__ROLE__TRAIN &&
	       COORD_ROLE_INFER == REFIT__V1__ROLE__INFER, "coord_records.h roles");

/* One node's figures in a refit (from its SliceDone). */
typedef struct refit_node_time {
	uint64_t plan_us, slice_us;
	bool plan_cached;
	uint64_t decode_us, slice_xfers; /* decoding its slice, the slice's transfers */
	coord_blame_report_t blame;      /* a failed slice: what it saw of its peers */
} refit_node_time_t;

#define NODE_STARTED 1u      /* RunSlice answered: the slice runs */
#define NODE_REPORTED 2u     /* SliceDone (or a failed RunSlice) counted */
#define NODE_KEPT 4u         /* its SliceDone: it kept every delta base */

typedef struct coord_slices coord_slices_t;  /* coord_slice.c */

typedef struct refit_rec {
	uint64_t id, version, epoch, created_ms, finished_ms, bytes;
	char *model, *key, *failure;
	int mode;                   /* REFIT__V1__MODE__* */
	refit_fsm_t fsm;            /* its lifecycle: state, attempt, answers pending */
	bool verify;
	bool by_policy;             /* started by the model's trigger policy */
	char plan_digest[SHA256_HEX_LEN];
	uint64_t *nodes;            /* member ids taking part */
	size_t nnodes;
	int64_t corrupt;            /* tests: TriggerRefit.test_corrupt_msg */
	uint32_t nstages;
	uint64_t stage_us[64];      /* slowest node's time to the end of each stage */
	uint64_t stage_bytes[64];   /* bytes moved in each stage, all nodes */
	uint64_t comm_us;           /* slowest node's time to a usable session */
	uint64_t retry_at_ms;       /* QUEUED, RETRY_WAIT: planned again then */
	char **attempts;            /* why earlier attempts failed */
	size_t nattempts;
	char *only;                 /* catch-up: the one instance installed */
	char **skipped;             /* instances left out (not healthy) */
	size_t nskipped;
	char **took;                /* the inference instances the last attempt installs
				       on, and each one's gen then (coord_involved_nodes) */
	uint32_t *took_gen;
	size_t ntook;
	bool run_sent;              /* the last attempt sent RunSlice (it may have
				       written the instances it took) */
	uint8_t nccl_id[128];       /* from the lowest rank's node */
	size_t nccl_id_len;
	uint32_t phase;             /* bumped per round of node calls; stale answers
				       are ignored */
	/* RUNNING: per node of nodes, the slice's start and its report */
	uint8_t *nstate;            /* NODE_STARTED | NODE_REPORTED */
	refit_node_time_t *ntime;
	uint32_t nstarted;
	uint64_t run_deadline_ms;   /* backstop when a node never reports */
	uint64_t model_us;          /* the plan's modelled time (plan_cost), µs */
	uint64_t node_bytes;        /* the plan's busiest node: bytes it sends or receives */
	uint64_t slice_ms;          /* the slices' deadline sent (RunSliceRequest.timeout_ms) */
	uint64_t running_after_ms;  /* trigger -> every slice started */
	uint64_t publish_at_ms;     /* tests (test_hold_publish_ms): the held Publish
				       leaves then (0: none held) */
	coord_slices_t *slices;     /* PREPARING: each node's slice of the plan */
	uint64_t plan_us, plan_xfers; /* the coordinator's planning time (0: cached), transfers */
	bool plan_cached;
	/* delta refits (docs/delta.md): this attempt's tag (0: delta off), the
	 * base offered (0: none), and what the nodes sent */
	uint64_t delta_tag, delta_base;
	uint64_t delta_wire, delta_dense, dense_wire;
	coord_lack_t *delta_lacks;  /* this attempt's, from the nodes' SliceDone */
	size_t ndelta_lacks;
} refit_rec_t;

/* The last plan built for a model, reused while its inputs stay the same. */
typedef struct plan_cache {
	char *model;
	char key[SHA256_HEX_LEN];   /* digest of layouts, members, options */
	plan_t plan;
	double time_s;              /* its modelled time (plan_cost) */
	uint64_t node_bytes;        /* its busiest node's network bytes (one way) */
} plan_cache_t;

typedef struct coord_leader coord_leader_t;

/* A decided Publish (every node committed) some nodes have not
 * acknowledged yet: kept in the state, resent until they do (docs/ha.md). */
typedef struct pub_node {
	char *node_id;
	bool busy;                /* a Publish to it is out */
	uint64_t next_ms;         /* loop time of the next resend */
} pub_node_t;

typedef struct pub_pending {
	uint64_t refit_id, epoch, version;
	char *model;
	bool whole;               /* not a catch-up: moves the model's version */
	bool lost;                /* a node lost the slice: instances stay behind */
	char **insts;             /* the inference instances it installs on */
	size_t ninsts;
	VEC(pub_node_t) nodes;    /* still to acknowledge */
} pub_pending_t;

struct coord {
	const struct coord_backend *store; /* NULL: state lives in memory only */
	void *store_impl;
	coord_leader_t *leader;   /* etcd: the election (NULL: the state file, always leads) */
	bool leading;             /* serves the Coordinator service (else: a standby) */
	struct coord_gate **gates; /* each method's gate (coord.c), one array per table */
	size_t ngates;
	uv_loop_t *loop;
	uv_timer_t lease_timer;
	uint64_t lease_tick_ms;   /* loop time of the last lease tick (stalls) */
	coord_opts_t o;
	uint64_t epoch, next_member;
	VEC(member_t) members;
	VEC(model_t) models;
	VEC(refit_rec_t *) refits;  /* oldest first */
	uint64_t next_refit;
	VEC(plan_cache_t) plans;
	rpc_async_t *rpc;           /* calls to nodes (shared with main) */
	rpc_server_t *srv;          /* its server: is a join token required? */
	uint32_t inflight;          /* async node calls and plans not yet done */
	VEC(pub_pending_t *) pubs;  /* decided Publishes not acknowledged everywhere */
	/* nccl: the unique id of nccl_epoch (len 0: that epoch shrinks the
	 * communicators of the members nccl_members), and whether the nodes'
	 * communicators are sound (no nccl refit failed or aborted since) */
	uint8_t nccl_id[128];
	size_t nccl_id_len;
	uint64_t nccl_epoch;
	uint64_t *nccl_members;
	size_t nccl_nmembers;
	bool nccl_ok;
	bool closing, timer_closed;
	void (*closed_cb)(void *arg);
	void *closed_arg;
};

/*
 * Which file calls which (no cycles): coord.c (membership, setup) and
 * coord_register.c (the layout registry, model views) ->
 * coord_refit_api.c (the refit methods, the timer) -> coord_trigger.c (the
 * trigger policy, making refit records) -> coord_refit.c (the
 * driver of the refit machine, its node calls) -> coord_refit_notes.c
 * (what the driver notes in a record) -> coord_refit_nodes.c,
 * coord_plan.c, coord_metrics.c -> coord_store.c ->
 * coord_state.c; refit_fsm.c is pure, below them all.
 */

/* coord_leader.c: the election over etcd (state_store "etcd"); store is
 * the etcd backend it fences.  Loop thread. */
coord_leader_t *coord_leader_start(coord_t *c, const coord_opts_t *o, void *store,
				   refit_err_t *err);
/* Who leads ("none elected yet" when nobody): for "not the leader: ADDR". */
void coord_leader_addr(coord_leader_t *l, char *buf, size_t n);
/* Stop the thread, revoke the lease, close; c->leader becomes NULL and
 * coord_maybe_free runs once closed. */
void coord_leader_stop(coord_leader_t *l);
/* coord_metrics.c: /metrics refitd_coordinator_leader follows c->leading */
void coord_leader_changed(coord_t *c);

/* coord_state.c: write the state (when a store is configured); REFIT_OK or err */
refit_status_t coord_state_save(coord_t *c, refit_err_t *err);
/* coord_publish.c: a decided Publish, durable and resent until every node
 * acknowledged it.  decided: record r's before its Publish leaves (saves
 * the state; when that fails, nothing is recorded: err); acked / failed: node_id answered the refit's own Publish;
 * tick: resend to the members not acknowledged yet (leader only). */
refit_status_t coord_publish_decided(coord_t *c, refit_rec_t *r, refit_err_t *err);
/* tests (test_hold_publish_ms): hold r's Publish, its decision durable (true: held) */
bool coord_publish_held(coord_t *c, refit_rec_t *r);
/* Call the state's node method on every node of r (coord_refit.c) */
void coord_call_nodes(coord_t *c, refit_rec_t *r, ProtobufCMessage *req, uint64_t skip_epoch);
void coord_publish_acked(coord_t *c, uint64_t refit_id, const char *node_id);
void coord_publish_failed(coord_t *c, uint64_t refit_id, const char *node_id);
void coord_publish_tick(coord_t *c);
/* Free a decided Publish. */
void coord_pub_free(pub_pending_t *p);
/* Read the state into c (models, versions, epoch, ids). */
refit_status_t coord_state_load(coord_t *c, refit_err_t *err);
/* A store operation ("load", "save") took us µs and ended rc:
 * refitd_state_store_seconds{store, op, outcome}. */
void coord_store_observe(coord_t *c, const char *op, refit_status_t rc, uint64_t us);
/* monotonic clock, µs */
uint64_t coord_mono_us(void);
/* A zeroed refit record, counted until coord_refit_free calls
 * coord_refit_uncount (every record is made here, so that a record dropped
 * unfreed shows in the counts). */
refit_rec_t *coord_refit_new(void);
void coord_refit_uncount(void);
/* Records made and not yet freed (*live), and freed (*freed), in this
 * process: /metrics refitd_refit_records_allocated and _freed_total. */
void coord_refit_counts(uint64_t *live, uint64_t *freed);

/* ---- coord_store.c: the records, lookups, persisting, freeing ---- */
void coord_member_fini(member_t *m);
void coord_instance_fini(instance_t *in);
void coord_refit_free(refit_rec_t *r);
/* The bytes r holds (its struct, arrays and strings, without malloc's
 * overhead; a slice being prepared not counted): refitd_refit_records_bytes. */
size_t coord_refit_bytes(const refit_rec_t *r);
/* The refit records kept (c->refits), at most c->o.refit_records (0: 256):
 * the oldest final ones beyond are freed (coord_refit_api.c). */
void coord_refits_trim(coord_t *c);
#define COORD_REFIT_RECORDS 256
model_t *coord_find_model(coord_t *c, const char *name);
instance_t *coord_train_instance(model_t *m);
member_t *coord_find_member(coord_t *c, uint64_t id);
/*
 * Does the caller act for member m (rpc_auth.h, "member")?  With a join
 * token a member's calls must present the session secret of its Join;
 * false: the call was refused PERMISSION_DENIED naming what it tried.
 * Without a join token (loopback only) members are not bound: true.
 */
bool coord_member_acts(coord_t *c, rpc_call_t *call, const char *method, const member_t *m);
/* Are members bound to their sessions (a join token is configured)? */
bool coord_binds(const coord_t *c);
/* Mutual TLS: is node_id the node the caller's certificate names?  No:
 * refused (PERMISSION_DENIED naming both) and false.  Without: true. */
bool coord_cert_is(coord_t *c, rpc_call_t *call, const char *method, const char *node_id);
refit_status_t coord_members_topo(coord_t *c, plan_topo_t *t, refit_err_t *err);
refit_status_t coord_compose_dst(const model_t *m, const char *only,
				 plan_layout_set_t *out, refit_err_t *err);
/*
 * An instance's nodes: every member that registered it is a holder (each
 * node of an instance that spans several registers it).  Holds: member_id
 * is one.  Hold: add it.  Prune: drop those no longer members (member_id
 * moves to a live one); false when none is left.
 */
bool coord_instance_holds(const instance_t *in, uint64_t member_id);
void coord_instance_hold(instance_t *in, uint64_t member_id);
bool coord_instance_prune(coord_t *c, instance_t *in);
/* The first rank of in that no member holding in (a holder) serves, or -1:
 * the instance is whole (every node of it is a member and registered it). */
int32_t coord_instance_unheld(coord_t *c, const instance_t *in);
/* An inference instance holds less than m's newest installed version, or
 * was invalidated (in place): a catch-up refit is due once it is whole. */
bool coord_instance_behind(const model_t *m, const instance_t *in);
/* wall clock, ms since the epoch */
uint64_t coord_now_ms(void);
/* Persist the state now (failures are logged). */
void coord_save(coord_t *c);
/*
 * Persist a change a caller is about to be told about: REFIT_OK once it is
 * durable (or no state file is configured); otherwise the caller undoes the
 * change and refuses it (err says why).
 */
refit_status_t coord_save_durable(coord_t *c, const char *what, refit_err_t *err);
/* Free c and everything it holds (nothing may be in flight). */
void coord_free(coord_t *c);
/* Free c once closing, its timer closed and nothing in flight; then its
 * closed callback.  Every async completion calls it. */
void coord_maybe_free(coord_t *c);

/* an instance's catch-up refit waits this long for its other nodes */
#define CATCH_UP_DELAY_MS 500

/* Planning off the loop (coord_plan.c): a job with its own copies of the
 * inputs; done runs on the loop when the plan is built. */
typedef struct planjob {
	uv_work_t w;
	coord_t *c;
	char *model;
	char *only;                 /* catch-up: the one inference instance */
	char key[SHA256_HEX_LEN];   /* plan_key of the inputs, taken at queue time */
	plan_layout_set_t src, dst;
	plan_topo_t topo;
	plan_opts_t opts;
	bool explain;               /* also cost it and build/cost broadcast */
	plan_t plan, bplan;
	plan_cost_t cost, bcost;
	refit_err_t err;
	refit_status_t rc;
	void (*done)(struct planjob *j);
	uint64_t refit_id;
	rpc_call_t *call;           /* held until done answers it */
	uint64_t plan_us;           /* plan_build's time */
	uint64_t node_bytes;        /* a refit's: the busiest node's network bytes */
} planjob_t;

/* coord_plan.c: a refit's plan options (the same when planning and in RunSlice) */
void coord_plan_opts(const coord_t *c, int mode, plan_opts_t *o);
/* The digest of everything a plan of m depends on (layouts, members, options). */
void coord_plan_key(coord_t *c, const model_t *m, const char *only, const plan_opts_t *o,
		    char hex[SHA256_HEX_LEN]);
/* coord_slice.c: every node's slice of p (whole: every node gets all of
 * p, for grouped transports), kept with r (replacing any) */
void coord_slices_make(coord_t *c, refit_rec_t *r, const plan_t *p, bool whole);
/* A RunSliceRequest (anything else is left alone) gets member's slice of r. */
void coord_slice_attach(const refit_rec_t *r, uint64_t member_id, ProtobufCMessage *req);
void coord_slices_free(refit_rec_t *r);
refit_status_t coord_plan_async(coord_t *c, model_t *m, const char *only,
				const plan_opts_t *o, bool explain, void (*done)(planjob_t *j),
				uint64_t refit_id, rpc_call_t *call, refit_err_t *err);
/* The model's last plan (NULL: none yet). */
plan_cache_t *coord_plan_cached(coord_t *c, const char *model);
/* Keep j's plan as the model's last plan (j gives it up); returns it. */
const plan_t *coord_plan_keep(coord_t *c, planjob_t *j);

/* RUNNING backstop: a node's slice_timeout_ms comes first */
#define SLICE_RUN_MS 3600000

/* ---- coord_register.c: RegisterLayout, UnregisterLayout, SetRefitPolicy,
 * WeightsReady, ListModels, GetModel, ExplainPlan (coord_new adds them) */
extern const rpc_method_cfg_t coord_register_methods[];
extern const size_t coord_register_nmethods;
/* A heartbeat of member mb: what the engines reading the instances it holds
 * say (HeartbeatRequest.engines) into their records. */
void coord_engines_note(coord_t *c, const member_t *mb,
			const Refit__V1__HeartbeatRequest *rq);

/* ---- coord_refit_api.c: the refit methods and the timer ---- */
extern const rpc_method_cfg_t coord_refit_methods[];
extern const size_t coord_refit_nmethods;
/* Abort the refits in flight that use member id; their ids into *ids. */
size_t coord_refits_abort_member(coord_t *c, uint64_t id, const char *why, uint64_t *ids,
				 size_t max);
/* Timer: retries and catch-up refits that are due. */
void coord_refits_tick(coord_t *c);

/* ---- coord_trigger.c: the trigger policy, refit records made ---- */
/* A new refit of m to its latest version, PLANNING, added to c's records
 * (only: a catch-up of that instance).  The caller persists and plans it. */
refit_rec_t *coord_refit_add(coord_t *c, const model_t *m, const char *only);
/* WeightsReady of version for m (durable already): with on_ready it is the
 * pending version, started now when due, else saved to wait. */
void coord_trigger_ready(coord_t *c, model_t *m, uint64_t version);
/* Timer: start the pending refits that are due.  True when one started. */
bool coord_trigger_tick(coord_t *c, uint64_t now);

/* ---- coord_refit.c: the driver of the refit state machine, its node calls */
/* A new epoch (refits in flight of the old one fail). */
void coord_bump_epoch(coord_t *c, const char *why);
/* membership changed (why names the member and the cause): refits in flight fail */
void coord_refits_on_epoch(coord_t *c, uint64_t old_epoch, const char *why);
/* r needs poisoned member m: it fails now, final (kind FAIL, or
 * EPOCH_CHANGED when m leaves during it), naming what m said. */
void coord_refit_fail_poisoned(coord_t *c, refit_rec_t *r, const member_t *m,
			       refit_fsm_event_kind_t kind);
/* Poisoned member m leaves: the refits of the epoch that use it fail so. */
void coord_refits_on_poisoned_leave(coord_t *c, const member_t *m);
/* Member m said it is poisoned (why; "" or NULL: it did not): kept with
 * it and logged at ERROR once; every refit needing it fails at once. */
void coord_member_poisoned(coord_t *c, member_t *m, const char *why);
/* The refit of that id among c's records (NULL: none). */
refit_rec_t *coord_find_refit(coord_t *c, uint64_t id);
/* r ended (committed, failed or aborted). */
bool coord_refit_is_final(const refit_rec_t *r);
/* RUNNING, FAILING*: the round of RunSlice answers and slice reports. */
bool coord_refit_runs_slices(const refit_rec_t *r);
/* The name of r's state as clients see it. */
const char *coord_refit_public_name(const refit_rec_t *r);
/* Feed the event kind (no payload, no message) to r's machine. */
void coord_refit_on(coord_t *c, refit_rec_t *r, refit_fsm_event_kind_t kind);
/* An event with a failure message (cut on a character boundary). */
void coord_refit_eventf(coord_t *c, refit_rec_t *r, refit_fsm_event_kind_t kind,
			const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* PLAN: choose r's instances, then its plan (cached, or built off the loop). */
void coord_refit_plan(coord_t *c, refit_rec_t *r);
/* The index of member id among r's nodes, or SIZE_MAX. */
size_t coord_refit_node_index(const refit_rec_t *r, uint64_t id);
/* Node k's slice ended (SliceDone, or a failed RunSlice): counted once. */
void coord_refit_slice_result(coord_t *c, refit_rec_t *r, size_t k, const char *node,
			      refit_status_t st, const char *msg,
			      const Refit__V1__RunSliceResponse *rs, bool poisoned);
/* Node k's slice runs (its RunSlice was answered, or it already reported). */
void coord_refit_mark_started(refit_rec_t *r, size_t k);

/* ---- coord_refit_notes.c: what the driver notes in a refit's record (no
 * events, no node calls) */
/* A node call's context: the refit, its member, the round it was made in. */
typedef struct nctx {
	coord_t *c;
	uint64_t refit_id, member_id;
	uint32_t phase;
} nctx_t;
/* A node answered: its refit if the answer is still wanted, and *m. */
refit_rec_t *coord_refit_answer_of(const nctx_t *x, member_t **m);
/* RETRY: the attempt that ended (was) noted; the next planned in wait_ms. */
void coord_refit_note_retry(refit_rec_t *r, const refit_fsm_t *was, uint64_t wait_ms);
/* END: a final state; a committed refit moves the model's installed version. */
void coord_refit_note_end(coord_t *c, refit_rec_t *r);
/* Node k's slice succeeded: its SliceDone's bytes and times added to r. */
void coord_refit_note_slice(refit_rec_t *r, size_t k, const Refit__V1__RunSliceResponse *rs);
/* Metrics after every change of r's state (p: a plan just taken), the
 * state file after every change clients can see. */
void coord_refit_settle(coord_t *c, refit_rec_t *r, const refit_fsm_t *was, const plan_t *p);
/* Does ev end the slices of a refit that failed with symptoms only? */
bool coord_refit_ends_on_symptoms(const refit_fsm_t *was, const refit_fsm_event_t *ev);
/* Name the broken link from every node's report as r's failure. */
void coord_refit_name_link(coord_t *c, refit_rec_t *r);
/* A new round of node calls (or none): answers of the last one are stale. */
bool coord_refit_new_round(refit_fsm_state_t from, refit_fsm_state_t to);
/* The slices' deadline (RunSliceRequest.timeout_ms), logged. */
uint64_t coord_refit_slice_deadline_ms(const coord_t *c, const refit_rec_t *r);
/* Node k's slice failed (st, msg): keep what it saw of its peers (rs). */
void coord_refit_blame_keep(coord_t *c, refit_rec_t *r, size_t k, refit_status_t st,
			    const char *msg, const Refit__V1__RunSliceResponse *rs);

/* ---- coord_refit_nodes.c: who takes part in a refit, what nodes are told */
/* r's nodes: the members owning a rank that sends or receives in p (or
 * holds inference memory of md's instances taking part). */
void coord_involved_nodes(coord_t *c, const plan_t *p, const model_t *md, refit_rec_t *r);
/*
 * An attempt of r ended: committed (every node published), each instance it
 * installed on (coord_involved_nodes noted them) holds r's version and is
 * valid; not committed, those in place are invalid once its RunSlice went
 * out (a node may have written them; never published).  The model's
 * installed version moves on a commit of all its instances (not a
 * catch-up's).  The caller saves (the refit's change of state is saved).
 */
void coord_refit_instances_end(coord_t *c, refit_rec_t *r, bool committed);
/*
 * Which inference instances r leaves out (in->skip, r->skipped): those not
 * healthy now (a rank of theirs has no member, or its member has not
 * registered them since it joined).  A strict model's refit fails instead;
 * so does one left with none: false, the failure in why (the caller feeds
 * it to the machine).  Loop thread only.
 */
bool coord_refit_choose_instances(coord_t *c, model_t *m, refit_rec_t *r, strbuf_t *why);
/* coord_delta.c: RunSlice's delta tag, base, the nodes holding it and the
 * messages they lack into rq (coord_delta_offer_free frees what it added);
 * node k's SliceDone (rs) noted; a committed refit's bases become the
 * model's. */
void coord_delta_offer(coord_t *c, refit_rec_t *r, model_t *m,
		       Refit__V1__RunSliceRequest *rq);
void coord_delta_offer_free(Refit__V1__RunSliceRequest *rq);
void coord_delta_note(refit_rec_t *r, size_t k, const Refit__V1__RunSliceResponse *rs);
void coord_delta_committed(coord_t *c, refit_rec_t *r);
/* Node k of r evicted received bases of the models rs names (its slice
 * failed or not): it holds their bases no longer, so it is no longer among
 * their delta nodes (their next refit runs dense with it). */
void coord_delta_evicted(coord_t *c, const refit_rec_t *r, size_t k,
			 const Refit__V1__RunSliceResponse *rs);
/* coord_store.c: a list of delta lacks freed and emptied. */
void coord_lacks_free(coord_lack_t **v, size_t *n);
/* The members' transports: whether any uses nccl, one that does not, and
 * the member holding the lowest rank. */
void coord_scan_members(coord_t *c, bool *nccl, const member_t **other, const member_t **low);
/* r's unique id (or none: shrink) becomes its epoch's, with the members of now. */
void coord_nccl_remember(coord_t *c, const refit_rec_t *r);
/* Does r's epoch need a new unique id (false: r has the epoch's, or shrinks)? */
bool coord_nccl_need_id(coord_t *c, refit_rec_t *r);
/* Another nccl refit between planning and its end (they run one at a time). */
bool coord_nccl_busy(const coord_t *c, const refit_rec_t *r);
/* The current members as PrepareEpoch lists them, in *mv (coord_members_msg_free). */
Refit__V1__Member **coord_members_msg(coord_t *c, Refit__V1__Member **mv);
/* PrepareEpoch: every member's data-plane token of epoch (made once per
 * epoch), and a request carrying member m's own (for m alone). */
void coord_data_tokens(coord_t *c, uint64_t epoch);
void coord_prepare_attach(const member_t *m, ProtobufCMessage *req);
void coord_members_msg_free(Refit__V1__Member *mv, Refit__V1__Member **mp, size_t n);
/* RunSlice's request for r's attempt but its deadline and slices: the refit,
 * its plan, o's sizes, m's instances taking part (*iv; coord_free_layouts). */
void coord_run_request(const coord_t *c, refit_rec_t *r, const model_t *m,
		       const plan_opts_t *o, Refit__V1__RunSliceRequest *rq,
		       Refit__V1__InstanceLayouts **iv);
/* The RunSlice instances of r, trainer first (*n of them, in *iv; coord_free_layouts). */
Refit__V1__InstanceLayouts **coord_instance_layouts(const refit_rec_t *r, const model_t *m,
						    Refit__V1__InstanceLayouts **iv, size_t *n);
void coord_free_layouts(Refit__V1__InstanceLayouts *iv, Refit__V1__InstanceLayouts **ip,
			size_t n);
/* metrics (coord_metrics.c): after every change of r's state; p: its plan, when taken */
void coord_metrics_refit(coord_t *c, const refit_rec_t *r, const plan_t *p);

#endif
