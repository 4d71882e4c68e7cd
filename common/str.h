/*
 * str.h - small helpers over C strings.  libc only.
 */
#ifndef REFIT_COMMON_STR_H
#define REFIT_COMMON_STR_H

/* s, or "" where s is NULL (strings of protobuf-c messages built in C,
 * optional config keys): for printing and comparing. */
static inline const char *
str_nz(const char *s)
{
	return s ? s : "";
}

#endif
