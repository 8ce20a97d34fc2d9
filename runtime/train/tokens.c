/* tokens.c — llm.c's token files (ntp_train.h): a 256-int32 header (magic 20240520, version 1,
 * token count), then uint16 token ids; read whole, served as batches of consecutive windows. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ntp_train.h"
#include "outfile.h"

enum { MAGIC = 20240520, VERSION = 1, HEADER_INTS = 256 };

struct ntp_tokens {
  uint16_t *ids;
  int64_t n;
  int64_t pos;     /* the next window's start (in order), or its index in the order (shuffled) */
  int64_t *order;  /* shuffled: window starts of this epoch */
  int64_t norder, window, epoch;
  uint64_t seed;
  bool shuffle;
};

static uint32_t le32(const unsigned char *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

int ntp_tokens_open(const char *path, ntp_tokens **out, char *err, size_t cap) {
  *out = NULL;
  FILE *f = fopen(path, "rb");
  if (!f) {
    snprintf(err, cap, "cannot open token file '%s'", path);
    return -1;
  }
  unsigned char h[HEADER_INTS * 4];
  ntp_tokens *d = NULL;
  if (fread(h, 1, sizeof h, f) != sizeof h) {
    snprintf(err, cap, "%s: shorter than a token file's header (%d bytes)", path, HEADER_INTS * 4);
    goto fail;
  }
  uint32_t magic = le32(h), version = le32(h + 4), count = le32(h + 8);
  if (magic != MAGIC || version != VERSION) {
    snprintf(err, cap, "%s: not an llm.c token file (magic %u version %u; expected %d version %d)", path, magic, version,
             MAGIC, VERSION);
    goto fail;
  }
  if (fseek(f, 0, SEEK_END) != 0) goto io;
  long size = ftell(f);
  if (size < 0 || (uint64_t)size != sizeof h + 2 * (uint64_t)count) {
    snprintf(err, cap, "%s: the header announces %u tokens (%llu bytes), the file has %ld bytes", path, count,
             (unsigned long long)(sizeof h + 2 * (uint64_t)count), size);
    goto fail;
  }
  d = calloc(1, sizeof *d);
  if (!d || !(d->ids = malloc(2 * (size_t)(count ? count : 1)))) {
    snprintf(err, cap, "out of memory for %u tokens", count);
    goto fail;
  }
  if (fseek(f, (long)sizeof h, SEEK_SET) != 0 || fread(d->ids, 2, count, f) != count) goto io;
  for (uint32_t i = 0; i < count; i++) { /* little-endian on disk */
    const unsigned char *b = (const unsigned char *)&d->ids[i];
    d->ids[i] = (uint16_t)(b[0] | b[1] << 8);
  }
  d->n = count;
  fclose(f);
  *out = d;
  return 0;
io:
  snprintf(err, cap, "%s: read error", path);
fail:
  if (d) free(d->ids);
  free(d);
  fclose(f);
  return -1;
}

int64_t ntp_tokens_count(const ntp_tokens *d) { return d->n; }

int ntp_tokens_ids(const ntp_tokens *d, int64_t *ids, int64_t n) {
  if (n > d->n) return -1;
  for (int64_t i = 0; i < n; i++) ids[i] = d->ids[i];
  return 0;
}

void ntp_tokens_shuffle(ntp_tokens *d, uint64_t seed) {
  d->shuffle = true;
  d->seed = seed;
}

static uint64_t mix(uint64_t x) { /* splitmix64 */
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* This epoch's window starts, in a Fisher-Yates order drawn from (seed, epoch). */
static int new_order(ntp_tokens *d, int64_t window) {
  int64_t nw = (d->n - 1) / window;
  if (d->norder != nw) {
    free(d->order);
    if (!(d->order = malloc((size_t)nw * sizeof *d->order))) return -1;
    d->norder = nw;
  }
  for (int64_t i = 0; i < nw; i++) d->order[i] = i * window;
  uint64_t state = mix(d->seed ^ mix((uint64_t)d->epoch));
  for (int64_t i = nw - 1; i > 0; i--) {
    state = mix(state);
    int64_t j = (int64_t)(state % (uint64_t)(i + 1)), tmp = d->order[i];
    d->order[i] = d->order[j];
    d->order[j] = tmp;
  }
  return 0;
}

int ntp_tokens_next(ntp_tokens *d, int64_t rows, int64_t len, int64_t vocab, int32_t *tokens, int32_t *targets,
                    char *err, size_t cap) {
  int64_t w = rows * len;
  if (w + 1 > d->n) {
    snprintf(err, cap, "the token file holds %lld tokens; a batch of %lld x %lld needs %lld", (long long)d->n,
             (long long)rows, (long long)len, (long long)(w + 1));
    return -1;
  }
  int64_t start;
  if (d->shuffle) {
    if (!d->order || d->window != w) { /* this epoch's order (after a seek too: the position stays) */
      d->window = w;
      if (new_order(d, w) != 0) {
        snprintf(err, cap, "out of memory");
        return -1;
      }
    }
    if (d->pos >= d->norder) { /* the next epoch */
      d->epoch++;
      d->pos = 0;
      if (new_order(d, w) != 0) {
        snprintf(err, cap, "out of memory");
        return -1;
      }
    }
    start = d->order[d->pos++];
  } else {
    if (d->pos + w + 1 > d->n) d->pos = 0, d->epoch++;
    start = d->pos;
    d->pos += w;
  }
  for (int64_t i = 0; i < w; i++) {
    int64_t a = d->ids[start + i], b = d->ids[start + i + 1];
    if (a >= vocab || b >= vocab) {
      snprintf(err, cap, "token %lld of the file is %lld, outside the model's vocabulary of %lld",
               (long long)(start + i + (a < vocab)), (long long)(a >= vocab ? a : b), (long long)vocab);
      return -1;
    }
    tokens[i] = (int32_t)a;
    targets[i] = (int32_t)b;
  }
  return 0;
}

void ntp_tokens_position(const ntp_tokens *d, int64_t *pos, int64_t *epoch) {
  *pos = d->pos;
  *epoch = d->epoch;
}

void ntp_tokens_seek(ntp_tokens *d, int64_t pos, int64_t epoch) {
  d->pos = pos;
  d->epoch = epoch;
  free(d->order); /* redrawn for this epoch at the next batch */
  d->order = NULL;
  d->norder = 0;
}

bool ntp_tokens_position_valid(const ntp_tokens *d, int64_t pos, int64_t epoch) {
  return pos >= 0 && pos <= d->n && epoch >= 0 && epoch < (int64_t)1 << 40;
}

int ntp_tokens_check_vocab(const ntp_tokens *d, int64_t vocab, char *err, size_t cap) {
  for (int64_t i = 0; i < d->n; i++)
    if (d->ids[i] >= vocab) {
      snprintf(err, cap, "token %lld of %lld is %d, outside the model's vocabulary of %lld", (long long)i,
               (long long)d->n, d->ids[i], (long long)vocab);
      return -1;
    }
  return 0;
}

void ntp_tokens_close(ntp_tokens *d) {
  if (!d) return;
  free(d->ids);
  free(d->order);
  free(d);
}

int ntp_tokens_save(const char *path, const uint16_t *ids, int64_t n, char *err, size_t cap) {
  if (n < 0 || n > UINT32_MAX) {
    snprintf(err, cap, "%lld tokens do not fit a token file", (long long)n);
    return -1;
  }
  ntp_outfile o;
  if (ntp_outfile_open(&o, path, NULL, err, cap) != 0) return -1;
  unsigned char h[HEADER_INTS * 4] = {0};
  uint32_t fields[3] = {MAGIC, VERSION, (uint32_t)n};
  for (int k = 0; k < 3; k++)
    for (int i = 0; i < 4; i++) h[4 * k + i] = (unsigned char)(fields[k] >> (8 * i));
  bool ok = fwrite(h, 1, sizeof h, o.f) == sizeof h;
  for (int64_t i = 0; ok && i < n; i++) {
    unsigned char b[2] = {(unsigned char)ids[i], (unsigned char)(ids[i] >> 8)};
    ok = fwrite(b, 1, 2, o.f) == 2;
  }
  return ntp_outfile_commit(&o, ok, err, cap);
}
