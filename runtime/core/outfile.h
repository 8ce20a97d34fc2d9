/* outfile.h — output files written whole or not at all: a temporary file beside the target,
 * renamed onto it only when everything was written. Shared by the CLI (emitted text, model
 * libraries, plans) and the runtime (safetensors, dumps). */
#ifndef NTP_OUTFILE_H
#define NTP_OUTFILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

typedef struct ntp_outfile {
  char *path; /* the target */
  char *tmp;  /* PATH.tmpPID[SUFFIX], created exclusively */
  FILE *f;
} ntp_outfile;

/* Refuses a target that exists and is not a regular file (a FIFO, a device, a directory, a
 * symbolic link: renaming onto it would replace it), then creates the temporary file.
 * suffix (may be NULL) ends the temporary name, for tools that look at the extension.
 * 0, or -1 with err set. */
int ntp_outfile_open(ntp_outfile *o, const char *path, const char *suffix, char *err, size_t cap);
/* Closes and renames onto the target; on any failure removes the temporary file. ok: the
 * caller's own writes succeeded. 0, or -1 with err set (nothing written then). */
int ntp_outfile_commit(ntp_outfile *o, bool ok, char *err, size_t cap);
/* Closes and removes the temporary file. */
void ntp_outfile_abort(ntp_outfile *o);
/* 0 when path does not exist or is a regular file; else -1 with err saying what it is. */
int ntp_outfile_check_target(const char *path, char *err, size_t cap);

/* Temporary files to remove if the process is killed (SIGTERM, SIGINT, SIGHUP) before it
 * renames or removes them: the CLI installs the handler, every ntp_outfile registers. */
void ntp_outfile_install_cleanup(void);
void ntp_outfile_track(const char *path);   /* also for other transient files (FILE.c) */
void ntp_outfile_untrack(const char *path);
/* A child process (the C compiler) writing one of them: stopped and waited for first; 0: none. */
void ntp_outfile_set_child(long pid);

#endif
