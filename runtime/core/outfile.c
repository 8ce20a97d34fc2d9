/* outfile.c — temporary-then-rename output files, and their removal on a fatal signal. */
#include "outfile.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- cleanup on signals -------------------------------------------------------------- */

/* A fixed table, so that the handler touches no allocator: a few files live at once. */
enum { MAX_TRACKED = 8, MAX_PATH_LEN = 4096 };
static char tracked[MAX_TRACKED][MAX_PATH_LEN];
static volatile sig_atomic_t in_use[MAX_TRACKED];

void ntp_outfile_track(const char *path) {
  if (!path || strlen(path) >= MAX_PATH_LEN) return;
  for (int i = 0; i < MAX_TRACKED; i++)
    if (!in_use[i]) {
      memcpy(tracked[i], path, strlen(path) + 1);
      in_use[i] = 1;
      return;
    }
}

void ntp_outfile_untrack(const char *path) {
  for (int i = 0; path && i < MAX_TRACKED; i++)
    if (in_use[i] && strcmp(tracked[i], path) == 0) in_use[i] = 0;
}

static volatile sig_atomic_t child_pid;

void ntp_outfile_set_child(long pid) { child_pid = (sig_atomic_t)pid; }

static void on_fatal_signal(int sig) {
  if (child_pid > 0) { /* it may still be writing a tracked file: stop it before removing them */
    kill((pid_t)child_pid, SIGTERM);
    waitpid((pid_t)child_pid, NULL, 0);
  }
  for (int i = 0; i < MAX_TRACKED; i++)
    if (in_use[i]) unlink(tracked[i]); /* async-signal-safe */
  signal(sig, SIG_DFL);
  raise(sig);
}

void ntp_outfile_install_cleanup(void) {
  static const int sigs[] = {SIGTERM, SIGINT, SIGHUP};
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_fatal_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(sigs[i], &sa, NULL);
  }
}

/* ---- output files --------------------------------------------------------------------- */

int ntp_outfile_check_target(const char *path, char *err, size_t cap) {
  struct stat sb;
  if (lstat(path, &sb) != 0) {
    if (errno == ENOENT) return 0;
    snprintf(err, cap, "cannot write '%s': %s", path, strerror(errno));
    return -1;
  }
  if (S_ISREG(sb.st_mode)) return 0;
  const char *what = S_ISLNK(sb.st_mode)    ? "a symbolic link"
                     : S_ISDIR(sb.st_mode)  ? "a directory"
                     : S_ISFIFO(sb.st_mode) ? "a FIFO"
                     : S_ISCHR(sb.st_mode)  ? "a character device"
                     : S_ISBLK(sb.st_mode)  ? "a block device"
                     : S_ISSOCK(sb.st_mode) ? "a socket"
                                            : "not a regular file";
  snprintf(err, cap, "cannot write '%s': it exists and is %s; only a regular file is replaced", path, what);
  return -1;
}

int ntp_outfile_open(ntp_outfile *o, const char *path, const char *suffix, char *err, size_t cap) {
  *o = (ntp_outfile){0};
  if (ntp_outfile_check_target(path, err, cap) != 0) return -1;
  size_t n = strlen(path) + (suffix ? strlen(suffix) : 0) + 32;
  o->path = malloc(strlen(path) + 1);
  o->tmp = malloc(n);
  if (!o->path || !o->tmp) {
    snprintf(err, cap, "cannot write '%s': out of memory", path);
    ntp_outfile_abort(o);
    return -1;
  }
  memcpy(o->path, path, strlen(path) + 1);
  snprintf(o->tmp, n, "%s.tmp%ld%s", path, (long)getpid(), suffix ? suffix : "");
  /* O_EXCL | O_NOFOLLOW: never through a link or onto something already there */
  int fd = open(o->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0666);
  /* a replaced file keeps its permissions (a read-only output stays read-only) */
  struct stat sb;
  if (fd >= 0 && stat(path, &sb) == 0) fchmod(fd, sb.st_mode & 07777);
  if (fd < 0 || !(o->f = fdopen(fd, "wb"))) {
    snprintf(err, cap, "cannot write '%s': %s", path, strerror(errno));
    if (fd >= 0) {
      close(fd);
      unlink(o->tmp);
    }
    free(o->tmp);
    o->tmp = NULL; /* not ours to remove */
    ntp_outfile_abort(o);
    return -1;
  }
  ntp_outfile_track(o->tmp);
  return 0;
}

int ntp_outfile_commit(ntp_outfile *o, bool ok, char *err, size_t cap) {
  int saved = 0;
  if (o->f) {
    if (fclose(o->f) != 0) {
      ok = false;
      saved = errno;
    }
    o->f = NULL;
  }
  /* checked again: the target may have been replaced while we wrote */
  if (ok && ntp_outfile_check_target(o->path, err, cap) != 0) {
    ntp_outfile_abort(o);
    return -1;
  }
  if (!ok || rename(o->tmp, o->path) != 0) {
    if (ok) saved = errno;
    snprintf(err, cap, "cannot write '%s'%s%s", o->path, saved ? ": " : "", saved ? strerror(saved) : "");
    ntp_outfile_abort(o);
    return -1;
  }
  ntp_outfile_untrack(o->tmp);
  free(o->tmp);
  free(o->path);
  *o = (ntp_outfile){0};
  return 0;
}

void ntp_outfile_abort(ntp_outfile *o) {
  if (o->f) fclose(o->f);
  if (o->tmp) {
    unlink(o->tmp);
    ntp_outfile_untrack(o->tmp);
  }
  free(o->tmp);
  free(o->path);
  *o = (ntp_outfile){0};
}
