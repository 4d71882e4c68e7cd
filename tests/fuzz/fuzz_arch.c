/*
 * fuzz_arch.c - libFuzzer harness for architecture files; an architecture
 * that parses is turned into layouts for a small parallel layout, which
 * must cover every element.
 */
#include <stdint.h>
#include <stdlib.h>

#include "codec/json.h"

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	plan_arch_t a;
	plan_par_t tr, in;
	plan_layout_set_t s, d;
	refit_err_t e;

	refit_err_clear(&e);
	if (codec_arch_parse((const char *)data, size, &a, &e) != REFIT_OK) {
		if (e.msg[0] == '\0')
			abort();
		return 0;
	}
	/* keep generation small: few layers, small shapes */
	if (a.layers > 4 || a.hidden > 256 || a.vocab > 1024 || a.heads > 32 ||
	    a.experts > 64 || a.intermediate > 1024 || a.expert_intermediate > 512 ||
	    a.head_dim > 128 || a.kv_heads > 32 || a.q_lora_rank > 256 ||
	    a.kv_lora_rank > 256 || a.qk_nope_dim > 128 || a.qk_rope_dim > 128 ||
	    a.v_head_dim > 128 || a.shared_experts > 4)
		return 0;
	if (plan_par_parse("tp2,pp2,ep2", true, &tr, NULL) != REFIT_OK ||
	    plan_par_parse("tp2,dp2", false, &in, NULL) != REFIT_OK)
		abort();
	plan_layout_set_init(&s);
	plan_layout_set_init(&d);
	if (plan_model_layouts(&a, &tr, &in, &s, &d, &e) == REFIT_OK) {
		for (size_t i = 0; i < s.n; i++)
			if (plan_layout_check_coverage(&s.v[i], NULL) != REFIT_OK)
				abort();
	} else if (e.msg[0] == '\0') {
		abort();
	}
	plan_layout_set_fini(&s);
	plan_layout_set_fini(&d);
	return 0;
}
