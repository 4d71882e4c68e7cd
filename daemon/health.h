/*
 * health.h - grpc.health.v1.Health/Check on refitd's gRPC server (what
 * Kubernetes gRPC probes and grpc_health_probe call): SERVING or
 * NOT_SERVING as the role says (daemon/ops.c), for the service "" (the
 * whole daemon) or one of the services it serves; other names NOT_FOUND.
 * Watch (a server stream) is not served (UNIMPLEMENTED).
 */
#ifndef REFIT_DAEMON_HEALTH_H
#define REFIT_DAEMON_HEALTH_H

#include <stdbool.h>

#include "rpc/rpc.h"

typedef bool (*health_serving_fn)(void *ctx);

/* services: NULL-terminated names answered besides "" (kept, not copied). */
refit_status_t health_register(rpc_server_t *srv, const char *const *services,
			       health_serving_fn serving, void *ctx, refit_err_t *err);

#endif
