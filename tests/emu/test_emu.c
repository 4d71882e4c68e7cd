/*
 * test_emu.c - the driver of the emulator's rule tests (test_cuda.c,
 * test_cuda_hw.c, test_nccl.c): for each rule a program that breaks it and a
 * check that the emulator catches it, plus the correct paths (byte-exact copies, IPC and
 * exchanges between processes).
 *
 * Each test runs in its own process (a dead context or a leak stays there)
 * with its own REFIT_EMU_DIR, under alarm(); multi-process tests fork their
 * ranks before touching the emulator.  Usage: test-emu [name-substring].
 * Ends with "emu: N passed, N failed".  The stderr of a failed test is
 * printed; that of a passing one is dropped.
 */
#include "tests/emu/test_emu.h"

char tdir[200];

/* ---- helpers --------------------------------------------------------------------- */

int64_t
now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

pid_t
spawn(void (*fn)(int), int arg, const char *hostid)
{
	pid_t pid = fork();

	CK(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0) {
		if (hostid)
			setenv("NCCL_HOSTID", hostid, 1);
		fn(arg);
		exit(0);
	}
	return pid;
}

/* wait for pid; its exit status (or 128 + signal) */

int
reap(pid_t pid)
{
	int st;

	CK(waitpid(pid, &st, 0) == pid, "waitpid: %s", strerror(errno));
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

void
reap_ok(pid_t pid)
{
	int rc = reap(pid);

	CK(rc == 0, "helper process %d ended with %d", (int)pid, rc);
}

void
put(int fd, const void *p, size_t n)
{
	CK(write(fd, p, n) == (ssize_t)n, "pipe write: %s", strerror(errno));
}

void
get(int fd, void *p, size_t n)
{
	size_t off = 0;

	while (off < n) {
		ssize_t r = read(fd, (char *)p + off, n - off);

		CK(r > 0, "pipe read: %s", r ? strerror(errno) : "closed");
		off += (size_t)r;
	}
}

/* the communicator's state once it leaves ncclInProgress (or after ms) */

ncclResult_t
wait_comm(ncclComm_t c, int ms)
{
	int64_t end = now_ms() + ms;
	ncclResult_t st = ncclInProgress;

	while (now_ms() < end) {
		NCIS(ncclCommGetAsyncError(c, &st), ncclSuccess);
		if (st != ncclInProgress)
			return st;
		usleep(1000);
	}
	return st;
}

cudaError_t
wait_stream(cudaStream_t s, int ms)
{
	int64_t end = now_ms() + ms;
	cudaError_t e = cudaErrorNotReady;

	while (now_ms() < end && (e = cudaStreamQuery(s)) == cudaErrorNotReady)
		usleep(1000);
	return e;
}

void *
dev_alloc(size_t n)
{
	void *d;

	CU(cudaMalloc(&d, n));
	return d;
}

cudaStream_t
stream_nb(void)
{
	cudaStream_t s;

	CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	return s;
}

ncclConfig_t
nonblocking(void)
{
	ncclConfig_t c = NCCL_CONFIG_INITIALIZER;

	c.blocking = 0;
	return c;
}

void
fill(uint8_t *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(seed * 131 + i * 7 + (i >> 8));
}

refitEmuCounters_t
counters(void)
{
	refitEmuCounters_t c;

	CK(refitEmuGetCounters(&c) == 0, "refitEmuGetCounters");
	return c;
}

/* ---- the driver ------------------------------------------------------------------------------ */

static int
rm_one(const char *p, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	return remove(p);
}

static void
set_env(const char *spec)
{
	char buf[300], *save = NULL;

	snprintf(buf, sizeof(buf), "%s", spec ? spec : "");
	for (char *t = strtok_r(buf, " ", &save); t; t = strtok_r(NULL, " ", &save)) {
		char *eq = strchr(t, '=');

		if (eq) {
			*eq = 0;
			setenv(t, eq + 1, 1);
		}
	}
}

/* Run one test in a child; 0 passed. */

static int
run_one(const test_t *t)
{
	char log[300];
	pid_t pid;
	int rc;

	snprintf(tdir, sizeof(tdir), "/tmp/refit-emu-test-XXXXXX");
	if (mkdtemp(tdir) == NULL) {
		perror("mkdtemp");
		return 1;
	}
	snprintf(log, sizeof(log), "%s/stderr.log", tdir);
	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);

		if (fd >= 0)
			dup2(fd, 2);
		setpgid(0, 0);
		setenv("REFIT_EMU_DIR", tdir, 1);
		setenv("REFIT_EMU_DEVICES", "4", 1);
		setenv("REFIT_EMU_DELAY_US", "50-300", 1);
		setenv("NCCL_HOSTID", "hostA", 1);
		unsetenv("REFIT_EMU_COUNTERS");
		set_env(t->env);
		alarm(60);
		t->fn();
		exit(0); /* atexit: counters, leak checks of sanitizer builds */
	}
	rc = reap(pid);
	kill(-pid, SIGKILL); /* helpers left behind */
	if (rc != 0) {
		char line[512];
		FILE *f = fopen(log, "r");

		printf("FAIL %s (status %d)\n", t->name, rc);
		while (f && fgets(line, sizeof(line), f))
			printf("    %s", line);
		if (f)
			fclose(f);
	} else {
		printf("ok   %s\n", t->name);
	}
	nftw(tdir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
	return rc != 0;
}

int
main(int argc, char **argv)
{
	const struct {
		const test_t *v;
		size_t n;
	} tabs[] = {{cuda_tests, ncuda_tests}, {hw_tests, nhw_tests}, {ev_tests, nev_tests},
		     {nccl_tests, nnccl_tests}};
	int pass = 0, fail = 0;

	setvbuf(stdout, NULL, _IOLBF, 0);
	for (size_t k = 0; k < sizeof(tabs) / sizeof(tabs[0]); k++)
		for (size_t i = 0; i < tabs[k].n; i++) {
			const test_t *t = &tabs[k].v[i];

			if (argc > 1 && strstr(t->name, argv[1]) == NULL)
				continue;
			if (run_one(t))
				fail++;
			else
				pass++;
		}
	printf("emu: %d passed, %d failed\n", pass, fail);
	return fail != 0;
}
