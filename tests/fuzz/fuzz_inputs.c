/* fuzz_inputs.c — a model's inputs from files (runtime/io/inputs.c) and the token reader of
 * training (runtime/train/tokens.c). Byte 0 picks the reader: a .npy array (for the fixture's token
 * input, or named), an llm.c token file through --inputs, text, or the token reader of `ntpc
 * train` (batches, shuffled or not, a seek to a position from the input, the vocabulary check).
 * The rest is the file. What a reader accepts must hold: ids read as inputs lie in the model's
 * vocabulary, a batch's targets are its tokens shifted by one. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "abi_fixture.h"
#include "fuzz_common.h"
#include "ntp_train.h"
#include "ntprt.h"

static abi_fixture fx;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  if (abi_fixture_init(&fx, 1) != 0) abort();
  return 0;
}

/* Every id given to the fixture's token input is in [0, 16), its vocabulary. */
static void check_given(const ntp_module *m, ntp_host_tensor **given) {
  for (size_t v = 0; v < m->n_values; v++)
    if (given[v] && given[v]->dtype == NTP_I32)
      for (int64_t i = 0; i < shape_numel(&given[v]->shape); i++)
        if (given[v]->i[i] < 0 || given[v]->i[i] >= 16) abort();
}

static void tokens_reader(const uint8_t *data, size_t size) {
  if (size < 6) return;
  int64_t rows = 1 + data[0] % 4, len = 1 + data[1] % 8, vocab = 1 + (data[2] | data[3] << 8);
  bool shuffle = data[4] & 1;
  int64_t seek = data[5];
  char err[512];
  ntp_tokens *d = NULL;
  if (ntp_tokens_open(fuzz_file(data + 6, size - 6, ".bin"), &d, err, sizeof err) != 0) return;
  if (shuffle) ntp_tokens_shuffle(d, data[4]);
  bool vocab_ok = ntp_tokens_check_vocab(d, vocab, err, sizeof err) == 0;
  int32_t tok[32], tgt[32];
  for (int step = 0; step < 6; step++) {
    if (step == 3 && ntp_tokens_position_valid(d, seek, 0)) ntp_tokens_seek(d, seek, 0);
    int rc = ntp_tokens_next(d, rows, len, vocab, tok, tgt, err, sizeof err);
    if (rc == 0 && !vocab_ok) {
      /* a batch may avoid the bad id; what it holds is still in the vocabulary */
    }
    if (rc != 0) break;
    for (int64_t i = 0; i < rows * len; i++) {
      if (tok[i] < 0 || tok[i] >= vocab || tgt[i] < 0 || tgt[i] >= vocab) abort();
      if (i + 1 < rows * len && tgt[i] != tok[i + 1]) abort(); /* the targets: the next token */
    }
  }
  if (ntp_tokens_count(d) > 0 && vocab_ok) {
    int64_t pos, epoch;
    ntp_tokens_position(d, &pos, &epoch);
    if (!ntp_tokens_position_valid(d, pos, epoch)) abort(); /* what a checkpoint records is valid */
  }
  ntp_tokens_close(d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1 || size > 1 << 20) return 0;
  const ntp_module *m = &fx.prog->global;
  int which = data[0] % 5;
  if (which == 4) {
    tokens_reader(data + 1, size - 1);
    return 0;
  }
  static const char *const ext[] = {".npy", ".npy", ".bin", ".txt"};
  const char *path = fuzz_file(data + 1, size - 1, ext[which]);
  char spec[300];
  snprintf(spec, sizeof spec, which == 1 ? "tokens=%s" : "%s", path);
  ntp_host_tensor **given = calloc(m->n_values, sizeof *given);
  if (!given) abort();
  char err[512];
  if (ntp_inputs_load(m, spec, given, err, sizeof err) == 0) check_given(m, given);
  ntp_inputs_free(m, given);
  if (which == 3 && ntp_inputs_text(m, (const char *)data + 1, size - 1, given, err, sizeof err) == 0)
    check_given(m, given);
  ntp_inputs_free(m, given);
  free(given);
  return 0;
}
