/*
 * node_internal.h - the node daemon's state, shared by its files.  Loop
 * thread only, except where a field says otherwise.
 *
 * Files, each calling only those after it (no cycles; tests/check-layers.py
 * checks it): node.c (membership, PrepareEpoch, setup, teardown) ->
 * node_run.c (the Node service's RunSlice, Commit, Publish, Abort) ->
 * node_report.c (slice reports: SliceDone, resent), node_local.c (the
 * Local service, waiters) -> node_client.c (librefit clients: lookup, drop,
 * registering again), node_mem.c (the memory socket, clients' memory
 * checked), node_slice.c (a RunSlice's slice, decoded and checked) and
 * slice.c (the executor).  The
 * two things a lower file must tell a higher one go up through
 * node_hooks_t, which node.c fills.
 */
#ifndef REFIT_DAEMON_NODE_NODE_INTERNAL_H
#define REFIT_DAEMON_NODE_NODE_INTERNAL_H

#include <stdatomic.h>

#include "common/alloc.h"
#include "dataplane/conv_exec.h"
#include "daemon/node/node.h"
#include "daemon/node/delta_base.h"
#include "daemon/node/gdelta_base.h"
#include "daemon/node/slice.h"
#include "daemon/transport/transport.h"
#include "plan/convert.h"
#include "plan/plan.h"
#include "refit/v1/refit.pb-c.h"
#include "rpc/rpc_auth.h"

/* One shared-memory segment a client named, mapped here. */
typedef struct seg {
	char *name;
	uint8_t *base;
	uint64_t size;
	bool cuda;              /* a CUDA IPC mapping, not shared memory */
	/* cuda, until node_mem_open maps it (a pool thread: no CUDA call on the
	 * loop): the handle and what the client said of it */
	uint8_t *ipc;
	size_t ipc_len;
	int32_t rank, device;
	uint8_t uuid[16];
	bool has_uuid;
	uint32_t tensor;        /* the first piece in it (errors name it) */
} seg_t;

/* Memory of one piece of one tensor on one rank. */
typedef struct piece_mem {
	uint32_t tensor;        /* index into the client's layouts */
	int32_t rank, piece;
	uint8_t *base[2];       /* copy 0, copy 1 (double buffer) */
	int32_t cseg;           /* its CUDA segment (c->segs), -1: shared memory;
				   until node_mem_resolve, base[k] holds offsets */
	int ndim;
	int64_t shape[PLAN_MAX_DIMS];
	int64_t stride[PLAN_MAX_DIMS];
	uint32_t elem;
} piece_mem_t;

#define NODE_ENGINE_STR 65  /* an engine's names: 64 bytes and the NUL */
#define NODE_READY_EVENTS_MAX 16 /* CUDA events one WeightsReady may carry */

typedef struct client {
	uint64_t id;
	char *model, *instance;
	int role;               /* REFIT__V1__ROLE__* */
	int install;            /* REFIT__V1__INSTALL_MODE__* */
	int pid, pidfd;         /* the registering process (SO_PEERCRED) */
	uint32_t uid;           /* its user */
	uv_poll_t pidpoll;
	bool polling;
	plan_layout_set_t layouts;
	char digest[SHA256_HEX_LEN];
	/*
	 * The RegisterLayout request forwarded to the coordinator (the
	 * client's layouts as it sent them), packed with member_id 0: sent
	 * again when the node joins again, with no struct round trip.
	 */
	uint8_t *reg;
	size_t reg_len;
	VEC(seg_t) segs;
	VEC(piece_mem_t) mem;
	/* state */
	uint64_t version;       /* trainer: ready version; inference: installed */
	uint32_t active;        /* double buffer: the copy holding version */
	bool valid;             /* in place: false while being written */
	bool readable;          /* trainer: buffers hold `version` */
	uint32_t reading;       /* trainer: slices reading now */
	/* trainer, GPU memory: the CUDA IPC events its last WeightsReady gave
	 * (recorded after its writes; a slice's streams wait for them) */
	xport_event_t *events;
	size_t nevents;         /* at most NODE_READY_EVENTS_MAX */
	uint32_t busy;          /* slices using this memory */
	/* some of the node's ranks only (node_group.c): registered with the
	 * coordinator once its group holds them all (forwarded) */
	bool partial, forwarded;
	char ldigest[SHA256_HEX_LEN]; /* its layouts' digest (conv_layouts_digest) */
	int32_t serving;        /* double buffer: the copy the reader serves, -1 none */
	/* inference: the engine reading it (Local.Describe; "" none) and the
	 * version it serves (Local.Serve), told the coordinator at heartbeats */
	char engine_fw[NODE_ENGINE_STR], engine_ver[NODE_ENGINE_STR];
	char engine_pause[NODE_ENGINE_STR];
	uint64_t served_version;
	char *failure;
	bool dead;              /* unregistered or exited: freed when not busy */
	const xport_ops_t *xo;  /* to close CUDA IPC mappings */
	xport_t *x;
} client_t;

/* A held WaitVersion or BeginWrite call. */
typedef struct waiter {
	rpc_call_t *call;
	uint64_t client_id, min_version;
	int64_t deadline_ms;
	bool begin_write;
} waiter_t;

typedef struct epoch_member {
	char *node_id, *data_ep;
	int32_t *ranks;
	char **domains;
	size_t nranks;
	uint8_t verifier[32];   /* SHA-256 of its data-plane token */
} epoch_member_t;

/* A slice that ran and waits for the coordinator's Commit, then Publish. */
typedef struct prepared {
	uint64_t refit_id, version;
	char *model;
	uint64_t *clients;
	size_t nclients;
	bool committed;         /* Commit came: only Publish shows it to clients */
} prepared_t;

/* A refit aborted here (Abort), remembered so a RunSlice of it arriving
 * after the Abort is refused at once. */
typedef struct aborted {
	uint64_t refit_id, epoch;
	uint32_t attempt;
} aborted_t;

#define NODE_ABORTED_MAX 64
#define NODE_PUBLISHED_MAX 64

/* tests (test_hold_run_ms): a RunSlice held until its Abort or a deadline */
typedef struct held_run {
	rpc_call_t *call;
	const ProtobufCMessage *msg;
	uint64_t refit_id;
	int64_t until_ms;
} held_run_t;

/* One client a slice reads or writes. */
typedef struct jclient {
	client_t *c;
	int32_t *tmap;   /* plan tensor -> client tensor (-1: none) */
	uint32_t copy;   /* the copy this slice reads or writes */
} jclient_t;

/* A node's slice of a refit, run off the loop (node_run.c); its end is
 * reported (node_report.c). */
typedef struct slice_job slice_job_t;
struct slice_job {
	uv_work_t w;
	node_t *n;
	uint64_t refit_id, epoch, version;
	uint32_t attempt;
	plan_t plan;            /* this node's slice of the plan (node_slice.c) */
	uint64_t plan_xfers;    /* transfers in the whole plan */
	uint64_t slice_us;      /* decoding and checking the slice */
	plan_conv_t cv;         /* conversions: the pair the plan moves */
	dp_conv_t *cx;          /* conversions: the clients' memory, wrapped */
	const dp_dev_ops_t *dev; /* the slice session's device while it is open (NULL: host) */
	bool converts;
	char *model;
	plan_opts_t opts;
	bool verify;
	int64_t corrupt;
	plan_layout_set_t src, dst;
	plan_topo_t topo;
	slice_node_t *nodes;
	size_t nnodes, self;
	slice_peer_t *peers;    /* per node: what the failed slice saw of it */
	VEC(jclient_t) cl[2];   /* [0] trainers, [1] inference clients */
	VEC(xport_event_t) events; /* the trainers' ready events (copied at setup) */
	atomic_int abort;
	char abort_why[256];
	int64_t deadline_ms;
	slice_stats_t st;
	uint64_t delta_tag, delta_base; /* RunSliceRequest's (slice_delta.h) */
	bool *delta_ok;         /* per node: in its delta_nodes */
	uint32_t **delta_skip;  /* per node: its delta_lacks from this node, sorted */
	size_t *delta_nskip;
	refit_err_t err;
	refit_status_t rc;
};

/*
 * Calls up the layers, set by node.c in node_new before anything can call
 * them.  A lower file holds a reference to the node it cannot free (a
 * closing handle, a call in flight, a slice), and node_local.c sees a client
 * go before node_run.c's slices do: a table rather than direct calls keeps
 * each file calling only those below it (see the header comment).
 */
typedef struct node_hooks {
	/* node.c: free the node if it is closing and nothing holds it */
	void (*maybe_free)(node_t *n);
	/* node_run.c: a librefit client went away: abort the slices using it */
	void (*client_gone)(node_t *n, uint64_t client_id, const char *why);
	/* node.c: a call to the coordinator failed with st/msg: follow a
	 * standby's "not the leader: ADDR", or go to the next (node_follow) */
	bool (*follow)(node_t *n, refit_status_t st, const char *msg);
} node_hooks_t;

/* A slice's end, sent to the coordinator (SliceDone) until acknowledged. */
typedef struct slice_report {
	struct node *n;
	uint64_t refit_id, epoch;
	uint8_t *req;           /* the packed SliceDoneRequest */
	size_t len;
	uint32_t tries;
	uint64_t next_ms, give_up_ms;
	bool sending;
} slice_report_t;

struct node {
	const node_hooks_t *hooks;    /* calls up the layers (node.c) */
	uv_loop_t *loop;
	uv_timer_t beat, sweep;
	char *coordinator;          /* the coordinator called now: one of coords */
	char **coords;              /* the configured coordinators (docs/ha.md) */
	size_t ncoords, coord_i;    /* ... how many, and coordinator's index */
	size_t coord_dead;          /* the last found unreachable (ncoords: none) */
	char *node_id, *advertise, *domain;
	int32_t *ranks;
	size_t nranks;
	rpc_client_opts_t client;
	uint64_t member_id, epoch;    /* membership epoch from the coordinator */
	uint64_t prepared_epoch;      /* last epoch PrepareEpoch set up */
	uint8_t token[XPORT_TOKEN_MAX];
	size_t token_len;
	VEC(epoch_member_t) world;    /* members of the prepared epoch */
	bool busy;                    /* a Join or Heartbeat is in flight */
	bool drained;                 /* an operator drained us: stay out */
	char *poisoned;               /* NULL, or why the transport runs no more
					 refits here (node_poisoned) */
	bool poison_dead;             /* poisoned by a sticky CUDA error: exit */
	void (*poisoned_exit)(void *arg); /* node_opts_t.poisoned_exit */
	void *poisoned_exit_arg;
	bool exit_poisoned;           /* node_opts_t.exit_poisoned */
	bool exiting;                 /* poisoned_exit was called */
	uint32_t inflight;
	bool closing;
	int handles;                  /* uv handles not yet closed */
	/* data plane */
	const xport_ops_t *xo;
	xport_t *x;
	struct delta_store *delta;    /* delta bases (delta_base.h); NULL: none kept */
	struct gdelta_store *gdelta;  /* nccl: bases on the devices (gdelta_base.h) */
	dp_pool_t *pool;              /* buffers of the tcp slices (dataplane/pool.h) */
	char *data_ep;                /* advertised data endpoint */
	rpc_server_t *local;          /* the librefit socket */
	rpc_server_t *srv;            /* the Node service's */
	rpc_refusals_t data_refusals; /* refused data connections' log limiter */
	char session[65];             /* this process's session secret (hex) */
	char *local_path;
	uint64_t slice_timeout_ms, test_msg_delay_ms;  /* slice_timeout_ms 0: the coordinator's */
	uint64_t connect_timeout_ms;
	uint64_t test_fail_commit, test_hold_run_ms, ncommits;
	uint64_t test_lose_publish, npublishes, lose_refit;
	/* ring of the refits published here (id and epoch: a coordinator
	 * restarted without its state counts ids from 1 again, its epochs go
	 * on): a Publish resent for one of them is acknowledged again, never
	 * installed twice */
	struct { uint64_t refit_id, epoch; } published[NODE_PUBLISHED_MAX];
	size_t npublished;
	aborted_t aborted[NODE_ABORTED_MAX];  /* ring, the epoch's aborted refits */
	size_t naborted;                      /* entries written (mod the size) */
	VEC(held_run_t) held;                 /* tests: RunSlice calls held back */
	VEC(client_t *) clients;
	int64_t pids_checked_ms;              /* sweep: clients' pids last checked */
	uint64_t next_client;
	VEC(waiter_t) waiters;
	VEC(struct inst_waiter *) iwaiters;  /* WaitInstalled calls (node_engine.c) */
	VEC(prepared_t) prepared;
	VEC(slice_job_t *) jobs;      /* slices running */
	rpc_async_t *rpc;             /* calls to the coordinator (shared with main) */
	VEC(slice_report_t *) reports;/* SliceDone not yet acknowledged */
	/* the memory socket: clients pass sealed memfds (SCM_RIGHTS) */
	int mem_fd;                   /* listening, -1: none */
	uv_poll_t mem_poll;
	char *mem_path;
	VEC(struct memconn *) memconns;
};

/* Free the node if it is closing and nothing holds it (node.c, by its hook:
 * any file may call it). */
static inline void
node_maybe_free(node_t *n)
{
	n->hooks->maybe_free(n);
}

/* node_local.c */
refit_status_t node_local_start(node_t *n, const node_opts_t *o, refit_err_t *err);
void node_local_stop(node_t *n);
void node_local_close(node_t *n);   /* close the memory socket's handles */
/* node_install.c: Commit and Publish (the Node service's table is in
 * node_run.c); a call for another epoch than the one prepared fails
 * STALE_EPOCH (true when it did); the slices waiting for Publish. */
bool node_epoch_refused(node_t *n, rpc_call_t *call, const char *method, uint64_t refit_id,
			uint64_t epoch);
prepared_t *node_find_prepared(node_t *n, uint64_t id);
void node_drop_prepared(node_t *n, prepared_t *p);
void node_h_commit(void *ctx, rpc_call_t *call, const ProtobufCMessage *msg);
void node_h_publish(void *ctx, rpc_call_t *call, const ProtobufCMessage *msg);

/* node_client.c: joined (again): register every client's layout and ready
 * version with the coordinator, which may not know them (it restarted). */
void node_local_rejoined(node_t *n);
client_t *node_client(node_t *n, uint64_t id);
/* Drop a client (its memory goes when no slice uses it). */
void node_client_drop(node_t *n, client_t *c, const char *why);
void node_client_release(node_t *n, client_t *c);
/* Is the caller the process that registered c (SO_PEERCRED)?  If not, the
 * call is refused PERMISSION_DENIED naming the client, and false. */
bool node_client_owned(rpc_call_t *call, const client_t *c);
/* Free a client not in n->clients (its mappings unmapped; its CUDA IPC
 * mappings closed on a pool thread and c freed after, inline when closing). */
void node_client_free(node_t *n, client_t *c);
/* node_mem.c: the memory socket <local_socket>.mem, listening; closing its
 * handles; a registration's memory mapped into c and checked against its
 * layouts (the error names the tensor, rank and segment). */
refit_status_t node_mem_listen(node_t *n, const char *local_socket, refit_err_t *err);
void node_mem_close(node_t *n);
/* The registration's CUDA IPC handles opened (any thread: a pool thread
 * runs it, the client is not shared yet); on failure none stays open. */
refit_status_t node_mem_open(node_t *n, client_t *c, refit_err_t *err);
/* Whether c has CUDA handles to open; after node_mem_open: the pieces'
 * addresses (loop thread). */
bool node_mem_pending(const client_t *c);
void node_mem_resolve(client_t *c);
refit_status_t node_mem_check(node_t *n, client_t *c,
			      const Refit__V1__LocalRegisterRequest *rq, refit_err_t *err);
/* The memory of (client tensor, rank, piece), or NULL. */
const piece_mem_t *node_client_piece(const client_t *c, uint32_t tensor, int32_t rank,
				     int32_t piece);
/* node_group.c: the clients holding some of the node's ranks of one trainer
 * or instance */
bool node_group_same(const client_t *a, const client_t *b);
refit_status_t node_group_check(node_t *n, const client_t *c, refit_err_t *err);
bool node_group_complete(node_t *n, const client_t *c);
void node_group_forwarded(node_t *n, client_t *c, const char *digest, bool on);
bool node_group_ready(node_t *n, const client_t *c, uint64_t version);
bool node_group_first(node_t *n, const client_t *c);
/* Answer the waiters that can be answered now (and the ones past deadline). */
void node_waiters_sweep(node_t *n);
void node_waiters_fail_all(node_t *n, const char *why);

/* node_run.c */
extern const rpc_method_cfg_t node_run_methods[];
extern const size_t node_run_nmethods;
void node_run_abort_all(node_t *n, const char *why);
/* tests: run the held RunSlice calls of refit_id (0: those past their
 * deadline; all when closing). */
void node_run_held_tick(node_t *n, uint64_t refit_id);
/* The client died: abort slices using it (node_hooks_t.client_gone). */
void node_run_client_gone(node_t *n, uint64_t client_id, const char *why);
/* node_report.c: the slice of j ended (ok or not): SliceDone, resent
 * until the coordinator acknowledges it. */
void node_report_queue(node_t *n, slice_job_t *j, bool ok);
/* Resend the slice reports that are due (the sweep timer). */
void node_reports_tick(node_t *n);
/* Drop the reports not in flight (shutting down). */
void node_reports_drop(node_t *n);

/*
 * node_engine.c: engines and trainers asking about the model's instances:
 * Local.Describe (an engine names itself), Local.WaitInstalled (a trainer
 * waits until every instance holds its version, the node asking the
 * coordinator's GetInstalled), and what a heartbeat tells the coordinator
 * of the engines here.  Calls nothing in the files above it.
 */
extern const rpc_method_cfg_t node_engine_methods[];
extern const size_t node_engine_nmethods;
/* The engines of this node's inference instances into rq (its arrays in
 * *keep, freed by node_engine_beat_free after the call is packed). */
typedef struct node_engine_beat {
	Refit__V1__InstanceEngine *ev, **ep;
	Refit__V1__EngineInfo *iv;
} node_engine_beat_t;
void node_engine_beat(node_t *n, Refit__V1__HeartbeatRequest *rq, node_engine_beat_t *keep);
void node_engine_beat_free(node_engine_beat_t *keep);
/* The sweep: ask the coordinator for the waiters due, answer those past
 * their deadline; fail_all: shutting down. */
void node_engine_sweep(node_t *n);
void node_engine_fail_all(node_t *n, const char *why);
void node_engine_stop(node_t *n);

/* node_slice.c: the slice of the plan in rq, decoded and checked against
 * this node's ranks, the epoch's topology (topo) and the plan's tensor
 * table (dst: the composed destination layouts, converted), into *out
 * (plan_fini), with options o.  The error names the bad record. */
#define NODE_SLICE_MAX_STAGES 65536u
/* Is rank r one of this node's? */
bool node_serves(const node_t *n, int32_t r);
refit_status_t node_slice_take(const node_t *n, const Refit__V1__RunSliceRequest *rq,
			       const plan_layout_set_t *dst, const plan_topo_t *topo,
			       const plan_opts_t *o, plan_t *out, refit_err_t *err);

/*
 * node_report.c: why this node runs no more refits until refitd restarts (its
 * transport poisoned it: nccl's GPU work that never ended, its memory
 * kept), or NULL.  Noticed here, from the transport, and logged at ERROR
 * once; from then on health answers NOT_SERVING and every Join, Heartbeat
 * and SliceDone tells the coordinator.
 */
const char *node_poisoned(node_t *n);
/* node_run.c: staging reserved by the running slices (metrics) */
uint64_t node_staging_reserved(const node_t *n);
/* node_delta.c (docs/delta.md): RunSlice's base and the nodes holding it
 * into the job, the job's delta into its slice's configuration, a finished
 * slice's figures into /metrics, the bases held (limit: their bound,
 * delta_base_bytes). */
void node_delta_job(slice_job_t *j, const Refit__V1__RunSliceRequest *rq);
void node_delta_job_free(slice_job_t *j);
/* The slice's lacks (slice_stats_t) as RunSliceResponse.delta_lacks, one
 * per peer (freed by node_delta_lacks_free). */
Refit__V1__DeltaLack **node_delta_lacks(const slice_job_t *j, const char *self, size_t *n);
void node_delta_lacks_free(Refit__V1__DeltaLack **v, size_t n);
/* The models that lost received bases to eviction since the last report,
 * both stores (RunSliceResponse.delta_evicted; node_delta_evicted_free). */
char **node_delta_evicted(node_t *n, size_t *count);
void node_delta_evicted_free(char **v, size_t count);
void node_delta_cfg(const slice_job_t *j, slice_cfg_t *sc);
void node_delta_metrics(const slice_job_t *j);
/* The bases on the devices (nccl): each rank's share is a quarter of its
 * staging arena, at most delta_base_bytes (NULL: delta_base_bytes 0). */
struct gdelta_store *node_gdelta_store(const node_opts_t *o);
/* Bytes of bases held (limit: their bound) in the host store or on the
 * devices (gpu); bases evicted from either. */
uint64_t node_delta_base_bytes(const node_t *n, bool limit, bool gpu);
uint64_t node_delta_evictions(const node_t *n, bool gpu);

/* node.c: a call to the coordinator failed (st, msg): follow a standby's
 * "not the leader: ADDR", or try the next coordinator when it is unreachable
 * (several configured: docs/ha.md).  True when n->coordinator changed. */
bool node_follow(node_t *n, refit_status_t st, const char *msg);

#endif
