/*
 * coord_blame.c - naming the broken data link of a failed refit from every
 * node's report (see coord_blame.h).
 *
 * Every issue a node reports names a peer, and says something about it
 * (its weight): a dial to it that failed (4: its data port, or the path to
 * it, is broken), a connection that broke while the reporter still ran on
 * its own (2: an abort closes connections too, so only a node that failed
 * by itself counts it), a peer that never connected or still owed messages
 * when the reporter ran out of time (3), owed messages a node saw when it
 * failed otherwise (1).  A node's own debts (OWED) say nothing: it may be
 * stuck, or its peer may not be reading.  The node named is the one whose
 * strongest issue is strongest; ties go to the one more nodes name, then
 * to one that never reported (it did not answer the coordinator), then to
 * one that was not itself waiting for a peer (in a chain A -> B -> C with
 * A stopped, B and C both waited: B for A, C for B; A is the cause), then
 * to the larger sum, then to the lower index.  The line names both ends of
 * each link the chosen node's strongest issues describe.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common/strbuf.h"
#include "common/utf8.h"
#include "daemon/coord/coord_blame.h"

#define ALSO_MAX 3   /* links named after the first */

void
coord_blame_add(coord_blame_report_t *rep, int kind, uint32_t peer, uint64_t msgs,
		const char *detail)
{
	bool fault = kind == COORD_BLAME_CONNECT || kind == COORD_BLAME_HANDSHAKE ||
		     kind == COORD_BLAME_BROKEN || kind == COORD_BLAME_BROKEN_IN;

	if (kind < COORD_BLAME_CONNECT || kind > COORD_BLAME_BROKEN_IN ||
	    rep->nissues >= COORD_BLAME_ISSUES)
		return;
	if (fault && rep->detail[0] == '\0' && detail != NULL) {
		snprintf(rep->detail, sizeof(rep->detail), "%s", detail);
		utf8_cut(rep->detail);
	}
	rep->issue[rep->nissues++] = (coord_blame_issue_t){(uint8_t)kind, peer,
		(uint32_t)(msgs > UINT32_MAX ? UINT32_MAX : msgs)};
}

/* What an issue of kind, from a node whose slice ended how, says about its peer. */
static int
weight(uint8_t kind, uint8_t how)
{
	switch (kind) {
	case COORD_BLAME_CONNECT:
	case COORD_BLAME_HANDSHAKE:
		return 4;
	case COORD_BLAME_NEVER_CONNECTED:
		return how == COORD_BLAME_DEADLINE ? 3 : 0;
	case COORD_BLAME_OWES:
		return how == COORD_BLAME_DEADLINE ? 3 : how == COORD_BLAME_FAILED ? 1 : 0;
	case COORD_BLAME_BROKEN:
	case COORD_BLAME_BROKEN_IN:
		return how == COORD_BLAME_FAILED ? 2 : 0;
	default:
		return 0;
	}
}

/* Did node rep run out of time waiting for a peer? */
static bool
waited(const coord_blame_report_t *rep)
{
	for (size_t i = 0; rep != NULL && i < rep->nissues; i++)
		if (weight(rep->issue[i].kind, rep->how) == 3)
			return true;
	return false;
}

typedef struct suspect {
	int best;        /* the strongest weight of an issue naming it */
	size_t nrep;     /* nodes whose issues name it with that weight */
	int total;       /* every weight naming it */
	bool silent, waited;
} suspect_t;

/* Node j as a suspect: what the others' reports say about it. */
static suspect_t
suspect_of(const coord_blame_report_t *const *reps, size_t n, size_t j)
{
	suspect_t s = {0, 0, 0, reps[j] && reps[j]->how == COORD_BLAME_SILENT,
		       waited(reps[j])};

	for (size_t k = 0; k < n; k++)
		for (size_t i = 0; k != j && reps[k] && i < reps[k]->nissues; i++) {
			int w = weight(reps[k]->issue[i].kind, reps[k]->how);

			if (reps[k]->issue[i].peer != j || w == 0)
				continue;
			s.total += w;
			if (w > s.best)
				s.best = w;
		}
	for (size_t k = 0; s.best > 0 && k < n; k++)
		for (size_t i = 0; k != j && reps[k] && i < reps[k]->nissues; i++)
			if (reps[k]->issue[i].peer == j &&
			    weight(reps[k]->issue[i].kind, reps[k]->how) == s.best) {
				s.nrep++;
				break;
			}
	return s;
}

/* Is a a likelier cause than b? */
static bool
likelier(const suspect_t *a, const suspect_t *b)
{
	if (a->best != b->best)
		return a->best > b->best;
	if (a->nrep != b->nrep)
		return a->nrep > b->nrep;
	if (a->silent != b->silent)
		return a->silent;
	if (a->waited != b->waited)
		return !a->waited;
	return a->total > b->total;
}

/* The first link: both ends and why, in full. */
static void
first_link(strbuf_t *sb, const coord_blame_issue_t *is, const char *k, const char *j,
	   const char *ep, const char *detail)
{
	const char *at = ep && ep[0] ? " " : "", *e = ep ? ep : "";
	const char *d = detail && detail[0] ? detail : "failed";

	switch (is->kind) {
	case COORD_BLAME_CONNECT:
		strbuf_printf(sb, "data link %s -> %s: %s cannot connect to %s's data port%s%s: "
			      "%s", k, j, k, j, at, e, d);
		break;
	case COORD_BLAME_HANDSHAKE:
		strbuf_printf(sb, "data link %s -> %s: %s's data port%s%s took %s's connection "
			      "but did not complete the handshake: %s", k, j, j, at, e, k, d);
		break;
	case COORD_BLAME_BROKEN:
		strbuf_printf(sb, "data link %s -> %s: the tcp connection broke: %s", k, j, d);
		break;
	case COORD_BLAME_BROKEN_IN:
		strbuf_printf(sb, "data link %s -> %s: the tcp connection broke: %s (as %s saw "
			      "it)", j, k, d, k);
		break;
	case COORD_BLAME_NEVER_CONNECTED:
		strbuf_printf(sb, "data link %s -> %s: %s never connected to %s's data port by "
			      "%s's slice deadline", j, k, j, k, k);
		break;
	default: /* OWES */
		strbuf_printf(sb, "data link %s -> %s: %s stopped sending: %s was still owed "
			      "%" PRIu32 " message%s at its slice deadline", j, k, j, k, is->msgs,
			      is->msgs == 1 ? "" : "s");
		break;
	}
}

/* A further link of the same kind, short. */
static void
also_link(strbuf_t *sb, const coord_blame_issue_t *is, const char *k, const char *j,
	  const char *detail)
{
	bool to_j = is->kind == COORD_BLAME_CONNECT || is->kind == COORD_BLAME_HANDSHAKE ||
		    is->kind == COORD_BLAME_BROKEN;
	bool fault = to_j || is->kind == COORD_BLAME_BROKEN_IN;

	strbuf_printf(sb, "; also %s -> %s", to_j ? k : j, to_j ? j : k);
	if (is->kind == COORD_BLAME_OWES)
		strbuf_printf(sb, " (%" PRIu32 " message%s)", is->msgs, is->msgs == 1 ? "" : "s");
	else if (fault && detail && detail[0])
		strbuf_printf(sb, " (%s)", detail);
}

bool
coord_blame_name(const coord_blame_report_t *const *reps, size_t n,
		 const char *const *names, const char *const *eps, char *out, size_t len)
{
	size_t j = SIZE_MAX, named = 0;
	suspect_t best = {0}, s;
	strbuf_t sb;

	if (len)
		out[0] = '\0';
	for (size_t k = 0; k < n; k++) {
		s = suspect_of(reps, n, k);
		if (s.best > 0 && (j == SIZE_MAX || likelier(&s, &best))) {
			best = s;
			j = k;
		}
	}
	if (j == SIZE_MAX || len == 0)
		return false;
	strbuf_init(&sb);
	for (size_t k = 0; k < n; k++)
		for (size_t i = 0; k != j && reps[k] && i < reps[k]->nissues; i++) {
			const coord_blame_issue_t *is = &reps[k]->issue[i];

			if (is->peer != j || weight(is->kind, reps[k]->how) != best.best)
				continue;
			if (named == 0)
				first_link(&sb, is, names[k], names[j], eps ? eps[j] : NULL,
					   reps[k]->detail);
			else if (named <= ALSO_MAX)
				also_link(&sb, is, names[k], names[j], reps[k]->detail);
			named++;
			break;
		}
	if (named > ALSO_MAX + 1)
		strbuf_printf(&sb, "; and %zu more", named - ALSO_MAX - 1);
	if (named > 1)
		strbuf_printf(&sb, " (%zu nodes' reports agree)", named);
	if (best.silent)
		strbuf_printf(&sb, "; node %s did not answer the coordinator either", names[j]);
	snprintf(out, len, "%s", sb.s);
	utf8_cut(out);
	strbuf_fini(&sb);
	return true;
}
