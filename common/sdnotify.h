/*
 * sdnotify.h - systemd's notify protocol, without libsystemd: one datagram
 * to the AF_UNIX socket named by $NOTIFY_SOCKET ("/path" or "@abstract").
 * READY=1, STOPPING=1, STATUS=..., WATCHDOG=1.
 */
#ifndef REFIT_COMMON_SDNOTIFY_H
#define REFIT_COMMON_SDNOTIFY_H

#include <stdint.h>

/* Send msg; 1 sent, 0 no $NOTIFY_SOCKET (not under systemd), -errno on failure. */
int sd_notify_send(const char *msg);
/* The watchdog interval systemd asks for ($WATCHDOG_USEC, when $WATCHDOG_PID
 * is unset or this process), in microseconds; 0: no watchdog. */
uint64_t sd_watchdog_usec(void);

#endif
