/*
 * test_ops.c - what refitd's operations use from common/: the systemd
 * notify protocol (sdnotify.c) and JSON log lines (log.c).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/log.h"
#include "common/sdnotify.h"
#include "tests/unit/helpers.h"

START_TEST(watchdog_usec)
{
	char pid[32];

	unsetenv("WATCHDOG_USEC");
	unsetenv("WATCHDOG_PID");
	ck_assert_uint_eq(sd_watchdog_usec(), 0);
	setenv("WATCHDOG_USEC", "500000", 1);
	ck_assert_uint_eq(sd_watchdog_usec(), 500000);
	snprintf(pid, sizeof(pid), "%d", (int)getpid());
	setenv("WATCHDOG_PID", pid, 1);
	ck_assert_uint_eq(sd_watchdog_usec(), 500000);
	snprintf(pid, sizeof(pid), "%d", (int)getpid() + 1);
	setenv("WATCHDOG_PID", pid, 1);
	ck_assert_uint_eq(sd_watchdog_usec(), 0);   /* meant for another process */
	unsetenv("WATCHDOG_PID");
	setenv("WATCHDOG_USEC", "12x", 1);
	ck_assert_uint_eq(sd_watchdog_usec(), 0);
	setenv("WATCHDOG_USEC", "0", 1);
	ck_assert_uint_eq(sd_watchdog_usec(), 0);
}
END_TEST

/* A datagram socket at path (abstract when path starts with '@'). */
static int
bound(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int fd = socket(AF_UNIX, SOCK_DGRAM, 0);
	socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(path));

	ck_assert_int_ge(fd, 0);
	memcpy(sa.sun_path, path, strlen(path));
	if (path[0] == '@')
		sa.sun_path[0] = '\0';
	ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, len), 0);
	return fd;
}

START_TEST(notify_datagrams)
{
	char path[64], abs[64], buf[64];
	ssize_t n;
	int fd;

	unsetenv("NOTIFY_SOCKET");
	ck_assert_int_eq(sd_notify_send("READY=1"), 0);   /* not under systemd */
	snprintf(path, sizeof(path), "/tmp/refit-unit-notify-%d", (int)getpid());
	unlink(path);
	fd = bound(path);
	setenv("NOTIFY_SOCKET", path, 1);
	ck_assert_int_eq(sd_notify_send("WATCHDOG=1"), 1);
	n = recv(fd, buf, sizeof(buf) - 1, MSG_DONTWAIT);
	ck_assert_int_eq(n, 10);
	buf[n] = '\0';
	ck_assert_str_eq(buf, "WATCHDOG=1");
	close(fd);
	unlink(path);
	snprintf(abs, sizeof(abs), "@refit-unit-notify-%d", (int)getpid());
	fd = bound(abs);
	setenv("NOTIFY_SOCKET", abs, 1);
	ck_assert_int_eq(sd_notify_send("READY=1\nSTATUS=x"), 1);
	n = recv(fd, buf, sizeof(buf) - 1, MSG_DONTWAIT);
	ck_assert_int_eq(n, 16);
	close(fd);
	setenv("NOTIFY_SOCKET", "relative/path", 1);
	ck_assert_int_eq(sd_notify_send("READY=1"), -EINVAL);
	setenv("NOTIFY_SOCKET", path, 1);          /* nobody there any more */
	ck_assert_int_lt(sd_notify_send("READY=1"), 0);
}
END_TEST

/* What one log_emit writes to stderr, with format fmt. */
static void
capture(enum log_format fmt, const log_context_t *ctx, const char *msg, char *out, size_t cap)
{
	int p[2], saved = dup(STDERR_FILENO);
	ssize_t n;

	ck_assert_int_eq(pipe(p), 0);
	ck_assert_int_ge(dup2(p[1], STDERR_FILENO), 0);
	log_init("refitd", LOG_LVL_INFO, LOG_SUB_ALL);
	log_set_format(fmt);
	log_set_context(ctx);
	log_info("%s", msg);
	dup2(saved, STDERR_FILENO);
	close(saved);
	close(p[1]);
	n = read(p[0], out, cap - 1);
	close(p[0]);
	ck_assert_int_gt(n, 0);
	out[n] = '\0';
}

START_TEST(json_lines)
{
	char out[4096];
	log_context_t none = {NULL, -1, 0, 0}, ctx = {"n\"0", 3, 7, 0};
	const char *nl;

	capture(LOG_FMT_JSON, &none, "coordinator: refit 42 (m v1): COMMITTED", out, sizeof(out));
	ck_assert_msg(strncmp(out, "{\"time\":\"", 9) == 0, "%s", out);
	ck_assert_msg(strstr(out, "\"level\":\"info\",\"subsystem\":\"coordinator\",\"node\":null,"
			     "\"epoch\":null,\"refit\":42,\"message\":\"coordinator: refit 42 "
			     "(m v1): COMMITTED\"}\n") != NULL, "%s", out);
	/* escapes, a stray byte, the context; still one line */
	capture(LOG_FMT_JSON, &ctx, "node x: a \"b\"\\ c\nd \xff e", out, sizeof(out));
	ck_assert_msg(strstr(out, "\"subsystem\":\"node\",\"node\":\"n\\\"0\",\"rank\":3,"
			     "\"epoch\":7,\"refit\":null,") != NULL, "%s", out);
	ck_assert_msg(strstr(out, "\"message\":\"node x: a \\\"b\\\"\\\\ c\\u000ad ? e\"}") != NULL,
		      "%s", out);
	nl = strchr(out, '\n');
	ck_assert(nl != NULL && nl[1] == '\0');
	/* text stays as it was */
	capture(LOG_FMT_TEXT, &ctx, "hello", out, sizeof(out));
	ck_assert_str_eq(out, "refitd: info: node=n\"0 rank=3 epoch=7 hello\n");
	/* the process's node and epoch where the thread has none; the thread's win */
	log_set_node("p0");
	log_set_epoch(9);
	capture(LOG_FMT_TEXT, &none, "hello", out, sizeof(out));
	ck_assert_str_eq(out, "refitd: info: node=p0 epoch=9 hello\n");
	capture(LOG_FMT_JSON, &ctx, "hello", out, sizeof(out));
	ck_assert_msg(strstr(out, "\"node\":\"n\\\"0\",\"rank\":3,\"epoch\":7,") != NULL, "%s", out);
	log_set_node(NULL);
	log_set_epoch(0);
}
END_TEST

Suite *
suite_ops(void)
{
	return th_suite("ops", th_tcase("ops", 0, TH_TESTS(watchdog_usec, notify_datagrams,
			json_lines)), NULL);
}
