/*
 * coord_blame.h - which data link broke, from every node's report of a
 * failed refit (docs/faults.md, "Failure attribution").
 *
 * Each node's SliceDone says what its failed slice saw of its peers
 * (RunSliceResponse.peer_issues): a dial that failed, a connection that
 * broke, a peer that never connected, messages owed either way when the
 * slice ended.  One node's report alone can blame a bystander (every node
 * of a stalled refit hits its deadline together, and the first report to
 * arrive is anyone's); together they name the link: a concrete dial
 * failure outranks a broken connection, which outranks a deadline, and a
 * node that several reports name outranks one that only one names.
 *
 * Pure: no I/O, no globals, no RPC types; coord_refit.c fills the reports
 * and applies the result, tests/unit/test_blame.c checks it.
 */
#ifndef REFIT_DAEMON_COORD_COORD_BLAME_H
#define REFIT_DAEMON_COORD_COORD_BLAME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* How a node's slice ended, as far as naming a link goes. */
typedef enum coord_blame_how {
	COORD_BLAME_NONE = 0,   /* no report, or the slice succeeded */
	COORD_BLAME_FAILED,     /* it failed of its own: a dial, a connection, ... */
	COORD_BLAME_DEADLINE,   /* it ran past its slice deadline */
	COORD_BLAME_ABORTED,    /* the coordinator stopped it after another failed */
	COORD_BLAME_SILENT,     /* it never reported: it did not answer the coordinator */
} coord_blame_how_t;

/* What a node saw of one peer: refit.proto's PeerIssueKind numbers. */
typedef enum coord_blame_kind {
	COORD_BLAME_CONNECT = 1,          /* it could not connect to the peer's data port */
	COORD_BLAME_HANDSHAKE = 2,        /* the peer took the connection, refused or hung */
	COORD_BLAME_BROKEN = 3,           /* a connection failed, it sending to the peer */
	COORD_BLAME_NEVER_CONNECTED = 4,  /* the peer never connected to it */
	COORD_BLAME_OWES = 5,             /* the peer still owed it messages */
	COORD_BLAME_OWED = 6,             /* it still owed the peer messages */
	COORD_BLAME_BROKEN_IN = 7,        /* a connection failed, the peer sending to it */
} coord_blame_kind_t;

#define COORD_BLAME_ISSUES 8      /* kept per node; the rest are dropped */
#define COORD_BLAME_DETAIL 96

typedef struct coord_blame_issue {
	uint8_t kind;                 /* coord_blame_kind_t */
	uint32_t peer;                /* the peer: its index among the refit's nodes */
	uint32_t msgs;                /* OWES, OWED: how many messages */
} coord_blame_issue_t;

typedef struct coord_blame_report {
	uint8_t how;                  /* coord_blame_how_t */
	uint8_t nissues;
	coord_blame_issue_t issue[COORD_BLAME_ISSUES];
	char detail[COORD_BLAME_DETAIL]; /* the error of its first CONNECT, HANDSHAKE
					    or BROKEN(_IN) issue ("Connection timed out") */
} coord_blame_report_t;

/*
 * Add what a node saw of peer to rep (dropped when rep is full or kind is
 * unknown; detail, may be NULL, is kept for the first link fault).
 */
void coord_blame_add(coord_blame_report_t *rep, int kind, uint32_t peer, uint64_t msgs,
		     const char *detail);

/*
 * Name the broken link from the reports of the refit's n nodes: reps[k]
 * (NULL: none) is node k's, names[k] its node id, eps[k] its data endpoint
 * (NULL or "": not known).  Writes one line into out (len bytes, cut on a
 * character boundary), "data link A -> B: ...", naming both ends of the
 * link and why; true when the reports name one, false (out "") when they
 * name none (nothing but successes, or no issue that points anywhere).
 */
bool coord_blame_name(const coord_blame_report_t *const *reps, size_t n,
		      const char *const *names, const char *const *eps, char *out, size_t len);

#endif
