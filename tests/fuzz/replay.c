/*
 * replay.c - runs a fuzz harness over files given on the command line,
 * without libFuzzer (for compilers that lack it, and for regressions).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
main(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		FILE *f = fopen(argv[i], "rb");
		static uint8_t buf[1 << 20];
		size_t n;

		if (f == NULL) {
			perror(argv[i]);
			return 1;
		}
		n = fread(buf, 1, sizeof(buf), f);
		fclose(f);
		LLVMFuzzerTestOneInput(buf, n);
	}
	printf("replayed %d inputs\n", argc - 1);
	return 0;
}
