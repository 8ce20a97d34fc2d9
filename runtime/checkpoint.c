/* checkpoint.c — training checkpoints (ntp_train.h): the trainer's state as a safetensors file
 * and an index that names it, replaced last, so that the index always names a complete file. */
#include <errno.h>
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
  snprintf(ix->previous, sizeof ix->previous, "%s", prev && !strchr(prev, '/') ? prev : "");
  ix->sum = strtoull(sum, NULL, 16);
  ix->step = json_object_object_get_ex(j, "step", &v) ? json_object_get_int64(v) : -1;
  ix->pos = json_object_object_get_ex(j, "data_position", &v) ? json_object_get_int64(v) : -1;
  ix->epoch = json_object_object_get_ex(j, "data_epoch", &v) ? json_object_get_int64(v) : -1;
  ix->bytes = json_object_object_get_ex(j, "bytes", &v) ? json_object_get_int64(v) : -1;
  if (ix->step < 0 || ix->pos < 0 || ix->epoch < 0 || ix->bytes < 0) {
    snprintf(err, cap, "%s/checkpoint.json: a field is missing or negative", dir);
    goto done;
  }
  rc = 0;
done:
  json_object_put(j);
  free(path);
  return rc;
}

int ntp_checkpoint_save(const char *dir, ntp_trainer *t, const ntp_tokens *data, char *err, size_t cap) {
  if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
    snprintf(err, cap, "cannot create checkpoint folder '%s': %s", dir, strerror(errno));
    return -1;
  }
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
          CKPT_VERSION, step, file, bytes, sum, pos, epoch, had_prev && prev.step != step ? prev.file : "");
  if (ntp_outfile_commit(&o, !ferror(o.f), err, cap) != 0) goto done;
  /* the index now names the new file: the one before the previous goes (the previous stays) */
  if (had_prev && prev.step != step && prev.previous[0] && strcmp(prev.previous, file) != 0 &&
      strcmp(prev.previous, prev.file) != 0) {
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
  if (ntp_safetensors_open(state, &f, err, cap) != 0 || ntp_trainer_load_state(t, f, ix.step, err, cap) != 0) goto done;
  ntp_tokens_seek(data, ix.pos, ix.epoch);
  rc = 0;
done:
  ntp_safetensors_close(f);
  free(state);
  return rc;
}
