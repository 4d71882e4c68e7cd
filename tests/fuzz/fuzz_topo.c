/*
 * fuzz_topo.c - libFuzzer harness for the topology parser and presets.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "codec/json.h"

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	plan_topo_t t;
	refit_err_t e;
	char spec[64];

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
