/*
 * ops.h - what operators see of a running refitd (docs/operations.md): the
 * Prometheus endpoint (metrics_listen), grpc.health.v1.Health, the systemd
 * watchdog, and the gauges and log context refreshed from the loop.
 *
 * ops_start registers the health service (before the server starts) and
 * starts a timer on the loop that refreshes the gauges (epoch, members,
 * clients, slices, staging), the process's epoch in the log context
 * (log_set_epoch: every thread's lines carry it), and pings systemd's
 * watchdog (WATCHDOG=1 at half of $WATCHDOG_USEC; a stuck loop stops the
 * pings, so systemd restarts the daemon).  ops_stop before the role's state
 * is closed.  Loop thread only.
 */
#ifndef REFIT_DAEMON_OPS_H
#define REFIT_DAEMON_OPS_H

#include "daemon/config.h"
#include "daemon/coord/coord.h"
#include "daemon/node/node.h"
#include "rpc/rpc.h"

typedef struct ops ops_t;

/* One of coord, node is set (the role). */
ops_t *ops_start(uv_loop_t *loop, rpc_server_t *srv, coord_t *coord, node_t *node,
		 const refitd_config_t *cfg, refit_err_t *err);
/* Stop serving metrics and pinging; health answers NOT_SERVING from now on. */
void ops_stop(ops_t *o);
/* The log format key changed (SIGHUP): "text" or "json". */
void ops_set_log_format(const char *fmt);

#endif
