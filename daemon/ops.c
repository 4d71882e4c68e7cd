/*
 * ops.c - see ops.h.
 */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/sdnotify.h"
#include "daemon/coord/coord_internal.h"
#include "daemon/health.h"
#include "daemon/metrics.h"
#include "daemon/node/node_internal.h"
#include "daemon/ops.h"

#define OPS_TICK_MS 1000   /* gauges; the watchdog may ask for a shorter tick */

struct ops {
	uv_timer_t timer;
	coord_t *coord;
	node_t *node;
	uint64_t watchdog_us;
	bool metrics;
};

/* what the health service reads (kept past ops_stop, which clears it) */
static struct {
	coord_t *coord;
	node_t *node;
} live;

static const char *const coord_services[] = {"refit.v1.Coordinator", NULL};
static const char *const node_services[] = {"refit.v1.Node", NULL};

/* SERVING: the coordinator while it runs; a node while it is a member and
 * not drained, poisoned or stopping. */
static bool
serving(void *ctx)
{
	(void)ctx;
	if (live.coord)
		return !live.coord->closing;
	if (live.node)
		return live.node->member_id != 0 && !live.node->drained && !live.node->closing &&
		       node_poisoned(live.node) == NULL;
	return false;
}

/* What malloc holds: in use, and taken from the system (bench/bench_soak.py
 * reads both to tell growth from the allocator's own). */
static void
refresh_heap(void)
{
#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 33)
	struct mallinfo2 mi = mallinfo2();

	metrics_set(M_HEAP_INUSE_BYTES, NULL, (double)(mi.uordblks + mi.hblkhd));
	metrics_set(M_HEAP_SYSTEM_BYTES, NULL, (double)(mi.arena + mi.hblkhd));
#endif
}

/* the gauges, and the epoch every log line of the process carries */
static void
refresh(ops_t *o)
{
	if (o->metrics)
		refresh_heap();  /* mallinfo2 walks every arena: only when scraped */
	if (o->coord) {
		size_t poisoned = 0;
		uint64_t live, freed;
		size_t bytes = 0;

		for (size_t i = 0; i < o->coord->members.n; i++)
			poisoned += o->coord->members.v[i].poisoned != NULL;
		metrics_set(M_EPOCH, NULL, (double)o->coord->epoch);
		metrics_set(M_MEMBERS, NULL, (double)o->coord->members.n);
		metrics_set(M_MEMBERS_POISONED, NULL, (double)poisoned);
		coord_refit_counts(&live, &freed);
		metrics_set(M_REFIT_RECORDS, NULL, (double)o->coord->refits.n);
		metrics_set(M_REFIT_RECORDS_ALLOCATED, NULL, (double)live);
		metrics_set(M_REFIT_RECORDS_FREED_TOTAL, NULL, (double)freed);
		for (size_t i = 0; i < o->coord->refits.n; i++)
			bytes += coord_refit_bytes(o->coord->refits.v[i]);
		metrics_set(M_REFIT_RECORDS_BYTES, NULL, (double)bytes);
		log_set_epoch(o->coord->epoch);
	} else if (o->node) {
		node_t *n = o->node;
		size_t train = 0, infer = 0;

		for (size_t i = 0; i < n->clients.n; i++) {
			if (n->clients.v[i]->dead)
				continue;
			if (n->clients.v[i]->role == REFIT__V1__ROLE__TRAIN)
				train++;
			else
				infer++;
		}
		metrics_set(M_EPOCH, NULL, (double)n->epoch);
		metrics_set(M_CLIENTS, (const char *[]){"role", "train", NULL}, (double)train);
		metrics_set(M_CLIENTS, (const char *[]){"role", "infer", NULL}, (double)infer);
		metrics_set(M_SLICES_RUNNING, NULL, (double)n->jobs.n);
		metrics_set(M_STAGING_BYTES, NULL, (double)node_staging_reserved(n));
		for (int g = 0; g < 2; g++) {
			const char *const w[] = {"where", g ? "gpu" : "host", NULL};

			metrics_set(M_DELTA_BASE_BYTES, w, (double)node_delta_base_bytes(n, false, g));
			metrics_set(M_DELTA_BASE_LIMIT_BYTES, w,
				    (double)node_delta_base_bytes(n, true, g));
			metrics_set(M_DELTA_EVICTIONS_TOTAL, w, (double)node_delta_evictions(n, g));
		}
		metrics_set(M_NODE_POISONED, NULL, node_poisoned(n) ? 1 : 0);
		log_set_epoch(n->epoch);
	}
}

static void
on_tick(uv_timer_t *t)
{
	ops_t *o = t->data;

	refresh(o);
	if (o->watchdog_us)
		(void)sd_notify_send("WATCHDOG=1");
}

void
ops_set_log_format(const char *fmt)
{
	log_set_format(fmt && strcmp(fmt, "json") == 0 ? LOG_FMT_JSON : LOG_FMT_TEXT);
}

ops_t *
ops_start(uv_loop_t *loop, rpc_server_t *srv, coord_t *coord, node_t *node,
	  const refitd_config_t *cfg, refit_err_t *err)
{
	ops_t *o = xcalloc(1, sizeof(*o));
	uint64_t tick = OPS_TICK_MS;
	int port = 0;

	o->coord = coord;
	o->node = node;
	ops_set_log_format(cfg->log_format);
	live.coord = coord;
	live.node = node;
	if (health_register(srv, coord ? coord_services : node_services, serving, NULL, err) !=
	    REFIT_OK)
		goto fail;
	if (cfg->metrics_listen) {
		if (metrics_serve_start(cfg->metrics_listen, &port, err) != REFIT_OK)
			goto fail;
		o->metrics = true;
		log_info("refitd: metrics on http://%s/metrics (port %d)", cfg->metrics_listen,
			 port);
	}
	o->watchdog_us = sd_watchdog_usec();
	if (o->watchdog_us) {
		/* half the interval, as sd_watchdog_enabled(3) advises */
		uint64_t half = o->watchdog_us / 2000;

		tick = half < 1 ? 1 : half < tick ? half : tick;
		log_info("refitd: systemd watchdog: %llu ms, pinging every %llu ms",
			 (unsigned long long)(o->watchdog_us / 1000), (unsigned long long)tick);
	}
	refresh(o);
	uv_timer_init(loop, &o->timer);
	o->timer.data = o;
	uv_timer_start(&o->timer, on_tick, tick, tick);
	return o;
fail:
	live.coord = NULL;
	live.node = NULL;
	free(o);
	return NULL;
}

static void
on_closed(uv_handle_t *h)
{
	free(h->data);
}

void
ops_stop(ops_t *o)
{
	if (o == NULL)
		return;
	if (o->metrics)
		metrics_serve_stop();
	o->coord = live.coord = NULL;
	o->node = live.node = NULL;
	log_set_epoch(0);
	uv_timer_stop(&o->timer);
	uv_close((uv_handle_t *)&o->timer, on_closed);
}
