/*
 * health.c - see health.h.  The messages come from
 * proto/grpc/health/v1/health.proto (generated into build/gen; its code is
 * compiled here, as only this file uses it).
 */
#include <string.h>

#include "common/alloc.h"
#include "daemon/health.h"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#include "grpc/health/v1/health.pb-c.c"
#pragma GCC diagnostic pop

typedef struct health {
	const char *const *services;
	health_serving_fn serving;
	void *ctx;
} health_t;

static health_t health_state;

static bool
known(const health_t *h, const char *svc)
{
	if (svc == NULL || !svc[0])
		return true;
	for (size_t i = 0; h->services && h->services[i]; i++)
		if (strcmp(h->services[i], svc) == 0)
			return true;
	return false;
}

static void
h_check(void *ctx, rpc_call_t *call, const ProtobufCMessage *msg)
{
	const Grpc__Health__V1__HealthCheckRequest *rq = (const void *)msg;
	Grpc__Health__V1__HealthCheckResponse rsp = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
	health_t *h = ctx;

	if (!known(h, rq->service)) {
		rpc_call_fail(call, REFIT_ERR_NOT_FOUND, "health: service \"%s\" is not served "
			      "here", rq->service);
		return;
	}
	rsp.status = h->serving(h->ctx) ?
		     GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING :
		     GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
	rpc_call_reply(call, &rsp.base);
}

static const rpc_method_cfg_t health_methods[] = {
	{"Check", h_check},
};

refit_status_t
health_register(rpc_server_t *srv, const char *const *services, health_serving_fn serving,
		void *ctx, refit_err_t *err)
{
	health_state = (health_t){services, serving, ctx};
	return rpc_server_add_service(srv, &grpc__health__v1__health__descriptor, health_methods,
				      1, &health_state, err);
}
