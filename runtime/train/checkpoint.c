/* checkpoint.c — training checkpoints (ntp_train.h): the trainer's state as a safetensors file
 * and an index that names it, replaced last, so that the index always names a complete file. */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ntp_train.h"
#include "outfile.h"

enum { CKPT_VERSION = 1 };

/* FNV-1a of a whole file and its size; -1 when it cannot be read. */
static int file_sum(const char *path, uint64_t *sum, int64_t *size) {
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  unsigned char buf[1 << 16];
  uint64_t h = NTP_FNV_BASIS;
  int64_t n = 0;
  size_t k;
  while ((k = fread(buf, 1, sizeof buf, f)) > 0) {
    h = ntp_fnv1a64(buf, k, h);
    n += (int64_t)k;
  }
  int bad = ferror(f);
  fclose(f);
  *sum = h;
  *size = n;
  return bad ? -1 : 0;
}

/* A failure injected by tests: NTP_FAILPOINT=checkpoint:STEP makes the process die (as by SIGKILL:
 * no cleanup, status 137) in the save of step STEP, between the state file and the index. */
static void failpoint(int64_t step) {
  const char *f = getenv("NTP_FAILPOINT");
  if (f && !strncmp(f, "checkpoint:", 11) && strtoll(f + 11, NULL, 10) == step) _exit(137);
}

/* NTP_FAILPOINT=checkpoint-error:STEP: the save of step STEP fails as a full disk would (the
 * caller's handling of a failed save is what tests look at). */
static bool failpoint_error(int64_t step) {
  const char *f = getenv("NTP_FAILPOINT");
  return f && !strncmp(f, "checkpoint-error:", 17) && strtoll(f + 17, NULL, 10) == step;
}

static char *join(const char *dir, const char *name) {
  size_t n = strlen(dir) + strlen(name) + 2;
  char *p = malloc(n);
  if (p) snprintf(p, n, "%s/%s", dir, name);
  return p;
}

/* The index's fields (a previous checkpoint's, to remove its predecessor). */
typedef struct ckpt_index {
  int64_t step, pos, epoch, bytes;
  uint64_t sum;
  char file[128], previous[128]; /* the state file, and the one the index named before */
} ckpt_index;

/* N of a state file's name, ckpt-N.safetensors (decimal, no sign or leading zero), else -1: the
 * only names a save ever removes, and the only ones an index may name. */
static int64_t state_step(const char *name) {
  if (strncmp(name, "ckpt-", 5) != 0) return -1;
  const char *p = name + 5;
  int64_t n = 0;
  size_t k = 0;
  for (; p[k] >= '0' && p[k] <= '9'; k++) {
    if (k == 12) return -1;
    n = n * 10 + (p[k] - '0');
  }
  if (k == 0 || (k > 1 && p[0] == '0') || strcmp(p + k, ".safetensors") != 0) return -1;
  return n;
}

/* An index field: a JSON integer in [0, hi] (json-c saturates larger numbers and reads other
 * types as numbers: both refused), else -1. */
static int64_t index_int(json_object *j, const char *key, int64_t hi) {
  json_object *v;
  if (!json_object_object_get_ex(j, key, &v) || !json_object_is_type(v, json_type_int)) return -1;
  int64_t x = json_object_get_int64(v);
  return x >= 0 && x <= hi ? x : -1;
}

static int read_index(const char *dir, ckpt_index *ix, char *err, size_t cap) {
  char *path = join(dir, "checkpoint.json");
  json_object *j = path ? json_object_from_file(path) : NULL;
  int rc = -1;
  json_object *v;
  if (!j) {
    snprintf(err, cap, "%s: no checkpoint index (checkpoint.json) there, or not JSON", dir);
    goto done;
  }
  const char *fmt = json_object_object_get_ex(j, "format", &v) ? json_object_get_string(v) : NULL;
  int64_t ver = json_object_object_get_ex(j, "version", &v) ? json_object_get_int64(v) : -1;
  if (!fmt || strcmp(fmt, "ntp-checkpoint") != 0 || ver != CKPT_VERSION) {
    snprintf(err, cap, "%s/checkpoint.json: not an ntp checkpoint index of version %d", dir, CKPT_VERSION);
    goto done;
  }
  const char *file = json_object_object_get_ex(j, "file", &v) ? json_object_get_string(v) : NULL;
  const char *sum = json_object_object_get_ex(j, "fnv1a", &v) ? json_object_get_string(v) : NULL;
  if (!file || strchr(file, '/') || strlen(file) >= sizeof ix->file || !sum) {
    snprintf(err, cap, "%s/checkpoint.json: no state file or checksum", dir);
    goto done;
  }
  snprintf(ix->file, sizeof ix->file, "%s", file);
  const char *prev = json_object_object_get_ex(j, "previous", &v) ? json_object_get_string(v) : "";
  snprintf(ix->previous, sizeof ix->previous, "%s", prev ? prev : "");
  char *end;
  ix->sum = strtoull(sum, &end, 16);
  /* bounds: steps as ntpc train takes them, positions and sizes far beyond any file, so that no
   * sum of them overflows */
  static const char *const keys[] = {"step", "data_position", "data_epoch", "bytes"};
  int64_t *dst[] = {&ix->step, &ix->pos, &ix->epoch, &ix->bytes};
  const int64_t hi[] = {1000000000, (int64_t)1 << 40, (int64_t)1 << 40, (int64_t)1 << 50};
  for (int k = 0; k < 4; k++)
    if ((*dst[k] = index_int(j, keys[k], hi[k])) < 0) {
      snprintf(err, cap, "%s/checkpoint.json: '%s' is missing, not a whole number or outside [0, %lld]", dir, keys[k],
               (long long)hi[k]);
      goto done;
    }
  if (strlen(sum) != 16 || *end) {
    snprintf(err, cap, "%s/checkpoint.json: 'fnv1a' is not 16 hex digits", dir);
    goto done;
  }
  /* the index and its state file agree on the step; 'previous' is an older state file or nothing */
  if (state_step(ix->file) != ix->step) {
    snprintf(err, cap, "%s/checkpoint.json: 'file' is '%s', not the state file of step %lld (ckpt-%lld.safetensors)",
             dir, ix->file, (long long)ix->step, (long long)ix->step);
    goto done;
  }
  int64_t ps = ix->previous[0] ? state_step(ix->previous) : -2;
  if (ps == -1 || ps >= ix->step) {
    snprintf(err, cap, "%s/checkpoint.json: 'previous' is '%.100s', not the state file of an earlier step", dir,
             ix->previous);
    goto done;
  }
  rc = 0;
done:
  json_object_put(j);
  free(path);
  return rc;
}

/* A save killed (kill -9) between creating its temporary files and renaming them leaves
 * NAME.tmpPID[.json] behind (ntp_outfile); the next save removes those of this folder's own
 * names whose process is gone. */
static void remove_stale_temporaries(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  for (struct dirent *e; (e = readdir(d));) {
    const char *t = strstr(e->d_name, ".tmp");
    if (!t) continue;
    char base[256];
    size_t bn = (size_t)(t - e->d_name);
    if (bn >= sizeof base) continue;
    memcpy(base, e->d_name, bn);
    base[bn] = 0;
    char *end;
    long pid = strtol(t + 4, &end, 10);
    bool ours = state_step(base) >= 0 ? !*end : !strcmp(base, "checkpoint.json") && !strcmp(end, ".json");
    if (!ours || end == t + 4 || pid <= 0) continue;       /* not a temporary file of a save */
    if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; /* its process may still be writing it */
    char *p = join(dir, e->d_name);
    if (p) unlink(p);
    free(p);
  }
  closedir(d);
}

int ntp_checkpoint_save(const char *dir, ntp_trainer *t, const ntp_tokens *data, char *err, size_t cap) {
  if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
    snprintf(err, cap, "cannot create checkpoint folder '%s': %s", dir, strerror(errno));
    return -1;
  }
  if (ntp_trainer_writes(t)) remove_stale_temporaries(dir);
  ckpt_index prev = {0};
  char scratch[256];
  bool had_prev = read_index(dir, &prev, scratch, sizeof scratch) == 0;
  int64_t step = ntp_trainer_steps_taken(t), pos, epoch;
  ntp_tokens_position(data, &pos, &epoch);
  char file[64];
  snprintf(file, sizeof file, "ckpt-%" PRId64 ".safetensors", step);
  char *state = join(dir, file), *index = join(dir, "checkpoint.json");
  int rc = -1;
  uint64_t sum;
  int64_t bytes;
  if (!state || !index) {
    snprintf(err, cap, "out of memory");
    goto done;
  }
  if (failpoint_error(step)) {
    snprintf(err, cap, "cannot write '%s': No space left on device (NTP_FAILPOINT)", state);
    goto done;
  }
  if (ntp_trainer_save_state(t, state, err, cap) != 0) goto done;
  if (!ntp_trainer_writes(t)) { /* one rank per process: rank 0's process writes the file and the index */
    rc = 0;
    goto done;
  }
  failpoint(step); /* a test's kill: the state file is complete, the index still names the last one */
  if (file_sum(state, &sum, &bytes) != 0) {
    snprintf(err, cap, "cannot read back '%s'", state);
    goto done;
  }
  ntp_outfile o;
  if (ntp_outfile_open(&o, index, ".json", err, cap) != 0) goto done;
  fprintf(o.f,
          "{\n  \"format\": \"ntp-checkpoint\",\n  \"version\": %d,\n  \"step\": %" PRId64 ",\n  \"file\": \"%s\",\n"
          "  \"bytes\": %" PRId64 ",\n  \"fnv1a\": \"%016" PRIx64 "\",\n  \"data_position\": %" PRId64 ",\n"
          "  \"data_epoch\": %" PRId64 ",\n  \"previous\": \"%s\"\n}\n",
          CKPT_VERSION, step, file, bytes, sum, pos, epoch, had_prev && prev.step < step ? prev.file : "");
  if (ntp_outfile_commit(&o, !ferror(o.f), err, cap) != 0) goto done;
  /* the index now names the new file: the one before the previous goes (the previous stays);
   * read_index let through only the name of a state file older than the previous one */
  if (had_prev && prev.step < step && prev.previous[0] && state_step(prev.previous) < prev.step) {
    char *p = join(dir, prev.previous);
    if (p) unlink(p);
    free(p);
  }
  rc = 0;
done:
  free(state);
  free(index);
  return rc;
}

int ntp_checkpoint_load(const char *dir, ntp_trainer *t, ntp_tokens *data, char *err, size_t cap) {
  ckpt_index ix;
  if (read_index(dir, &ix, err, cap) != 0) return -1;
  char *state = join(dir, ix.file);
  uint64_t sum;
  int64_t bytes;
  int rc = -1;
  ntp_safetensors *f = NULL;
  if (!state) {
    snprintf(err, cap, "out of memory");
    goto done;
  }
  if (file_sum(state, &sum, &bytes) != 0) {
    snprintf(err, cap, "%s: the checkpoint's state file cannot be read", state);
    goto done;
  }
  if (bytes != ix.bytes || sum != ix.sum) {
    snprintf(err, cap, "%s: %" PRId64 " bytes with checksum %016" PRIx64 ", the index says %" PRId64 " and %016" PRIx64
             " (a damaged checkpoint)", state, bytes, sum, ix.bytes, ix.sum);
    goto done;
  }
  if (!ntp_tokens_position_valid(data, ix.pos, ix.epoch)) {
    snprintf(err, cap, "%s/checkpoint.json: data position %lld (epoch %lld) is not a position of the token file of %lld "
             "tokens (another data set?)", dir, (long long)ix.pos, (long long)ix.epoch, (long long)ntp_tokens_count(data));
    goto done;
  }
  if (ntp_safetensors_open(state, &f, err, cap) != 0 || ntp_trainer_load_state(t, f, ix.step, err, cap) != 0) goto done;
  ntp_tokens_seek(data, ix.pos, ix.epoch);
  rc = 0;
done:
  ntp_safetensors_close(f);
  free(state);
  return rc;
}
