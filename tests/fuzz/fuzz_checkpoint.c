/* fuzz_checkpoint.c — training checkpoints (runtime/train/checkpoint.c): the index, the state file
 * reader, a resume, a step, and a save over the folder.
 *
 * Input: byte 0's bits: 1 the state file is the input's rest (else a valid one, saved at start
 * up); 2 the index is written from fields of the input with the right size and checksum (else
 * the index is the input's text, up to a NUL); 4 a training step and a save follow a load.
 * Fields (bit 2): step, data position (4 bytes each), epoch (1), the names of 'file' and
 * 'previous' (one byte each, from a list of good and hostile names).
 *
 * Invariants: a save never removes a file other than an older ckpt-N state file (the folder
 * holds sentinels: notes.txt, a state file of a later step); a folder just saved loads. */
#include <dirent.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz_common.h"
#include "ntp_train.h"
#include "ntpc.h"
#include "ntprt.h"
#include "session_program.h"

static const char model[] = "model t {\n  dim B = 1, S = 4, D = 4, V = 8;\n  dtype fp32;\n"
                            "  input tokens : i32[B, S];\n  input targets : i32[B, S];\n"
                            "  x = embed: embedding(tokens, vocab = V, dim = D);\n"
                            "  logits = head: linear(x, out = V);\n"
                            "  output loss = cross_entropy(logits, targets);\n}\n";

static ntp_program *prog;
static ntp_trainer *tr;
static ntp_tokens *data;
static unsigned char *state; /* a valid state file of step 1 */
static size_t state_len;
static char dir[128], tokens_path[160];

static void write_file(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f || (n && fwrite(p, 1, n, f) != n)) abort();
  fclose(f);
}

static void clear_dir(void) {
  DIR *d = opendir(dir);
  for (struct dirent *e; d && (e = readdir(d));) {
    if (e->d_name[0] == '.') continue;
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    unlink(p);
  }
  if (d) closedir(d);
}

static bool exists(const char *name) {
  char p[512];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  return access(p, F_OK) == 0;
}

/* one step on fixed tokens */
static int step(void) {
  const ntp_module *m = &prog->global;
  const ntp_host_tensor **given = calloc(m->n_values, sizeof *given);
  int32_t tok[4] = {1, 2, 3, 4}, tgt[4] = {2, 3, 4, 5};
  ntp_host_tensor ht[2];
  int k = 0;
  for (size_t i = 0; i < m->n_ops && given; i++)
    if (m->ops[i].code == IR_INPUT && k < 2) {
      int32_t v = m->ops[i].result;
      ht[k] = (ntp_host_tensor){.name = m->values[v].name, .dtype = NTP_I32, .shape = m->values[v].shape,
                                .i = strcmp(m->values[v].name, "targets") ? tok : tgt};
      given[v] = &ht[k++];
    }
  char err[512];
  ntp_train_stats st;
  int rc = given ? ntp_trainer_step(tr, given, 0, &st, err, sizeof err) : -1;
  free(given);
  return rc;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  char err[512];
  ntpc_session *s = ntpc_session_new();
  ntpc_want_grad(s, true);
  if (ntpc_compile_string(s, "t.ntp", model) != NTPC_OK || !(prog = session_program(s, err, sizeof err))) {
    ntpc_print_diags(s, stderr, 0);
    abort();
  }
  ntpc_session_free(s);
  ntp_adamw aw;
  ntp_adamw_defaults(&aw);
  aw.steps = 1000;
  if (ntp_trainer_new(prog, &aw, 1, NULL, NULL, &tr, err, sizeof err) != 0) abort();
  snprintf(tokens_path, sizeof tokens_path, "/tmp/ntp_fuzz_ckpt_%ld.bin", (long)getpid());
  uint16_t ids[64];
  for (int i = 0; i < 64; i++) ids[i] = (uint16_t)(i * 5 % 8);
  if (ntp_tokens_save(tokens_path, ids, 64, err, sizeof err) != 0 || ntp_tokens_open(tokens_path, &data, err, sizeof err))
    abort();
  snprintf(dir, sizeof dir, "/tmp/ntp_fuzz_ckpt_%ld", (long)getpid());
  mkdir(dir, 0777);
  clear_dir();
  if (step() != 0 || ntp_checkpoint_save(dir, tr, data, err, sizeof err) != 0) abort();
  char p[512];
  snprintf(p, sizeof p, "%s/ckpt-1.safetensors", dir);
  FILE *f = fopen(p, "rb");
  if (!f || fseek(f, 0, SEEK_END) != 0) abort();
  state_len = (size_t)ftell(f);
  rewind(f);
  if (!(state = malloc(state_len)) || fread(state, 1, state_len, f) != state_len) abort();
  fclose(f);
  return 0;
}

static uint32_t u32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

int LLVMFuzzerTestOneInput(const uint8_t *in, size_t size) {
  if (size < 1 || size > 1 << 16) return 0;
  static const char *const names[] = {"ckpt-1.safetensors", "ckpt-0.safetensors", "ckpt-2.safetensors",
                                      "checkpoint.json",    "notes.txt",          "ckpt-01.safetensors",
                                      "ckpt-1.safetensorsx", "../x",              "",
                                      "ckpt-99999999999999.safetensors"};
  enum { NN = sizeof names / sizeof names[0] };
  uint8_t mode = in[0];
  const uint8_t *p = in + 1;
  size_t left = size - 1;
  char index[1024], sp[512];
  clear_dir();
  snprintf(sp, sizeof sp, "%s/notes.txt", dir);
  write_file(sp, "keep", 4);
  snprintf(sp, sizeof sp, "%s/ckpt-900.safetensors", dir);
  write_file(sp, "later", 5);
  const char *file = names[0];
  const unsigned char *st = state;
  size_t st_len = state_len;
  if (mode & 2) {
    if (left < 11) return 0;
    uint32_t stepn = u32(p), pos = u32(p + 4);
    file = names[p[9] % NN];
    snprintf(index, sizeof index,
             "{\"format\": \"ntp-checkpoint\", \"version\": 1, \"step\": %" PRIu32 ", \"file\": \"%s\", \"bytes\": 0, "
             "\"fnv1a\": \"0\", \"data_position\": %" PRIu32 ", \"data_epoch\": %u, \"previous\": \"%s\"}\n",
             stepn, file, pos, p[8], names[p[10] % NN]);
    p += 11, left -= 11;
  } else {
    size_t n = strnlen((const char *)p, left);
    if (n >= sizeof index) n = sizeof index - 1;
    memcpy(index, p, n);
    index[n] = 0;
    p += n + (n < left), left -= n + (n < left);
    file = "ckpt-1.safetensors";
  }
  if (mode & 1) st = p, st_len = left;
  if (*file && !strchr(file, '/')) {
    snprintf(sp, sizeof sp, "%s/%s", dir, file);
    write_file(sp, st, st_len);
  }
  if (mode & 2) { /* the right size and checksum for what the index names */
    char fixed[1024];
    uint64_t h = ntp_fnv1a64(st, st_len, NTP_FNV_BASIS);
    char *b = strstr(index, "\"bytes\": 0, \"fnv1a\": \"0\"");
    if (!b) abort();
    *b = 0;
    snprintf(fixed, sizeof fixed, "%s\"bytes\": %zu, \"fnv1a\": \"%016" PRIx64 "\"%s", index, st_len, h,
             b + strlen("\"bytes\": 0, \"fnv1a\": \"0\""));
    memcpy(index, fixed, sizeof index);
    index[sizeof index - 1] = 0;
  }
  snprintf(sp, sizeof sp, "%s/checkpoint.json", dir);
  write_file(sp, index, strlen(index));
  char err[512];
  if (ntp_checkpoint_load(dir, tr, data, err, sizeof err) == 0 && (mode & 4) &&
      ntp_trainer_steps_taken(tr) < 100000 && step() == 0) {
    if (ntp_checkpoint_save(dir, tr, data, err, sizeof err) == 0) {
      if (!exists("notes.txt") || !exists("ckpt-900.safetensors")) {
        fprintf(stderr, "fuzz_checkpoint: a save deleted a file that is not an older state file\n");
        abort();
      }
      if (ntp_checkpoint_load(dir, tr, data, err, sizeof err) != 0) {
        fprintf(stderr, "fuzz_checkpoint: a folder just saved does not load: %s\n", err);
        abort();
      }
    }
  }
  return 0;
}
