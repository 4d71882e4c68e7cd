/*
 * coord_rules.h - the membership's and the registry's rules as pure
 * functions over the records (coord_records.h): who may join with which
 * ranks, which ranks of a layout no member holds, and which ranks two
 * inference instances share; which slice failures are symptoms.  No I/O, no globals; coord.c and
 * coord_refit.c apply them, tests/unit/test_coord_rules.c checks them.
 */
#ifndef REFIT_DAEMON_COORD_COORD_RULES_H
#define REFIT_DAEMON_COORD_COORD_RULES_H

#include "common/err.h"
#include "daemon/coord/coord_records.h"

/*
 * May node join with ranks[0..n) while members[0..nmembers) are members?
 * Its node id is not empty, it brings ranks, each in range, none listed
 * twice, none held by another node (its own earlier membership does not
 * count: a rejoin replaces it).  REFIT_OK, or an error quoting the value.
 */
refit_status_t coord_rules_join(const member_t *members, size_t nmembers, const char *node,
				const int32_t *ranks, size_t n, refit_err_t *err);

/* The first rank of set that no member holds, or -1; *tensor: its tensor. */
int32_t coord_rules_unheld_rank(const member_t *members, size_t nmembers,
				const plan_layout_set_t *set, size_t *tensor);

/* The first rank of a that b uses too, or -1. */
int32_t coord_rules_shared_rank(const plan_layout_set_t *a, const plan_layout_set_t *b);

/*
 * May inference instance iname of model m take set?  Replicas need ranks of
 * their own: one overlapping another makes every refit of the model fail at
 * planning.  The instance's own earlier registration does not count.
 */
refit_status_t coord_rules_own_ranks(const model_t *m, const char *iname,
				     const plan_layout_set_t *set, refit_err_t *err);

/*
 * Is a failed slice's message what a peer saw of another node's failure
 * rather than a cause: its transport lost the peer (tcp, or NCCL's remote
 * error), or the coordinator aborted it?  A refit names a cause over it.
 */
bool coord_rules_is_symptom(const char *msg);

/* What a model's trigger policy does with its pending version now. */
typedef enum {
	COORD_TRIGGER_NONE,     /* manual, or no version pending */
	COORD_TRIGGER_STALE,    /* pending is not newer than the installed: drop it */
	COORD_TRIGGER_BUSY,     /* a refit of the model is in flight: wait */
	COORD_TRIGGER_INTERVAL, /* min_interval_ms since the last start not passed: wait */
	COORD_TRIGGER_GO,       /* start a refit of the pending version */
} coord_trigger_wait_t;

/* m's policy, a refit of m in flight or not (busy), at now (ms; the clock
 * of m->policy_start_ms). */
coord_trigger_wait_t coord_rules_trigger(const model_t *m, bool busy, uint64_t now);

/* WeightsReady of version for m: with on_ready it becomes the pending
 * version.  True when it replaced an older pending one (counted in
 * m->skipped_versions). */
bool coord_rules_trigger_note(model_t *m, uint64_t version);

#endif
