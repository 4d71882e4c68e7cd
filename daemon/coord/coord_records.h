/*
 * coord_records.h - the coordinator's records of members, instances and
 * models: plain data, no RPC or loop types, so that pure code
 * (coord_rules.c) and its unit tests can use them.
 */
#ifndef REFIT_DAEMON_COORD_COORD_RECORDS_H
#define REFIT_DAEMON_COORD_COORD_RECORDS_H

#include <stdbool.h>
#include <stdint.h>

#include "common/alloc.h"
#include "plan/plan.h"

/* instance roles: refit.proto's Role (coord_internal.h checks the numbers) */
#define COORD_ROLE_TRAIN 1
#define COORD_ROLE_INFER 2

typedef struct rank_info {
	int32_t rank;
	char *domain;
} rank_info_t;

typedef struct member {
	uint64_t id, joined_epoch;
	char *node_id, *host, *rpc_ep, *data_ep, *transport;
	rank_info_t *ranks;
	size_t nranks;
	uint64_t last_beat_ms;
	bool draining;          /* told to leave at its next heartbeat */
	uint64_t prepared_epoch;/* the last epoch it acknowledged (PrepareEpoch) */
	uint8_t dtoken[32];     /* its data-plane token of dtoken_epoch: it alone */
	uint64_t dtoken_epoch;  /* gets it (PrepareEpoch), peers its SHA-256 */
	char *session;          /* the secret its Join presented (NULL: none): with
				   a join token, its calls must present it */
	char *poisoned;         /* NULL, or why the node runs no more refits until
				   refitd restarts on it (its Join, Heartbeat or
				   SliceDone said so): refits needing it fail */
} member_t;

#define COORD_ENGINE_STR 65   /* an engine's names: 64 bytes and the NUL */

typedef struct instance {
	char *name;
	int role;              /* COORD_ROLE_TRAIN / COORD_ROLE_INFER */
	uint64_t member_id;    /* a live member that registered it (shown) */
	uint64_t *holders;     /* every member that registered it (an instance
				  spans nodes: each registers it); ids of members
				  that left stay until pruned, ids are never reused */
	size_t nholders;
	plan_layout_set_t layouts;
	char digest[SHA256_HEX_LEN];
	uint64_t catch_up_at_ms;  /* registered (again): a catch-up is checked for
				     from then on, once it is whole (0: none) */
	uint64_t orphan_since_ms; /* none of its members is left (0: one is) */
	bool skip;                /* the model's refit now leaves it out (unhealthy) */
	/* what it holds, as far as the coordinator knows (inference) */
	uint64_t installed_version; /* the last version published to it (0: none) */
	bool invalid;             /* in place: a refit wrote it and did not publish */
	bool in_place;            /* its clients install in place (not double buffered) */
	uint32_t gen;             /* bumped when new memory joins it (a registration
				     not "again"): refits planned before do not
				     count for it */
	/* inference: the engine reading it, as a holder's heartbeat last said
	 * (not kept in the state file: the next heartbeat tells it again) */
	char engine_fw[COORD_ENGINE_STR], engine_ver[COORD_ENGINE_STR];
	char engine_pause[COORD_ENGINE_STR];
	uint64_t served_version;  /* the version it serves (0: none, or not told) */
} instance_t;

/* Delta refits: the messages of a plan from one node to another that the
 * receiver kept no base of (RunSliceResponse.delta_lacks). */
typedef struct coord_lack {
	char *from, *to;
	uint32_t *msgs;
	size_t n;
} coord_lack_t;

typedef struct model {
	char *name;
	VEC(instance_t) inst;
	uint64_t latest_version;
	uint64_t installed_version; /* the newest version a refit installed on any
				       instance (each instance's own is its
				       installed_version) */
	uint32_t retries, retry_backoff_ms;  /* the refit policy */
	bool no_catch_up;
	bool strict_instances;     /* a refit fails rather than skip an instance */
	/* the trigger policy (coord_trigger.c); min_interval_ms at most
	 * COORD_MAX_INTERVAL_MS */
	bool on_ready;             /* every WeightsReady starts a refit (else manual) */
	uint32_t min_interval_ms;  /* between the starts of refits the policy starts */
	uint64_t pending_version;  /* on_ready: waits for the refit in flight (0: none) */
	uint64_t skipped_versions; /* replaced while waiting: never refit by the policy */
	uint64_t policy_refits;    /* refits the policy started */
	uint64_t policy_start_ms;  /* when the last of them began (not kept: 0 after
				      a restart) */
	/* delta refits (docs/delta.md): the policy, and the bases the nodes hold
	 * as far as the coordinator knows (memory only: after a restart none) */
	bool delta_off;
	uint64_t delta_tag;        /* the last committed refit's tag (0: no base known) */
	char delta_digest[SHA256_HEX_LEN]; /* ... its plan */
	uint64_t delta_epoch;      /* ... its epoch */
	uint64_t *delta_members;   /* ... the members that kept its bases */
	size_t ndelta_members;
	coord_lack_t *delta_lacks; /* ... but for these messages (sent dense) */
	size_t ndelta_lacks;
	uint64_t resume_version;   /* a new leader over etcd: the version of a refit the
				      old leader had in flight, refit again once the
				      model's instances are whole (retries > 0; not kept) */
} model_t;

#define COORD_MAX_INTERVAL_MS 86400000u

#endif
