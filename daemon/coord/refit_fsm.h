/*
 * refit_fsm.h - the refit lifecycle as one state machine: every phase a
 * state, events as data, one transition function that returns the next
 * state and the actions to take, as data.
 *
 * Pure: no I/O, no clock, no globals, no allocation.  coord_refit.c feeds
 * it what happened (a plan is ready, a node answered, a slice reported, the
 * membership changed, an operator aborted) and carries out the actions it
 * returns (send a round of node calls, abort the nodes, retry later, end).
 * An event a state does not expect is an error, never a silent change.
 * docs/control-plane.md draws the machine.
 */
#ifndef REFIT_DAEMON_COORD_REFIT_FSM_H
#define REFIT_DAEMON_COORD_REFIT_FSM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

typedef enum refit_fsm_state {
	REFIT_FSM_PLANNING,        /* the plan is built (or taken from the cache) */
	REFIT_FSM_QUEUED,          /* planned; another nccl refit holds the turn */
	REFIT_FSM_RETRY_WAIT,      /* an attempt failed; the next is planned later */
	REFIT_FSM_NCCL_ID,         /* the lowest rank's node makes an NCCL unique id */
	REFIT_FSM_PREPARING,       /* nodes are told the epoch (PrepareEpoch) */
	REFIT_FSM_RUNNING,         /* slices run (RunSlice, then SliceDone per node) */
	REFIT_FSM_FAILING_SYMPTOM, /* a slice failed; only symptoms are known yet (a
				      peer's transport error, an abort) */
	REFIT_FSM_FAILING,         /* a slice failed with its cause; the others are
				      aborted and their reports collected */
	REFIT_FSM_COMMITTING,      /* every slice ran; nodes keep the result (Commit) */
	REFIT_FSM_PUBLISHING,      /* every node committed; clients are shown it (Publish) */
	REFIT_FSM_COMMITTED,       /* final */
	REFIT_FSM_FAILED,          /* final */
	REFIT_FSM_ABORTED,         /* final */
	REFIT_FSM_NSTATES
} refit_fsm_state_t;

typedef enum refit_fsm_event_kind {
	REFIT_FSM_EV_PLANNED,       /* a plan is in hand (u.planned) */
	REFIT_FSM_EV_PLAN_STALE,    /* its inputs changed while it was built */
	REFIT_FSM_EV_DUE,           /* the wait is over */
	REFIT_FSM_EV_CALLS_SENT,    /* a round of node calls is out (u.calls) */
	REFIT_FSM_EV_NODE_OK,       /* a node call of the round succeeded */
	REFIT_FSM_EV_NODE_FAILED,   /* a node call of the round failed */
	REFIT_FSM_EV_SLICE_OK,      /* a node's slice ended well */
	REFIT_FSM_EV_SLICE_FAILED,  /* a node's slice failed (u.slice) */
	REFIT_FSM_EV_FAIL,          /* the coordinator cannot go on (plan error, a
				       call that cannot start, the model went away) */
	REFIT_FSM_EV_DEADLINE,      /* slices unreported past the backstop */
	REFIT_FSM_EV_EPOCH_CHANGED, /* the membership changed under the refit */
	REFIT_FSM_EV_ABORT,         /* AbortRefit, or a drain of a node it uses */
	REFIT_FSM_NEVENTS
} refit_fsm_event_kind_t;

typedef struct refit_fsm_event {
	refit_fsm_event_kind_t kind;
	bool final;                 /* no further attempt can succeed (a node it
				       needs is poisoned): the failure is not
				       retried, whatever the policy */
	union {
		struct {
			bool wait_turn; /* nccl: another refit runs; plan again later */
			bool no_nodes;  /* the plan moves nothing and nobody installs */
			bool nccl;      /* the nodes use the nccl transport */
			bool need_id;   /* nccl: the epoch needs a new unique id */
		} planned;
		struct {
			uint32_t n;     /* calls started (0: every node had it already) */
		} calls;
		struct {
			bool symptom;   /* the failure is what a peer saw, not a cause */
		} slice;
	} u;
} refit_fsm_event_t;

/*
 * Actions, in the order they are to be carried out.  The bookkeeping ones
 * come first; the refit is persisted before the first call action
 * (REFIT_FSM_FIRST_CALL and after), which may feed the machine again.
 */
typedef enum refit_fsm_action_kind {
	REFIT_FSM_ACT_KEEP_CAUSE,   /* the event's message becomes the refit's failure */
	REFIT_FSM_ACT_CANCEL_CALLS, /* node calls still out are no longer wanted */
	REFIT_FSM_ACT_RETRY,        /* the attempt failed: note why; plan again in wait_ms */
	REFIT_FSM_ACT_WAIT,         /* plan again in wait_ms */
	REFIT_FSM_ACT_END,          /* a final state is reached */
	REFIT_FSM_ACT_NEW_EPOCH,    /* nccl: communicators may be aborted on some
				       nodes; a new epoch makes every node build
				       fresh ones */
	REFIT_FSM_ACT_PLAN,         /* build the plan (or take it from the cache) */
	REFIT_FSM_ACT_ASK_NCCL_ID,  /* Node.NcclId to the lowest rank's node */
	REFIT_FSM_ACT_SEND_PREPARE, /* Node.PrepareEpoch to the nodes without the epoch */
	REFIT_FSM_ACT_SEND_RUN,     /* Node.RunSlice to every node */
	REFIT_FSM_ACT_SEND_COMMIT,  /* Node.Commit to every node */
	REFIT_FSM_ACT_SEND_PUBLISH, /* Node.Publish to every node */
	REFIT_FSM_ACT_ABORT_NODES,  /* Node.Abort to every node (best effort) */
	REFIT_FSM_NACTIONS
} refit_fsm_action_kind_t;

#define REFIT_FSM_FIRST_CALL REFIT_FSM_ACT_PLAN
#define REFIT_FSM_MAX_ACTIONS 6

typedef struct refit_fsm_action {
	refit_fsm_action_kind_t kind;
	uint64_t wait_ms;           /* RETRY, WAIT: at least 1 */
} refit_fsm_action_t;

/* The machine: its state and the counters its transitions depend on. */
typedef struct refit_fsm {
	refit_fsm_state_t state;
	uint32_t pending;     /* answers (RUNNING, FAILING*: slice reports) still
				 expected in this round of node calls */
	uint32_t attempt;     /* 1, 2, ... */
	uint32_t retries;     /* further attempts allowed (the model's policy) */
	uint32_t backoff_ms;  /* wait before attempt 2; doubled for each next one */
	bool nccl;            /* the nodes use nccl (known once planned) */
	bool final;           /* an event said no attempt can succeed: a failure
				 ends in FAILED, not RETRY_WAIT */
} refit_fsm_t;

typedef struct refit_fsm_out {
	refit_fsm_t next;
	refit_fsm_action_t act[REFIT_FSM_MAX_ACTIONS];
	size_t nact;
} refit_fsm_out_t;

/* What a state is, in one table. */
#define REFIT_FSM_FINAL 1u        /* nothing more happens */
#define REFIT_FSM_WAITS 2u        /* a timer moves it on (not busy for catch-up) */
#define REFIT_FSM_HOLDS_EPOCH 4u  /* nodes take part at its epoch: a change fails it */

typedef struct refit_fsm_state_info {
	const char *name;         /* "planning", ... (logs, errors, docs) */
	int public_state;         /* the RefitState clients see (refit.proto) */
	const char *phase;        /* the metrics' phase label; NULL when final */
	const char *call;         /* the node call whose answers it counts, or NULL */
	unsigned flags;           /* REFIT_FSM_FINAL | _WAITS | _HOLDS_EPOCH */
} refit_fsm_state_info_t;

/* A new refit: attempt 1, PLANNING (carry out REFIT_FSM_ACT_PLAN next). */
void refit_fsm_init(refit_fsm_t *m, uint32_t retries, uint32_t backoff_ms);

/*
 * The transition: what follows ev in m.  REFIT_OK: out->next is the next
 * machine and out->act what to do, in order.  An event m's state does not
 * expect (or a count that would go below zero): REFIT_ERR_INTERNAL, err
 * names the state and the event, and *out is untouched.
 */
refit_status_t refit_fsm_step(const refit_fsm_t *m, const refit_fsm_event_t *ev,
			      refit_fsm_out_t *out, refit_err_t *err);

/* The table row of s (NULL outside the enum). */
const refit_fsm_state_info_t *refit_fsm_info(refit_fsm_state_t s);
bool refit_fsm_is(refit_fsm_state_t s, unsigned flag);
const char *refit_fsm_state_name(refit_fsm_state_t s);
const char *refit_fsm_event_name(refit_fsm_event_kind_t k);
const char *refit_fsm_action_name(refit_fsm_action_kind_t k);
/* The public RefitState of s; its name ("PENDING", ...; "?" when unknown). */
int refit_fsm_public(refit_fsm_state_t s);
const char *refit_fsm_public_name(int public_state);
/*
 * The state a public RefitState stands for (read back from the state
 * file): the first state of the table showing it.  REFIT_ERR_INVALID_ARG
 * for a value that is no RefitState.
 */
refit_status_t refit_fsm_of_public(int public_state, refit_fsm_state_t *s,
				   refit_err_t *err);

#endif
