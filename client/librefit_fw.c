/*
 * librefit_fw.c - the frameworks' memory maps for clients
 * (refit_framework_map): the C rules of plan/framework.c are the one
 * source of truth; the Python package (refit.frameworks) calls this.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/refit.h"
#include "codec/json.h"

static int
fail(refit_status_t st, const char *msg, char *errbuf, size_t errlen)
{
	if (errbuf != NULL && errlen > 0)
		snprintf(errbuf, errlen, "%s", msg);
	return (int)st;
}

int
refit_framework_map(const char *framework, const char *model, const char *par,
		    const char *quant, int rank, char **json, char *errbuf, size_t errlen)
{
	static const char *const dirs[] = {"config/models", NULL};
	plan_fw_t fw;
	plan_arch_t a;
	plan_par_t p;
	plan_fw_map_t m;
	refit_err_t e;
	strbuf_t sb;
	refit_status_t rc;

	refit_err_clear(&e);
	if (json == NULL || framework == NULL || model == NULL || par == NULL)
		return fail(REFIT_ERR_INVALID_ARG, "refit_framework_map: framework, model, par and "
			    "json are required", errbuf, errlen);
	*json = NULL;
	rc = plan_fw_parse(framework, &fw, &e);
	if (rc == REFIT_OK)
		rc = model[0] == '{' ? codec_arch_parse(model, strlen(model), &a, &e) :
				       codec_arch_load(model, dirs, &a, &e);
	if (rc == REFIT_OK)
		rc = plan_par_parse(par, plan_fw_trains(fw), &p, &e);
	if (rc == REFIT_OK && quant != NULL && quant[0] != '\0' &&
	    strcmp(quant, "fp8-block128") != 0)
		rc = refit_err_set(&e, REFIT_ERR_INVALID_ARG, "quant \"%s\": expected "
				   "fp8-block128 or none", quant);
	if (rc != REFIT_OK)
		return fail(rc, e.msg, errbuf, errlen);
	if ((rc = plan_fw_map_build(&m, &a, fw, &p, quant && quant[0] ? 128 : 0, &e)) != REFIT_OK)
		return fail(rc, e.msg, errbuf, errlen);
	if (rank >= m.world) {
		char msg[160];

		snprintf(msg, sizeof(msg), "rank %d: the %s world of %s has %lld ranks", rank,
			 framework, par, (long long)m.world);
		plan_fw_map_fini(&m);
		return fail(REFIT_ERR_INVALID_ARG, msg, errbuf, errlen);
	}
	strbuf_init(&sb);
	codec_fw_map_json(&m, a.name, par, rank < 0 ? -1 : rank, &sb);
	plan_fw_map_fini(&m);
	*json = xstrdup(sb.s);
	strbuf_fini(&sb);
	return REFIT_OK;
}

void
refit_free(void *p)
{
	free(p);
}
