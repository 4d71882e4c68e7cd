/*
 * coord_internal.h - the coordinator's state, shared by coord.c (handlers)
 * and coord_state.c (the state file).  Loop thread only.
 */
#ifndef REFIT_DAEMON_COORD_INTERNAL_H
#define REFIT_DAEMON_COORD_INTERNAL_H

#include "common/alloc.h"
#include "daemon/coord.h"
#include "plan/plan.h"

typedef struct rank_info {
	int32_t rank;
	char *domain;
} rank_info_t;

typedef struct member {
	uint64_t id, joined_epoch;
	char *node_id, *host, *rpc_ep, *data_ep;
	rank_info_t *ranks;
	size_t nranks;
	uint64_t last_beat_ms;
} member_t;

typedef struct instance {
	char *name;
	int role;              /* REFIT__V1__ROLE__TRAIN / __INFER */
	uint64_t member_id;
	plan_layout_set_t layouts;
	char digest[SHA256_HEX_LEN];
} instance_t;

typedef struct model {
	char *name;
	VEC(instance_t) inst;
	uint64_t latest_version, installed_version;
} model_t;

struct coord {
	char *state_file;         /* NULL: state lives in memory only */
	uv_loop_t *loop;
	uv_timer_t lease_timer;
	coord_opts_t o;
	uint64_t epoch, next_member;
	VEC(member_t) members;
	VEC(model_t) models;
};

/* Write the state file (when configured); logs and returns on failure. */
refit_status_t coord_state_save(coord_t *c, refit_err_t *err);
/* Read the state file into c (models, versions, epoch, ids). */
refit_status_t coord_state_load(coord_t *c, refit_err_t *err);
void coord_instance_fini(instance_t *in);

#endif
