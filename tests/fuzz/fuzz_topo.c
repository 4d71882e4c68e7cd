/*
 * fuzz_topo.c - libFuzzer harness for the topology parser and presets,
 * and (inputs starting with 'J') the placement of two jobs on a preset.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "codec/json.h"

/* Jobs from the bytes after 'J'; every job rank placed, idle ranks after. */
static void
fuzz_jobs(const uint8_t *data, size_t size)
{
	static const char *const names[] = {"dgx-h100", "hgx-h200", "gb200-nvl72", "host"};
	plan_jobs_t j;
	plan_topo_t t;
	int32_t idle = -1, total;

	if (size < 6)
		return;
	j.train_ranks = data[1] % 100;        /* 0 must be refused */
	j.instances = 1 + data[2] % 16;
	j.instance_ranks = 1 + data[3] % 80;
	total = j.train_ranks + j.instances * j.instance_ranks;
	if (plan_topo_preset_jobs(&t, names[data[4] % 4], &j,
				  data[5] & 1 ? PLAN_PLACE_RACK_ALIGNED : PLAN_PLACE_PACKED,
				  &idle, NULL) != REFIT_OK) {
		if (j.train_ranks >= 1)
			abort();
		return;
	}
	if (j.train_ranks < 1 || idle < 0 || t.nranks != total + idle)
		abort();
	for (int32_t r = 0; r < total + idle; r++)
		if (plan_topo_domain(&t, r) < 0)
			abort();
	/* rack-aligned: no domain holds both jobs */
	for (int32_t r = 0; (data[5] & 1) && r < j.train_ranks; r++)
		for (int32_t q = j.train_ranks; q < total; q += j.instance_ranks)
			if (plan_topo_domain(&t, r) == plan_topo_domain(&t, q))
				abort();
	plan_topo_fini(&t);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	plan_topo_t t;
	refit_err_t e;
	char spec[64];

	if (size > 0 && data[0] == 'J')
		fuzz_jobs(data, size);
	refit_err_clear(&e);
	if (codec_topo_parse((const char *)data, size, &t, &e) == REFIT_OK)
		plan_topo_fini(&t);
	else if (e.msg[0] == '\0')
		abort();
	/* the preset spec parser too */
	if (size < sizeof(spec)) {
		memcpy(spec, data, size);
		spec[size] = '\0';
		refit_err_clear(&e);
		/* presets up to 64Ki ranks: the parser is the target, not scale */
		const char *colon = strchr(spec, ':');

		if (strlen(spec) == size && (colon == NULL || strlen(colon) <= 6) &&
		    plan_topo_preset(&t, spec, 0, &e) == REFIT_OK) {
			if (t.nranks > 0)
				plan_topo_fini(&t);
		}
	}
	return 0;
}
