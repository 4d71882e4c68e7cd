/*
 * log.h - logging with levels, a subsystem mask and context.
 *
 * log_warn appends strerror(errno); log_warnx does not.  Every line carries
 * its context (node, rank, epoch, refit id) where known: the process's node
 * and epoch (log_set_node at start, log_set_epoch as membership changes;
 * refitd's ops tick does the latter), seen by every thread, and what a
 * thread set for itself (log_set_refit around one refit's work on a worker
 * thread; log_set_context for every field), which wins where it is known.
 * Thread-safe: each line is formatted then written with one write(2).
 * Output goes to stderr (journald picks it up under systemd).
 *
 * LOG_FMT_JSON writes one JSON object per line instead (docs/operations.md):
 * {"time", "level", "subsystem", "node", "epoch", "refit", "message"}
 * (+ "rank" when known); unknown context is null.  The subsystem is the
 * debug subsystem, else the message's leading word ("coordinator: ...",
 * "node n0: ..."), else the program; the refit is the context's, else the
 * one the message names ("refit 12").
 */
#ifndef REFIT_COMMON_LOG_H
#define REFIT_COMMON_LOG_H

#include <stdint.h>

enum log_level { LOG_LVL_ERROR, LOG_LVL_WARN, LOG_LVL_INFO, LOG_LVL_DEBUG };

enum log_subsys {
	LOG_SUB_MAIN = 1u << 0,
	LOG_SUB_PLAN = 1u << 1,
	LOG_SUB_RPC = 1u << 2,
	LOG_SUB_COORD = 1u << 3,
	LOG_SUB_NODE = 1u << 4,
	LOG_SUB_XPORT = 1u << 5,
	LOG_SUB_ALL = 0xffffffffu,
};

typedef struct log_context {
	const char *node;  /* NULL when unknown */
	int32_t rank;      /* -1 when unknown */
	uint64_t epoch;    /* 0 when unknown */
	uint64_t refit_id; /* 0 when unknown */
} log_context_t;

enum log_format { LOG_FMT_TEXT, LOG_FMT_JSON };

void log_init(const char *progname, enum log_level level, uint32_t submask);
void log_set_format(enum log_format fmt);
/* Parse "error|warn|info|debug"; returns -1 on unknown names. */
int log_level_parse(const char *s);
/* This thread's context, every field (unknown ones: the process's). */
void log_set_context(const log_context_t *ctx);
/* This thread's refit id (0: none), the rest of its context kept. */
void log_set_refit(uint64_t refit_id);
/* The process's node id (copied, at most 127 bytes; NULL: none).  Set it
 * before other threads log. */
void log_set_node(const char *node);
/* The process's epoch (0: unknown); any thread, at any time. */
void log_set_epoch(uint64_t epoch);

void log_emit(enum log_level lvl, uint32_t sub, int with_errno,
	      const char *fmt, ...) __attribute__((format(printf, 4, 5)));

#define log_warn(...) log_emit(LOG_LVL_WARN, LOG_SUB_ALL, 1, __VA_ARGS__)
#define log_warnx(...) log_emit(LOG_LVL_WARN, LOG_SUB_ALL, 0, __VA_ARGS__)
#define log_errorx(...) log_emit(LOG_LVL_ERROR, LOG_SUB_ALL, 0, __VA_ARGS__)
#define log_info(...) log_emit(LOG_LVL_INFO, LOG_SUB_ALL, 0, __VA_ARGS__)
#define log_debug(sub, ...) log_emit(LOG_LVL_DEBUG, (sub), 0, __VA_ARGS__)

#endif
