/* arena.c — bump allocation in big blocks; a compilation frees everything at once. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler.h"

struct arena_block {
  arena_block *next;
  size_t used, cap;
  _Alignas(16) unsigned char data[];
};

enum { BLOCK_SIZE = 64 * 1024 };

void *arena_alloc(arena *a, size_t size) {
  size = (size + 15) & ~(size_t)15;
  arena_block *b = a->head;
  if (!b || b->used + size > b->cap) {
    size_t cap = size > BLOCK_SIZE ? size : BLOCK_SIZE;
    b = malloc(sizeof *b + cap);
    if (!b) return NULL;
    b->used = 0;
    b->cap = cap;
    b->next = a->head;
    a->head = b;
  }
  void *p = b->data + b->used;
  b->used += size;
  memset(p, 0, size);
  return p;
}

char *arena_strndup(arena *a, const char *s, size_t n) {
  char *d = arena_alloc(a, n + 1);
  if (d) {
    memcpy(d, s, n);
    d[n] = 0;
  }
  return d;
}

char *arena_strdup(arena *a, const char *s) { return arena_strndup(a, s, strlen(s)); }

char *arena_printf(arena *a, const char *fmt, ...) {
  va_list ap, ap2;
  va_start(ap, fmt);
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  char *d = n >= 0 ? arena_alloc(a, (size_t)n + 1) : NULL;
  if (d) vsnprintf(d, (size_t)n + 1, fmt, ap2);
  va_end(ap2);
  return d;
}

void arena_free(arena *a) {
  for (arena_block *b = a->head, *n; b; b = n) {
    n = b->next;
    free(b);
  }
  a->head = NULL;
}

void vec_grow(void **arr, size_t *cap, size_t elem) {
  size_t ncap = *cap ? *cap * 2 : 16;
  void *p = realloc(*arr, ncap * elem);
  if (!p) {
    /* Out of memory while growing a compiler table: nothing sensible is left to do. */
    fputs("ntpc: out of memory\n", stderr);
    abort();
  }
  *arr = p;
  *cap = ncap;
}
