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

static _Thread_local long fail_countdown;
void ntp_fail_growth_after(long n) { fail_countdown = n; }

void vec_grow(void **arr, size_t *cap, size_t elem) {
  size_t ncap = *cap ? *cap * 2 : 16;
  if (fail_countdown > 0 && --fail_countdown == 0) ntp_out_of_memory();
  void *p = realloc(*arr, ncap * elem);
  if (!p) ntp_out_of_memory();
  *arr = p;
  *cap = ncap;
}

static _Thread_local ntp_oom_guard *oom_top;

void ntp_oom_push(ntp_oom_guard *g) {
  g->prev = oom_top;
  oom_top = g;
}

void ntp_oom_pop(ntp_oom_guard *g) { oom_top = g->prev; }

_Noreturn void ntp_out_of_memory(void) {
  ntp_oom_guard *g = oom_top;
  if (g) {
    oom_top = g->prev;
    longjmp(g->jb, 1);
  }
  abort(); /* unreachable through the library's entry points, which all set a guard */
}
