/* strmap.c — string -> int64 map with open addressing; keys are borrowed. */
#include <stdlib.h>
#include <string.h>

#include "compiler.h"

static uint64_t hash_str(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

bool strmap_get(const strmap *m, const char *key, int64_t *val) {
  if (!m->cap) return false;
  for (size_t i = hash_str(key) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
    if (!m->keys[i]) return false;
    if (strcmp(m->keys[i], key) == 0) {
      if (val) *val = m->vals[i];
      return true;
    }
  }
}

static void put_raw(strmap *m, const char *key, int64_t val) {
  size_t i = hash_str(key) & (m->cap - 1);
  while (m->keys[i] && strcmp(m->keys[i], key) != 0) i = (i + 1) & (m->cap - 1);
  if (!m->keys[i]) m->len++;
  m->keys[i] = key;
  m->vals[i] = val;
}

void strmap_put(strmap *m, const char *key, int64_t val) {
  if ((m->len + 1) * 2 > m->cap) {
    strmap old = *m;
    m->cap = old.cap ? old.cap * 2 : 64;
    m->keys = calloc(m->cap, sizeof *m->keys);
    m->vals = calloc(m->cap, sizeof *m->vals);
    if (!m->keys || !m->vals) {
      free(m->keys);
      free(m->vals);
      *m = old; /* unchanged */
      ntp_out_of_memory();
    }
    m->len = 0;
    for (size_t i = 0; i < old.cap; i++)
      if (old.keys[i]) put_raw(m, old.keys[i], old.vals[i]);
    free(old.keys);
    free(old.vals);
  }
  put_raw(m, key, val);
}

void strmap_free(strmap *m) {
  free(m->keys);
  free(m->vals);
  *m = (strmap){0};
}
